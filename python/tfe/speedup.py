"""End-to-end speed of the speculative loop against the target decoding alone, on a GPU: one command, one table.

For each number of sequences (1, 4, 16 by default), greedy, the same mixed prompts (tfe.prompts' evaluation
set, which training never sees) and the same number of new tokens:

  alone, the fastest ways this stack offers:
    (a) `captured, drafts off`     tfe.captured's loop without a drafter: one token a round, the target's
                                   forward over the static position-indexed cache replayed as a CUDA graph
                                   (`+ inductor`: the same with the decoder layer compiled inside the graph)
    (b) `generate, static+compile` transformers' generate with a static cache, which it compiles
    (c) `prompt lookup`            transformers' prompt-lookup decoding (no draft model; one sequence only)
  the loop with the head:
    `tfe`                          tfe.captured with the tfe runtime drafting, at every S given, each round
                                   split by CUDA events into draft, verify, accept and extend on the device
                                   and the host time the device did not cover
    `tfe, branches`                with --branches K: the same with K chains a sequence a round, the r-th
                                   from the head's rank-r first token, the longest kept (greedy)
    `tfe + inductor`               the same at the best S with the decoder layer compiled
    (d) `PyTorch port`             the same loop at the best S with the head's PyTorch port drafting
Every configuration runs once to warm up (capture, compilation) and is timed on the second run; one that
fails is a row with its error. Each tfe run's tokens are compared with (a): in fp32 they must be equal, in
bf16 a difference can only come from a near-tie (tfe-check-exact judges those).

Writes into --out: speedup.json (after every configuration), speedup.png (tokens/s against S),
split.png (the round split as stacked bars), and prints the tables last.

With --acceptance it measures acceptance alone, on every held-out prompt (tfe.prompts.evaluation_prompts:
3 in each of 10 classes, none trained on) at each S of --steps: tokens per round by class and S, the mean over
classes, the weakest class, and the share of rounds that keep at least j drafts; acceptance.json. Greedy
acceptance does not depend on the batch, so the prompts run 15 at a time. With --branches K each
round drafts K chains a sequence, the r-th from the head's rank-r first token, verifies them side by side and
keeps the longest (tfe.captured), drafted by --drafter (the runtime opened with the plan option first_ranks).

With --windows (e.g. 128,511) it also measures acceptance on prompts longer than the largest window
(prompts.long_prompts): the head converted at each window and run by tfe, against its PyTorch port at the
largest window and over the whole context; windows.json.
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
from .captured import MAX_BRANCHES, CapturedDecoder
from .outputs import check_output_dir, replacing, write_atomic
from .speculative import TorchDrafter, hf_generate, left_padded, make_drafter, read_taps
from .target import Target, load_target

ALONE = "captured, drafts off"
ALONE_EAGER = "captured, eager layers, drafts off"
GENERATE = "generate, static+compile"
LOOKUP = "prompt lookup"
TFE = "tfe"
TFE_EAGER = "tfe, eager layers"
TFE_BRANCHES = "tfe, branches"
PORT = "PyTorch port"
PIECES = ("draft", "verify", "accept", "extend", "host")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


def hf_batch_generate(target: Target, prompts: list[list[int]], new: int, **options) -> None:
    """transformers' generate over the prompts, left-padded; options go to generate (a static cache, prompt
    lookup)."""
    hf_generate(target, *left_padded(target, prompts), new, **options)


def _error(e: Exception) -> dict:
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}


def _row(result, seconds: float, reference) -> dict:
    log = result.accept_log()
    log.update(seconds=seconds, tokens_per_second=result.new_tokens / seconds, split=result.split)
    if reference is not None:
        log["differing_sequences"] = sum(a != b for a, b in zip(result.tokens, reference))
    return log


def speed(target: Target, drafters: dict, sequences: list[int], steps: list[int], new: int, report: dict, save) -> None:
    """For each number of sequences: the ways alone, tfe at every S, then tfe + inductor and the PyTorch port
    at tfe's best S; `save` after each configuration."""
    evaluation = prompt_sets.evaluation_prompts()
    for n in sequences:
        chosen = [evaluation[i % len(evaluation)] for i in range(n)]
        prompts = [target.encode_chat(p.text) for p in chosen]
        entry: dict = {"prompt_classes": [p.cls for p in chosen], "alone": {}, TFE: {}}
        report["runs"][str(n)] = entry
        reference = None

        def alone(name: str, fn) -> None:
            try:
                _, warm = _timed(fn)
                _, secs = _timed(fn)
                entry["alone"][name] = {"seconds": secs, "warmup_seconds": warm, "tokens_per_second": n * new / secs}
            except Exception as e:  # a configuration this stack cannot run is a row with its error
                entry["alone"][name] = _error(e)
            _print_alone(n, name, entry["alone"][name])
            save()

        def loop(decoder: CapturedDecoder):
            decoder.generate(prompts, new)  # warm-up: capture (and compilation) at this run's shapes
            return _timed(lambda: decoder.generate(prompts, new))

        try:
            decoder = CapturedDecoder(target, rivals=False)
            (result, secs) = loop(decoder)
            reference = result.tokens
            entry["alone"][ALONE] = {"seconds": secs, "tokens_per_second": n * new / secs}
        except Exception as e:
            entry["alone"][ALONE] = _error(e)
        _print_alone(n, ALONE, entry["alone"][ALONE])
        eager_layers = CapturedDecoder(target, compile_layers=False, rivals=False)
        alone(ALONE_EAGER, lambda: eager_layers.generate(prompts, new))
        alone(GENERATE, lambda: hf_batch_generate(target, prompts, new, cache_implementation="static"))
        alone(LOOKUP, lambda: hf_batch_generate(target, prompts, new, prompt_lookup_num_tokens=10))

        def tfe_row(name: str, s: int, drafter, **options) -> None:
            try:
                result, secs = loop(CapturedDecoder(target, drafter, steps=s, timing=True, rivals=False, **options))
                row = _row(result, secs, reference)
                by_class: dict[str, list[int]] = {}
                for p, accepted in zip(chosen, result.accepted_by_sequence):
                    by_class.setdefault(p.cls, []).extend(accepted)
                row["tokens_per_round_by_class"] = {c: 1 + sum(v) / len(v) for c, v in by_class.items() if v}
            except Exception as e:
                row = _error(e)
            entry.setdefault(name, {})[str(s)] = row
            _print_loop(n, name, s, row, entry)
            save()

        for s in steps:
            tfe_row(TFE, s, drafters[TFE])
            if TFE_BRANCHES in drafters:
                tfe_row(TFE_BRANCHES, s, drafters[TFE_BRANCHES], branches=report["branches"])
        ok = {s: r for s, r in entry[TFE].items() if "tokens_per_second" in r}
        if ok:
            best = int(max(ok, key=lambda s: ok[s]["tokens_per_second"]))
            tfe_row(TFE_EAGER, best, drafters[TFE], compile_layers=False)
            if PORT in drafters:
                tfe_row(PORT, best, drafters[PORT])


ACCEPTANCE_BATCH = 15  # held-out prompts a generate call: greedy acceptance does not depend on the batch


def acceptance(target: Target, drafter, steps: list[int], new: int, batch: int = ACCEPTANCE_BATCH, branches: int = 1) -> dict:
    """Acceptance on every held-out prompt at each S: by class, tokens per round and, per window position j,
    the share of rounds that kept at least j drafts (the accept log's rate by position). With `branches` k,
    each round verifies k chains a sequence (tfe.captured) and keeps the longest: the drafter needs
    batch x k slots."""
    evaluation = prompt_sets.evaluation_prompts()
    if any(p.history for p in evaluation):
        raise ValueError("an evaluation prompt has earlier turns; encode_chat takes one user turn")
    prompts = [target.encode_chat(p.text) for p in evaluation]
    classes = sorted({p.cls for p in evaluation})
    report: dict = {"prompts": len(prompts), "classes": classes, "max_new_tokens": new, "branches": branches, "by_steps": {}}
    for s in steps:
        decoder = CapturedDecoder(target, drafter, steps=s, rivals=False, branches=branches)
        rounds: dict[str, list[int]] = {c: [] for c in classes}
        for a in range(0, len(prompts), batch):
            result = decoder.generate(prompts[a : a + batch], new)
            for p, accepted in zip(evaluation[a : a + batch], result.accepted_by_sequence):
                rounds[p.cls].extend(accepted)
        per_class = {
            c: {"rounds": len(k), "tokens_per_round": 1 + sum(k) / len(k),
                "kept_at_least": [sum(x >= j for x in k) / len(k) for j in range(1, s + 1)]}
            for c, k in rounds.items() if k
        }
        mean = sum(r["tokens_per_round"] for r in per_class.values()) / len(per_class)
        weakest = min(per_class, key=lambda c: per_class[c]["tokens_per_round"])
        first = sum(r["kept_at_least"][0] for r in per_class.values()) / len(per_class)
        report["by_steps"][str(s)] = {"by_class": per_class, "mean_tokens_per_round": mean,
                                      "mean_kept_at_position_1": first, "weakest_class": weakest}
        print(f"acceptance S={s}{f' x {branches} branches' if branches > 1 else ''}: {mean:.2f} tokens a round (mean of {len(per_class)} classes), position 1 kept "
              f"{first:.2f}, weakest {weakest} {per_class[weakest]['tokens_per_round']:.2f}", flush=True)
    return report


def print_acceptance(report: dict) -> None:
    steps = list(report["by_steps"])
    tree = f", {report['branches']} branches a round" if report.get("branches", 1) > 1 else ""
    print(f"\nheld-out acceptance: tokens per round by class and S ({report['prompts']} prompts, "
          f"{report['max_new_tokens']} new tokens each, greedy{tree})")
    print(f"{'class':<12}" + "".join(f"{'S=' + s:>7}" for s in steps))
    for c in report["classes"]:
        cells = [report["by_steps"][s]["by_class"].get(c, {}).get("tokens_per_round") for s in steps]
        print(f"{c:<12}" + "".join(f"{x:7.2f}" if x is not None else f"{'':>7}" for x in cells))
    print(f"{'mean':<12}" + "".join(f"{report['by_steps'][s]['mean_tokens_per_round']:7.2f}" for s in steps))
    last = report["by_steps"][steps[-1]]
    print(f"\nshare of rounds keeping at least j drafts at S={steps[-1]}, by class")
    print(f"{'class':<12}" + "".join(f"{'j=' + str(j):>7}" for j in range(1, int(steps[-1]) + 1)))
    for c, r in last["by_class"].items():
        print(f"{c:<12}" + "".join(f"{x:7.2f}" for x in r["kept_at_least"]))


def _rate(entry: dict, name: str) -> float:
    return entry["alone"].get(name, {}).get("tokens_per_second", float("nan"))


def _print_alone(n: int, name: str, row: dict) -> None:
    what = row["error"] if "error" in row else f"{row['tokens_per_second']:8.1f} tok/s"
    print(f"{n:2d} seq  alone  {name:<32} {what}", flush=True)


def _print_loop(n: int, name: str, s: int, row: dict, entry: dict) -> None:
    if "error" in row:
        print(f"{n:2d} seq  {name:<14} S={s}: {row['error']}", flush=True)
        return
    split = row.get("split", {})
    print(
        f"{n:2d} seq  {name:<14} S={s}: {row['tokens_per_second']:8.1f} tok/s, {row['tokens_per_round']:.2f} tok/round, "
        f"round {1e3 * split.get('round', float('nan')):.3f} ms, x{row['tokens_per_second'] / _rate(entry, GENERATE):.2f} "
        f"vs {GENERATE}, x{row['tokens_per_second'] / _rate(entry, ALONE):.2f} vs {ALONE}"
        + (f"; {row['differing_sequences']} sequence(s) differ from drafts off" if row.get("differing_sequences") else ""),
        flush=True,
    )


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
    alone = CapturedDecoder(target).generate(prompts, new).tokens
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
        result = CapturedDecoder(target, make(), steps=steps).generate(prompts, new)
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
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu runs it too (a check of the script, not a measurement)")
    ap.add_argument("--acceptance", action="store_true", help="acceptance on every held-out prompt at each S of "
                    "--steps, by class (acceptance.json)")
    ap.add_argument("--windows", default="", help="e.g. 128,511: acceptance on long prompts at these windows "
                    "against the PyTorch port over the whole context (needs --checkpoint)")
    ap.add_argument("--window-steps", type=int, default=4, help="draft steps S of the window study")
    ap.add_argument("--branches", type=int, default=1, help=f"chains a round verifies per sequence, the r-th from the "
                    f"head's rank-r first token (1..{MAX_BRANCHES}, greedy): the acceptance study's, and the timed "
                    f"`{TFE_BRANCHES}` rows beside the chain's")
    ap.add_argument("--gguf")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)
    try:
        sequences = [int(x) for x in a.sequences.split(",") if x]
        steps = [int(s) for s in a.steps.split(",") if s]
        windows = [int(w) for w in a.windows.split(",") if w]
    except ValueError as e:
        ap.error(f"--sequences, --steps and --windows are comma-separated integers ({e})")
    if any(not 1 <= n <= 16 for n in sequences):
        ap.error("--sequences: each 1..16")
    if any(not 1 <= s <= 8 for s in steps):
        ap.error("--steps: each 1..8")
    if windows and not a.checkpoint:
        ap.error("--windows compares against the PyTorch port: pass --checkpoint")
    if not 1 <= a.branches <= MAX_BRANCHES:
        ap.error(f"--branches {a.branches}: 1..{MAX_BRANCHES}")
    if a.branches > 1 and sequences and a.drafter != "runtime":
        ap.error(f"--branches {a.branches} with --sequences times tfe's runtime: --drafter runtime")
    if not pathlib.Path(a.head).is_file():
        ap.error(f"--head {a.head}: no such file")
    try:
        check_output_dir(a.out, "--out", inputs=[a.head],
                         files=("speedup.json", "speedup.png", "split.png", "acceptance.json", "windows.json"))
    except ValueError as e:
        ap.error(str(e))
    taps = read_taps(ap, a.head)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(a.gguf, device=a.device, dtype=getattr(torch, a.dtype), tap_layers=taps)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    report = {"head": a.head, "dtype": a.dtype, "device": device, "max_new_tokens": a.max_new_tokens,
              "drafter": a.drafter, "runs": {}}

    def save():
        write_atomic(out / "speedup.json", json.dumps(report, indent=1) + "\n")

    max_steps = max([8, *steps])
    if a.acceptance:
        slots = max(16, ACCEPTANCE_BATCH * a.branches)
        drafter = make_drafter(a.drafter, a.head, max_slots=slots, max_steps=max_steps, artifact=a.artifact,
                               first_ranks=a.branches > 1)
        study = acceptance(target, drafter, steps, a.max_new_tokens, branches=a.branches)
        study.update(head=a.head, dtype=a.dtype, device=device, drafter=a.drafter)
        write_atomic(out / "acceptance.json", json.dumps(study, indent=1) + "\n")
        print_acceptance(study)
        del drafter
    if sequences:
        drafters = {TFE: make_drafter(a.drafter, a.head, max_slots=16, max_steps=max_steps, artifact=a.artifact)}
        if a.branches > 1:
            drafters[TFE_BRANCHES] = make_drafter(a.drafter, a.head, max_slots=16 * a.branches, max_steps=max_steps,
                                                  artifact=a.artifact, first_ranks=True)
            report["branches"] = a.branches
        if a.checkpoint:
            try:
                drafters[PORT] = make_drafter("torch", None, max_slots=16, max_steps=max_steps, checkpoint=a.checkpoint, target=target)
            except Exception as e:
                report["port_error"] = _error(e)["error"]
        speed(target, drafters, sequences, steps, a.max_new_tokens, report, save)
        for name, fn in (("speedup.png", plot), ("split.png", plot_split)):
            try:
                fn(report, out / name)
            except Exception as e:  # a plot is not worth the table
                print(f"{name}: {_error(e)['error']}", file=sys.stderr)
        print_table(report)
    if windows:
        with tempfile.TemporaryDirectory() as work:  # the heads converted at each window
            study = windows_study(
                target, a.checkpoint, windows, a.drafter, a.window_steps, min(a.max_new_tokens, 128), pathlib.Path(work)
            )
        write_atomic(out / "windows.json", json.dumps(study, indent=1) + "\n")
        if not all(r["equals_drafts_off"] for r in study["runs"].values()) and a.dtype == "float32":
            print("windows: a run's tokens differ from the target alone", file=sys.stderr)
            return 1
    return 0


def _best(rows: dict) -> tuple[str, dict] | None:
    ok = {s: r for s, r in rows.items() if "tokens_per_second" in r}
    return max(ok.items(), key=lambda kv: kv[1]["tokens_per_second"]) if ok else None


def print_table(report: dict) -> None:
    print(f"\nspeed-up on {report['device']}, {report['dtype']}, greedy, {report['max_new_tokens']} new tokens a sequence, "
          f"evaluation prompts; vs (a): against `{ALONE}`, vs (b): against `{GENERATE}`")
    print(f"{'seqs':>4}  {'run':<34} {'tok/s':>9} {'S':>2} {'tok/round':>9} {'vs (a)':>7} {'vs (b)':>7}  differ")
    for n, e in report["runs"].items():
        a, b = _rate(e, ALONE), _rate(e, GENERATE)
        for name, row in e["alone"].items():
            what = row["error"][:70] if "error" in row else f"{row['tokens_per_second']:9.1f}"
            print(f"{n:>4}  {'alone: ' + name:<34} {what}")
        for name in (TFE, TFE_BRANCHES, TFE_EAGER, PORT):
            if name not in e:
                continue
            best = _best(e[name])
            if best is None:
                err = next(iter(e[name].values()), {}).get("error", "no run")
                print(f"{n:>4}  {name:<34} {err[:70]}")
                continue
            s, r = best
            print(f"{n:>4}  {name:<34} {r['tokens_per_second']:9.1f} {s:>2} {r['tokens_per_round']:9.2f} "
                  f"{r['tokens_per_second'] / a:7.2f} {r['tokens_per_second'] / b:7.2f}  {r.get('differing_sequences', '')}")
    print("\nwhere a round goes (tfe, by S; device time per round by CUDA events, host: the rest of the round's wall time), ms")
    print(f"{'seqs':>4} {'S':>2} {'round':>7} " + " ".join(f"{p:>7}" for p in PIECES) + f" {'outside':>8} {'tok/round':>9}")
    for n, e in report["runs"].items():
        for name in (TFE, TFE_BRANCHES):
            for s, r in e.get(name, {}).items():
                sp = r.get("split")
                if not sp:
                    continue
                outside = (sp["round"] - sp.get("draft", 0) - sp.get("verify", 0)) / sp["round"]
                label = f"{n:>4}" if name == TFE else f"{n:>2}x{report.get('branches', '')}"
                print(f"{label} {s:>2} {1e3 * sp['round']:7.3f} " + " ".join(f"{1e3 * sp.get(p, 0):7.3f}" for p in PIECES)
                      + f" {100 * outside:7.1f}% {r['tokens_per_round']:9.2f}")


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for n, e in report["runs"].items():
        ok = {int(s): r for s, r in e.get(TFE, {}).items() if "tokens_per_second" in r}
        if not ok:
            continue
        xs = sorted(ok)
        line = ax.plot(xs, [ok[x]["tokens_per_second"] for x in xs], "o-", label=f"{n} seq, tfe")
        color = line[0].get_color()
        for name, marker in ((TFE_BRANCHES, "D"), (TFE_EAGER, "^"), (PORT, "s")):
            for s, r in e.get(name, {}).items():
                if "tokens_per_second" in r:
                    ax.plot([int(s)], [r["tokens_per_second"]], marker, color=color, label=f"{n} seq, {name}")
        for name, style in ((ALONE, "--"), (GENERATE, ":"), (LOOKUP, "-.")):
            rate = _rate(e, name)
            if rate == rate:
                ax.axhline(rate, color=color, linestyle=style, linewidth=1, label=f"{n} seq, {name}")
    ax.set_xlabel("draft steps S")
    ax.set_ylabel("tokens/s (all sequences)")
    ax.set_yscale("log")
    ax.set_title(f"{report['device']}, {report['dtype']}")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def plot_split(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{n}/S{s}", r["split"]) for n, e in report["runs"].items() for s, r in e.get(TFE, {}).items() if r.get("split")]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(bars)), 4))
    bottom = [0.0] * len(bars)
    for piece in PIECES:
        heights = [1e3 * sp.get(piece, 0.0) for _, sp in bars]
        ax.bar(range(len(bars)), heights, bottom=bottom, label=piece)
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], rotation=90, fontsize=7)
    ax.set_ylabel("ms per round")
    ax.set_xlabel("sequences / draft steps")
    ax.set_title(f"where a round goes, {report['device']}, {report['dtype']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
