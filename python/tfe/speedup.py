"""End-to-end speed of the speculative loop against the target decoding alone, on a GPU.

For each number of sequences (1, 4, 16 by default) it times, greedy, the same prompts and new tokens:
  plain decoding, each way this stack offers, the fastest kept as the baseline:
    `loop, drafts off`         this module's loop without a drafter (eager transformers, dynamic cache)
    `generate`                 transformers' generate, dynamic cache, eager
    `generate, static+compile` transformers' generate with a static cache, which it compiles (CUDA graphs);
                               where that fails the reason is recorded and it is left out
  the loop with the head, at each S given: tokens/s, the accept log, the share of the time spent drafting;
  with --checkpoint, the same loop with the head run by its PyTorch port (tfe.speculative.TorchDrafter).
Every configuration runs once to warm up (compilation, graph capture, allocator) and is timed on the second
run. Writes speedup.json and speedup.png into --out, and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

from . import prompts as prompt_sets
from .speculative import Decoder, make_drafter
from .target import Target, load_target


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


def hf_generate(target: Target, prompts: list[list[int]], new: int, static: bool) -> None:
    tok = target.tokenizer
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    extra = {"cache_implementation": "static"} if static else {}
    with torch.inference_mode():
        target.model.generate(
            ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=tok.eos_token_id,
            **extra,
        )


def plain_baselines(target: Target, prompts: list[list[int]], new: int, compile: bool = True) -> dict[str, dict]:
    runs = {
        "loop, drafts off": lambda: Decoder(target).generate(prompts, new),
        "generate": lambda: hf_generate(target, prompts, new, static=False),
    }
    if compile:
        runs["generate, static+compile"] = lambda: hf_generate(target, prompts, new, static=True)
    out = {}
    for name, fn in runs.items():
        try:
            _, warm = _timed(fn)
            _, secs = _timed(fn)
            out[name] = {"seconds": secs, "warmup_seconds": warm, "tokens_per_second": len(prompts) * new / secs}
        except Exception as e:  # a configuration this torch/transformers cannot run is reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tfe-speedup", description=__doc__.split("\n")[0])
    ap.add_argument("--head", required=True, help="the .tfe head")
    ap.add_argument("--artifact", help="tfe-plan compile's deploy directory")
    ap.add_argument("--drafter", choices=["runtime", "reference"], default="runtime")
    ap.add_argument("--checkpoint", help="the EAGLE-3 checkpoint: also run the loop with the PyTorch port as drafter")
    ap.add_argument("--sequences", default="1,4,16")
    ap.add_argument("--steps", default="1,2,3,4,6,8", help="draft steps S to measure")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu runs it too (a check of the script, not a measurement)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the static-cache compiled baseline")
    ap.add_argument("--gguf")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(a.gguf, device=a.device, dtype=getattr(torch, a.dtype))
    steps = [int(s) for s in a.steps.split(",")]
    drafter = make_drafter(a.drafter, a.head, max_slots=16, max_steps=max(8, *steps), artifact=a.artifact)
    evaluation = prompt_sets.evaluation_prompts()
    report = {"head": a.head, "dtype": a.dtype, "max_new_tokens": a.max_new_tokens, "drafter": a.drafter, "runs": {}}
    drafters = {"speculative": drafter}
    if a.checkpoint:
        drafters["torch port"] = make_drafter(
            "torch", None, max_slots=16, max_steps=max(8, *steps), checkpoint=a.checkpoint, target=target
        )
    for n in [int(x) for x in a.sequences.split(",")]:
        chosen = [evaluation[i % len(evaluation)] for i in range(n)]
        prompts = [target.encode_chat(p.text) for p in chosen]
        plain = plain_baselines(target, prompts, a.max_new_tokens, compile=not a.no_compile)
        ok = {k: v for k, v in plain.items() if "tokens_per_second" in v}
        best = max(ok, key=lambda k: ok[k]["tokens_per_second"])
        entry = {"plain": plain, "baseline": best, **{name: {} for name in drafters}}
        for name, d in drafters.items():
            for s in steps:
                dec = Decoder(target, d, steps=s)
                dec.generate(prompts, min(32, a.max_new_tokens))
                result = dec.generate(prompts, a.max_new_tokens)
                log = result.accept_log()
                log["speedup"] = log["tokens_per_second"] / ok[best]["tokens_per_second"]
                by_class: dict[str, list[int]] = {}
                for p, accepted in zip(chosen, _per_sequence_accepts(result, n)):
                    by_class.setdefault(p.cls, []).extend(accepted)
                log["mean_accepted_by_class"] = {c: sum(v) / len(v) for c, v in by_class.items() if v}
                entry[name][s] = log
                print(
                    f"{name:>12} {n:2d} seq S={s}: {log['tokens_per_second']:8.1f} tok/s, "
                    f"{log['tokens_per_round']:.2f} tok/round, x{log['speedup']:.2f} vs {best}",
                    flush=True,
                )
        report["runs"][n] = entry
    (out / "speedup.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "speedup.png")
    print_table(report)
    return 0


def _per_sequence_accepts(result, n: int) -> list[list[int]]:
    """accepted_per_round holds, round by round, one k per sequence."""
    return [result.accepted_per_round[i::n] for i in range(n)]


def print_table(report: dict) -> None:
    print(f"\nspeed-up, {report['dtype']} target, {report['max_new_tokens']} new tokens per sequence, drafter {report['drafter']}")
    print(f"{'seqs':>4} {'baseline':>26} {'tok/s':>9} {'best S':>6} {'tok/s':>9} {'tok/round':>9} {'speed-up':>8}")
    for n, e in report["runs"].items():
        base = e["plain"][e["baseline"]]["tokens_per_second"]
        s, best = max(e["speculative"].items(), key=lambda kv: kv[1]["tokens_per_second"])
        print(
            f"{n:>4} {e['baseline']:>26} {base:9.1f} {s:>6} {best['tokens_per_second']:9.1f} "
            f"{best['tokens_per_round']:9.2f} {best['speedup']:8.2f}"
        )
        if "torch port" in e:
            s, port = max(e["torch port"].items(), key=lambda kv: kv[1]["tokens_per_second"])
            print(f"{'':>4} {'same loop, PyTorch port':>26} {'':>9} {s:>6} {port['tokens_per_second']:9.1f} "
                  f"{port['tokens_per_round']:9.2f} {port['speedup']:8.2f}")


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (n, e) in enumerate(report["runs"].items()):
        xs = sorted(e["speculative"], key=int)
        line = ax.plot([int(x) for x in xs], [e["speculative"][x]["tokens_per_second"] for x in xs], "o-", label=f"{n} seq, loop")
        base = e["plain"][e["baseline"]]["tokens_per_second"]
        ax.axhline(base, color=line[0].get_color(), linestyle="--", label=f"{n} seq, {e['baseline']}")
    ax.set_xlabel("draft steps S")
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
