"""End-to-end speed of the speculative loop against the target decoding alone, on a GPU.

For each number of sequences (1, 4, 16 by default) it times, greedy, the same prompts and new tokens:
  plain decoding, each way this stack offers, the fastest kept as the baseline:
    `loop, drafts off`         this module's loop without a drafter (eager transformers, dynamic cache)
    `generate`                 transformers' generate, dynamic cache, eager
    `generate, static+compile` transformers' generate with a static cache, which it compiles (CUDA graphs);
                               where that fails the reason is recorded and it is left out
  the loop with the head, at each S given: tokens/s, the accept log, the share of the time spent drafting;
  the same at its best S with the target's verify forward compiled against a static cache (CUDA graphs),
    as `generate, static+compile` runs the target alone (not with --no-compile);
  with --checkpoint, the same loop with the head run by its PyTorch port (tfe.speculative.TorchDrafter).
Every configuration runs once to warm up (compilation, graph capture, allocator) and is timed on the second
run. The share spent drafting is the drafter's calls timed by CUDA events (tfe.speculative.DraftClock).
Writes speedup-<sequences>.json (after every configuration) and .png into --out, and prints a table last.

With --windows (e.g. 128,511) it also measures acceptance on prompts longer than the largest window
(prompts.long_prompts): the head converted at each window and run by tfe, against its PyTorch port at the
largest window and over the whole context; windows.json. Every run's tokens are compared with the target
alone (in fp32 a difference fails; in bf16 it may only come from a near-tie, which tfe-check-exact judges).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
import warnings

import torch

from . import prompts as prompt_sets
from .speculative import Decoder, TorchDrafter, hf_generate, make_drafter
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


def hf_batch_generate(target: Target, prompts: list[list[int]], new: int, static: bool) -> None:
    """transformers' generate over the prompts, left-padded; with `static`, a static cache (compiled)."""
    tok = target.tokenizer
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    extra = {"cache_implementation": "static"} if static else {}
    hf_generate(target, ids.to(target.device), mask.to(target.device), new, **extra)


def plain_baselines(target: Target, prompts: list[list[int]], new: int, compile: bool = True) -> dict[str, dict]:
    runs = {
        "loop, drafts off": lambda: Decoder(target).generate(prompts, new),
        "generate": lambda: hf_batch_generate(target, prompts, new, static=False),
    }
    if compile:
        runs["generate, static+compile"] = lambda: hf_batch_generate(target, prompts, new, static=True)
    out = {}
    for name, fn in runs.items():
        try:
            _, warm = _timed(fn)
            _, secs = _timed(fn)
            out[name] = {"seconds": secs, "warmup_seconds": warm, "tokens_per_second": len(prompts) * new / secs}
        except Exception as e:  # a configuration this torch/transformers cannot run is reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


COMPILED = "tfe, compiled target"  # the tfe loop with the target's verify forward compiled


def speed(target: Target, drafters: dict, sequences: list[int], steps: list[int], new: int, compile: bool, report: dict, save) -> None:
    """For each number of sequences: the plain baselines, then every drafter at every S, then (with
    `compile`) the tfe loop at its best S with the target's verify forward compiled; `save` after each."""
    evaluation = prompt_sets.evaluation_prompts()
    for n in sequences:
        chosen = [evaluation[i % len(evaluation)] for i in range(n)]
        prompts = [target.encode_chat(p.text) for p in chosen]
        plain = plain_baselines(target, prompts, new, compile=compile)
        ok = {k: v for k, v in plain.items() if "tokens_per_second" in v}
        best = max(ok, key=lambda k: ok[k]["tokens_per_second"])
        entry = {"plain": plain, "baseline": best, **{name: {} for name in drafters}}
        report["runs"][n] = entry

        def timed_loop(name: str, s: int, decoder: Decoder, warmup_tokens: int) -> None:
            decoder.generate(prompts, warmup_tokens)
            result = decoder.generate(prompts, new)
            log = result.accept_log()
            log["speedup"] = log["tokens_per_second"] / ok[best]["tokens_per_second"]
            # Like for like: the target alone run the same way (eager, or compiled with a static cache).
            same = "generate, static+compile" if decoder.compile_target else "loop, drafts off"
            if same in ok:
                log["speedup_same_loop"] = log["tokens_per_second"] / ok[same]["tokens_per_second"]
                log["same_loop"] = same
            by_class: dict[str, list[int]] = {}
            for p, accepted in zip(chosen, _per_sequence_accepts(result, n)):
                by_class.setdefault(p.cls, []).extend(accepted)
            log["mean_accepted_by_class"] = {c: sum(v) / len(v) for c, v in by_class.items() if v}
            entry.setdefault(name, {})[s] = log
            print(
                f"{name:>10} {n:2d} seq S={s}: {log['tokens_per_second']:8.1f} tok/s, "
                f"{log['tokens_per_round']:.2f} tok/round, draft share {log['draft_share']:.2f}, "
                f"x{log['speedup']:.2f} vs {best}",
                flush=True,
            )

        for name, d in drafters.items():
            for s in steps:
                timed_loop(name, s, Decoder(target, d, steps=s), min(32, new))
            save()
        if compile:
            s = max(entry["tfe"], key=lambda k: entry["tfe"][k]["tokens_per_second"])
            try:  # the warm-up runs the whole length: the static cache's shape, and so the graphs, depend on it
                timed_loop(COMPILED, s, Decoder(target, drafters["tfe"], steps=s, compile_target=True), new)
            except Exception as e:  # reported, like a plain configuration this stack cannot run
                entry[COMPILED] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{COMPILED}: {entry[COMPILED]['error']}", flush=True)
            save()


def windows_study(
    target: Target, checkpoint, windows: list[int], kind: str, steps: int, new: int, work: pathlib.Path, prompts=None
) -> dict:
    """Acceptance on prompts longer than the largest window: the head converted at each window and run by tfe
    (`kind`: runtime or reference), and the PyTorch port at the largest window and over the whole context.
    Every run's tokens are compared with the target's own greedy decoding (drafts off): a window changes what
    is drafted, never what is kept. `prompts`: token lists (default: prompts.long_prompts, encoded)."""
    import tfe

    if prompts is None:
        prompts = [target.encode_chat(p.text) for p in prompt_sets.long_prompts()]
    lengths = [len(p) for p in prompts]
    if min(lengths) <= max(windows):
        raise ValueError(f"the long prompts have {min(lengths)} tokens, not more than the largest window {max(windows)}")
    full = max(lengths) + new + 1
    alone = Decoder(target).generate(prompts, new).tokens
    rows: dict[str, dict] = {}
    runs: list[tuple[str, object]] = []
    for w in windows:
        with warnings.catch_warnings():  # convert warns of a window shorter than the training contexts: the point here
            warnings.simplefilter("ignore")
            head = tfe.convert(checkpoint, work / f"head-w{w}.tfe", window=w)
        runs.append((f"tfe, window {w}", lambda head=head: make_drafter(kind, head, max_slots=len(prompts), max_steps=steps)))
    last = max(windows)
    runs.append((f"PyTorch port, window {last}", lambda: TorchDrafter(checkpoint, target, max_slots=len(prompts), max_steps=steps, window=last)))
    runs.append(("PyTorch port, whole context", lambda: TorchDrafter(checkpoint, target, max_slots=len(prompts), max_steps=steps, window=full)))
    for name, make in runs:
        result = Decoder(target, make(), steps=steps).generate(prompts, new)
        log = result.accept_log()
        log["equals_drafts_off"] = result.tokens == alone
        rows[name] = log
        print(f"{name:>30}: {log['tokens_per_round']:.2f} tok/round, by position "
              + " ".join(f"{r:.2f}" for r in log["accept_rate_by_position"])
              + ("" if log["equals_drafts_off"] else "  (tokens differ from drafts off)"), flush=True)
    return {"prompt_tokens": lengths, "new_tokens": new, "steps": steps, "runs": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tfe-speedup", description=__doc__.split("\n")[0])
    ap.add_argument("--head", required=True, help="the .tfe head")
    ap.add_argument("--artifact", help="tfe-plan compile's deploy directory")
    ap.add_argument("--drafter", choices=["runtime", "reference"], default="runtime")
    ap.add_argument("--checkpoint", help="the EAGLE-3 checkpoint: also run the loop with the PyTorch port as drafter")
    ap.add_argument("--sequences", default="1,4,16", help="numbers of sequences to time; empty: no timing")
    ap.add_argument("--steps", default="1,2,3,4,5,6,7,8", help="draft steps S to measure")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu runs it too (a check of the script, not a measurement)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the static-cache compiled baseline")
    ap.add_argument("--windows", default="", help="e.g. 128,511: acceptance on long prompts at these windows "
                    "against the PyTorch port over the whole context (needs --checkpoint)")
    ap.add_argument("--window-steps", type=int, default=4, help="draft steps S of the window study")
    ap.add_argument("--gguf")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)
    sequences = [int(x) for x in a.sequences.split(",") if x]
    steps = [int(s) for s in a.steps.split(",")]
    windows = [int(w) for w in a.windows.split(",") if w]
    if windows and not a.checkpoint:
        ap.error("--windows compares against the PyTorch port: pass --checkpoint")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(a.gguf, device=a.device, dtype=getattr(torch, a.dtype))
    report = {"head": a.head, "dtype": a.dtype, "max_new_tokens": a.max_new_tokens, "drafter": a.drafter, "runs": {}}
    # One file per part, so that parts run as separate commands (and a cut run) keep what they measured.
    name = "speedup-" + "-".join(map(str, sequences)) if sequences else None

    def save():
        (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")

    if sequences:
        drafters = {"tfe": make_drafter(a.drafter, a.head, max_slots=16, max_steps=max(8, *steps), artifact=a.artifact)}
        if a.checkpoint:
            drafters["torch port"] = make_drafter(
                "torch", None, max_slots=16, max_steps=max(8, *steps), checkpoint=a.checkpoint, target=target
            )
        speed(target, drafters, sequences, steps, a.max_new_tokens, not a.no_compile, report, save)
        plot(report, out / f"{name}.png")
        print_table(report)
    if windows:
        with tempfile.TemporaryDirectory() as work:  # the heads converted at each window
            study = windows_study(
                target, a.checkpoint, windows, a.drafter, a.window_steps, min(a.max_new_tokens, 128), pathlib.Path(work)
            )
        (out / "windows.json").write_text(json.dumps(study, indent=1) + "\n")
        if not all(r["equals_drafts_off"] for r in study["runs"].values()) and a.dtype == "float32":
            print("windows: a run's tokens differ from the target alone", file=sys.stderr)
            return 1
    return 0


def _per_sequence_accepts(result, n: int) -> list[list[int]]:
    """accepted_per_round holds, round by round, one k per sequence."""
    return [result.accepted_per_round[i::n] for i in range(n)]


def print_table(report: dict) -> None:
    print(f"\nspeed-up, {report['dtype']} target, {report['max_new_tokens']} new tokens per sequence, drafter {report['drafter']}")
    print("speed-up: against the fastest way alone; vs off: against the target alone run the same way (the loop "
          "with drafts off; for the compiled target, generate with a static cache, compiled)")
    print(f"{'seqs':>4}  {'run':<36} {'tok/s':>9} {'best S':>6} {'tok/round':>9} {'drafting':>8} {'speed-up':>8} "
          f"{'vs off':>7}")
    for n, e in report["runs"].items():
        base = e["plain"][e["baseline"]]["tokens_per_second"]
        print(f"{n:>4}  {'alone: ' + e['baseline']:<36} {base:9.1f}")
        for name, label in (
            ("tfe", "the loop, tfe"),
            (COMPILED, "the loop, tfe, target compiled"),
            ("torch port", "the loop, PyTorch port"),
        ):
            if name in e and "error" in e[name]:
                print(f"{n:>4}  {label:<36} {e[name]['error'][:80]}")
            elif name in e and e[name]:
                s, best = max(e[name].items(), key=lambda kv: kv[1]["tokens_per_second"])
                print(
                    f"{n:>4}  {label:<36} {best['tokens_per_second']:9.1f} {s:>6} {best['tokens_per_round']:9.2f} "
                    f"{best['draft_share']:8.2f} {best['speedup']:8.2f} {best.get('speedup_same_loop', float('nan')):7.2f}"
                )


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for n, e in report["runs"].items():
        xs = sorted(e["tfe"], key=int)
        line = ax.plot([int(x) for x in xs], [e["tfe"][x]["tokens_per_second"] for x in xs], "o-", label=f"{n} seq, loop with tfe")
        if e.get("torch port"):
            xs = sorted(e["torch port"], key=int)
            ax.plot([int(x) for x in xs], [e["torch port"][x]["tokens_per_second"] for x in xs], "s:",
                    color=line[0].get_color(), label=f"{n} seq, loop with the PyTorch port")
        base = e["plain"][e["baseline"]]["tokens_per_second"]
        ax.axhline(base, color=line[0].get_color(), linestyle="--", label=f"{n} seq, alone: {e['baseline']}")
    ax.set_xlabel("draft steps S")
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
