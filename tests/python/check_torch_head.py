#!/usr/bin/env python3
"""bench/torch_head.py, the PyTorch port of a head, checked on the CPU against tfe's CPU reference.

  check_torch_head.py TFE_PLAN WORK_DIR

For the tiny and tiny-two-stage presets: a random head (`tfe-plan random`), reference vectors with the
drafts of 4 slots x 8 steps (`tfe-plan reference`), then torch_head.py --device cpu on them:
  * the port drafts exactly the reference's tokens (100 % equal, no first disagreement);
  * planted disagreements are judged: a target id outside the draft vocabulary is `none`, and a draft-
    vocabulary token with a --near-tie wider than any gap is a near-tie (`logit`, or for two_stage `logit`
    or `boundary`), with the counts by kind summing to the first disagreements.
Exit status 0 when every check passes, 77 when python3 lacks torch or safetensors (the test skips), 1 with
a message naming the first failed check.
"""
import json
import os
import subprocess
import sys

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
except ImportError as e:  # the caller reports the test skipped
    print(f"torch or safetensors is not importable: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_HEAD = os.path.join(ROOT, "examples", "torch_head.py")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def agreement(head, drafts, out, near_tie):
    run([sys.executable, TORCH_HEAD, "--head", head, "--drafts", drafts, "--device", "cpu", "--no-graph",
         "--streams", "1", "--steps", "1", "--iters", "1", "--warmup", "0", "--near-tie", str(near_tie),
         "--json", out])
    with open(out) as f:
        a = json.load(f).get("agreement")
    if a is None:
        sys.exit(f"{out}: no agreement section")
    return a


def check(cond, what):
    if not cond:
        sys.exit(f"check failed: {what}")


def main():
    tfe_plan, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for preset in ("tiny", "tiny-two-stage"):
        head = os.path.join(work, f"{preset}.tfe")
        vectors = os.path.join(work, f"{preset}-vectors.safetensors")
        run([tfe_plan, "random", "--preset", preset, "--seed", "3", "-o", head])
        run([tfe_plan, "reference", head, "--streams", "4", "--rows", "12", "--steps", "8", "--seed", "5",
             "-o", vectors])

        a = agreement(head, vectors, os.path.join(work, f"{preset}-clean.json"), 0.05)
        check(a["tokens_equal_pct"] == 100.0 and not a["first_disagreements"],
              f"{preset}: the port drafts the reference's tokens ({a['tokens_equal_pct']} %, "
              f"{a['first_disagreements']})")

        # Plant: slot 0 step 2 a target id outside the draft vocabulary; slot 1 step 1 a draft-vocabulary
        # token other than the reference's.
        f = safe_open(vectors, framework="pt")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        d2t = safe_open(head, framework="pt").get_tensor("d2t").long()
        in_draft = set((torch.arange(len(d2t)) + d2t).tolist())
        tok = tensors["draft_tokens"].clone()
        outside = next(t for t in range(len(d2t) + int(d2t.max()) + 1) if t not in in_draft)
        tok[0, 1] = outside
        d = 0 if int(0 + d2t[0]) != int(tok[1, 0]) else 1
        tok[1, 0] = int(d + d2t[d])
        tensors["draft_tokens"] = tok
        planted = os.path.join(work, f"{preset}-planted.safetensors")
        save_file(tensors, planted, metadata=f.metadata())

        for near_tie in (0.05, 1e9):
            a = agreement(head, planted, os.path.join(work, f"{preset}-planted.json"), near_tie)
            by = {(d["slot"], d["step"]): d for d in a["first_disagreements"]}
            check((0, 2) in by and (1, 1) in by, f"{preset}: both planted disagreements found ({sorted(by)})")
            check(by[(0, 2)]["kind"] == "none", f"{preset}: a token outside the draft vocabulary is none")
            kinds = a["first_disagreements_by_kind"]
            check(sum(kinds.values()) == len(a["first_disagreements"]), f"{preset}: kinds sum to the count")
            check(a["first_disagreements_near_ties"] == len(a["first_disagreements"]) - kinds["none"],
                  f"{preset}: near-ties are the disagreements of kind logit or boundary")
            if near_tie > 1e6:
                allowed = ("logit",) if preset == "tiny" else ("logit", "boundary")
                check(by[(1, 1)]["kind"] in allowed,
                      f"{preset}: a draft-vocabulary token under an unbounded --near-tie is {allowed}, "
                      f"not {by[(1, 1)]['kind']}")
    print("torch_head.py: the port matches the CPU reference, and planted disagreements are judged by kind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
