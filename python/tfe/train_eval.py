"""The held-out score of a head: teacher-forced top-1 (and top-k) agreement by draft step, and the greedy
loop's tokens a round simulated from the same drafts (`loop_rounds`), for the chain and for draft trees
(`TREES`); the same on a sample of the training answers (`training_sample`), so that the gap shows. The
training logs it against time (tfe.train_head); `tfe-train-head --evaluate` scores any checkpoint with it.
The headline is the figure `tfe-speedup --acceptance` measures, which it predicts."""

from __future__ import annotations

import json
import math
import pathlib
import random
from dataclasses import replace

import torch

from . import prompts as prompt_sets
from .target import Target
from .torch_head import Eagle3Head
from .train_data import Sequence, Settings, held_out_data, load_data
from .train_rows import Labels, head_autocast, pack, ttt_loss


# Draft trees the held-out evaluation scores beside the chain: per level, how many of the draft's most
# likely tokens each node of the level before expands (the last width repeats to the last step). A tree
# keeps the target's path while each of its tokens lies within its level's width, and the training-time
# test is teacher-forced on exactly that path, so the figure is exact, not a model of the tree.
TREES = {"chain": (1,), "2 then chains": (2, 1), "4 then chains": (4, 1), "4, 2 then chains": (4, 2, 1),
         "2 everywhere": (2,), "3 everywhere": (3,)}


def tree_widths(name: str, steps: int) -> list[int]:
    w = TREES[name]
    return [w[min(k, len(w) - 1)] for k in range(steps)]


def tree_nodes(name: str, steps: int) -> int:
    """The drafts a tree of `steps` levels asks the target to verify."""
    return sum(math.prod(tree_widths(name, steps)[: d + 1]) for d in range(steps))


def loop_rounds(hits: list[list[bool]], start: int, end: int, steps: int) -> list[int]:
    """Drafts kept in each round of the greedy loop over one sequence whose text is the target's greedy
    answer: hits[k][i] says whether step k's draft at index i (teacher-forced) agrees with the target. A
    round at index i keeps the leading agreeing steps, up to `steps` (where all earlier steps agree, the
    true tokens fed to a step are the drafts, so the teacher-forced step is the loop's); the next round
    starts at i + kept + 1. The first round is at `start`, the prompt's last index (the target's first token
    comes from the prefill; the round's first draft is the token after it), the last where index + 2 < end."""
    kept, i = [], start
    while i + 2 < end:
        k = 0
        while k < steps and i + k + 2 < end and hits[k][i]:
            k += 1
        kept.append(k)
        i += k + 1
    return kept


@torch.no_grad()
def held_out_agreement(head: Eagle3Head, labels: Labels, settings: Settings, autocast, trees: bool = False) -> dict:
    """Over the held-out rows (one sequence each: a prompt and the target's greedy answer): top-1 agreement
    by draft step, overall and by group, and the greedy loop's tokens a round at S = 1..ttt_steps over each
    answer's first eval_new_tokens, simulated from the same drafts (`loop_rounds`). A group is the prompt's
    class for the evaluation prompts and the source for the rest (the conversations: "chitchat"). The
    headline, `loop_tokens_per_round`, is the mean over the classes, each weighing the same: the work and
    the figure of `tfe-speedup --acceptance`, which it predicts. The `by_class` keys hold the groups. With
    `trees`, also each step's top-k agreement (k = 1..4) over the classes' rows and the headline figure for
    each of TREES. `vocab_coverage`: the share of the target's scored tokens that the draft vocabulary holds
    (over the classes' rows, and by group), a ceiling on every agreement: the rest are never drafted, and
    the agreement figures leave them out while the loop's count them as misses."""
    groups = [c if src == "template" else src for c, src in zip(labels.rows.cls, labels.rows.source)]
    steps = settings.ttt_steps
    total = torch.zeros(steps)
    seen = torch.zeros(steps)
    top_k, top_seen = torch.zeros(steps, 4), torch.zeros(steps)  # the classes' rows, as the headline
    by_group: dict[str, list[torch.Tensor]] = {}
    covered: dict[str, list[int]] = {}  # group: [draftable, scored] target tokens
    shapes = list(TREES) if trees else ["chain"]
    rounds: dict[str, dict[str, list[list[int]]]] = {name: {} for name in shapes}  # tree, group, S - 1
    for i in range(len(groups)):  # a row at a time: held-out rows hold one sequence each
        batch = labels.take(torch.tensor([i]))
        ranks: list[torch.Tensor] = []
        _, agree, counted = ttt_loss(head, batch, settings, autocast, ranks)
        agree, counted = torch.stack(agree).float().cpu(), torch.stack(counted).float().cpu()
        total += agree
        seen += counted
        c = by_group.setdefault(groups[i], [torch.zeros(steps), torch.zeros(steps)])
        c[0] += agree
        c[1] += counted
        rank = torch.stack(ranks)[:, 0].cpu()  # [steps, N]
        real = batch[3][0] & (batch[2][0] >= 0)
        cov = covered.setdefault(groups[i], [0, 0])
        cov[0] += int((batch[7][0] & real).sum())
        cov[1] += int(real.sum())
        if groups[i] in prompt_sets.CLASSES:
            top_k += torch.stack([(rank < k).sum(-1) for k in range(1, 5)], -1).float()
            top_seen += counted
        scored, doc = batch[3][0].cpu(), batch[2][0].cpu()
        # The first scored index is the prompt's last (scored_from - 1); the target's first new token
        # follows it, from the prefill.
        length = int((doc >= 0).sum())
        start = int(scored.nonzero()[0]) if scored.any() else length
        end = min(length, start + 1 + settings.eval_new_tokens)
        for name in shapes:
            hits = [(rank[k] < w).tolist() for k, w in enumerate(tree_widths(name, steps))]
            per_s = rounds[name].setdefault(groups[i], [[] for _ in range(steps)])
            for S in range(1, steps + 1):
                per_s[S - 1] += loop_rounds(hits, start, end, S)
    rate = lambda a, n: [float(x) for x in a / n.clamp_min(1)]  # noqa: E731

    def per_round(by: dict[str, list[list[int]]]) -> tuple[list[float], dict[str, list[float]]]:
        per_group = {g: [1 + sum(r) / len(r) if r else 0.0 for r in per_s] for g, per_s in sorted(by.items())}
        # The classes with rounds, as tfe-speedup --acceptance averages them; the rest where no class has any.
        classes = [g for g in per_group if g in prompt_sets.CLASSES and any(by[g])] or list(per_group)
        return [sum(per_group[g][S] for g in classes) / max(len(classes), 1) for S in range(steps)], per_group

    loop_mean, loop_by_group = per_round(rounds["chain"])
    out = {"acc": rate(total, seen), "by_class": {g: rate(a, n) for g, (a, n) in sorted(by_group.items())},
           "positions": int(seen[0]), "loop_tokens_per_round": loop_mean, "loop_tokens_per_round_by_class": loop_by_group}
    in_classes = [c for g, c in covered.items() if g in prompt_sets.CLASSES] or list(covered.values())
    out["vocab_coverage"] = sum(c[0] for c in in_classes) / max(sum(c[1] for c in in_classes), 1)
    out["vocab_coverage_by_class"] = {g: c[0] / max(c[1], 1) for g, c in sorted(covered.items())}
    if trees:
        out["top_k_agreement"] = [[float(x) for x in top_k[k] / top_seen[k].clamp_min(1)] for k in range(steps)]
        out["trees"] = {name: {"widths": tree_widths(name, steps), "nodes": [tree_nodes(name, S) for S in range(1, steps + 1)],
                               "tokens_per_round": per_round(rounds[name])[0]} for name in shapes}
    return out


PROMPTED = ("template", "named", "questions", "self-instruct")  # the sources of prompts of the classes


def training_sample(seqs: list[Sequence], settings: Settings) -> list[Sequence]:
    """A fixed sample of the training answers, fit_per_class of each class (to templated, listed-subject,
    listed-question and self-instruct prompts; answers of at least 32 tokens, or answer_tokens), scored as
    the held-out ones are: what the head does on prompts it trained on, beside what it does on prompts it
    never saw. Their gap says whether the data generalizes. Greedy answers alone, as the held-out ones: a
    prompt's first answer in `seqs` is its greedy one (the data phase writes the greedy round first)."""
    per_class, seed, least = settings.fit_per_class, settings.seed, min(32, settings.answer_tokens)
    rng = random.Random(f"training-sample:{seed}")
    seen: set[tuple[int, ...]] = set()
    greedy = []
    for q in seqs:
        prompt = tuple(q.ids[: q.scored_from])
        if q.source in PROMPTED and prompt not in seen:
            seen.add(prompt)
            greedy.append(q)
    out = []
    for c in prompt_sets.CLASSES:
        pool = [q for q in greedy if q.cls == c and len(q.ids) - q.scored_from >= least]
        # Grouped by class, as the evaluation prompts are.
        out += [replace(q, source="template") for q in rng.sample(pool, min(per_class, len(pool)))]
    return out


def loop_line(got: dict) -> str:
    """The simulated loop's tokens a round at S = 1..steps, as the logs print it."""
    return " ".join(f"{x:.2f}" for x in got["loop_tokens_per_round"])


def loop_and_fit_line(got: dict) -> str:
    """`held_out_agreement`'s loop figures as the logs print them, with the training sample's beside them."""
    fit = f" (on a training sample: {loop_line(got['training_sample'])})" if "training_sample" in got else ""
    return f"the loop's tokens a round at S = 1..{len(got['loop_tokens_per_round'])}: {loop_line(got)}{fit}"


def coverage_line(got: dict) -> str:
    """`held_out_agreement`'s vocabulary coverage as the logs print it."""
    return (f"the draft vocabulary holds {got['vocab_coverage']:.3f} of the target's tokens (by class: "
            + ", ".join(f"{g} {v:.3f}" for g, v in got["vocab_coverage_by_class"].items()) + ")")


def evaluation_settings(ckpt: str | pathlib.Path, settings: Settings) -> Settings:
    """The settings a checkpoint is scored with: rows as it was trained on (its window + 1); one batch of the
    held-out prompts, not gen_batch rows: a CPU has memory for the cache of this many."""
    window = json.loads((pathlib.Path(ckpt) / "config.json").read_text())["max_position_embeddings"] - 1
    held = settings.eval_per_class * len(prompt_sets.CLASSES) + settings.eval_chitchat
    return replace(settings, seq_len=window + 1, gen_batch=min(settings.gen_batch, held))


def read_held_out(ckpt: str | pathlib.Path, data: pathlib.Path, settings: Settings) -> tuple[list[Sequence], list[Sequence]]:
    """The held-out sequences of a data phase's file (the ones a training run on it scored) and its
    `training_sample`, for rows of the checkpoint's; refused naming --data where the file is another kind or
    was made for other rows."""
    seqs, held, _ = load_data(data, evaluation_settings(ckpt, settings))
    return held, training_sample(seqs, settings)


def evaluate_head(target: Target, ckpt: str | pathlib.Path, settings: Settings, log=print,
                  held_out: tuple[pathlib.Path, list[Sequence], list[Sequence]] | None = None) -> dict:
    """`held_out_agreement` with TREES for a trained head, on held-out data the target writes now, or on
    `held_out` (a data file and its read_held_out sequences, then also on its training sample): the
    training's held-out figures for any checkpoint, on a CPU too."""
    head = Eagle3Head.load(ckpt, target).eval()
    settings = evaluation_settings(ckpt, settings)
    autocast = head_autocast(target.device)
    sample: list[Sequence] = []
    if held_out is not None:
        source, evaluation, sample = str(held_out[0]), held_out[1], held_out[2]
        log(f"held-out: {len(evaluation)} sequences from {source}")
    else:
        source, (evaluation, _) = "written now", held_out_data(target, settings, log)
    labels = Labels(target, pack(evaluation, settings.seq_len, packed=False), head.draft_ids, settings, log, "held-out")
    out = {"checkpoint": str(ckpt), "held_out_sequences": len(evaluation), "held_out_from": source,
           **held_out_agreement(head, labels, settings, autocast, trees=True)}
    if sample:
        fit = Labels(target, pack(sample, settings.seq_len, packed=False), head.draft_ids, settings, log, "training sample")
        out["training_sample"] = {"sequences": len(sample), **held_out_agreement(head, fit, settings, autocast)}
    return out


def evaluation_table(got: dict) -> str:
    """evaluate_head's figures as text: agreement by step and top k, tokens a round by tree and S."""
    steps = len(got["acc"])
    lines = [f"held-out ({got['held_out_sequences']} sequences): top-k agreement by step on the classes' prompts"]
    lines.append("step   " + "".join(f"{f'k={k}':>7}" for k in range(1, 5)))
    lines += [f"{k + 1:<7}" + "".join(f"{x:7.2f}" for x in row) for k, row in enumerate(got["top_k_agreement"])]
    lines.append("tokens a round (mean of the classes; drafts to verify) by tree and S")
    lines.append(f"{'tree':18}" + "".join(f"{f'S={S}':>12}" for S in range(1, steps + 1)))
    for name, t in got["trees"].items():
        lines.append(f"{name:18}" + "".join(f"{f'{x:.2f} ({n})':>12}" for x, n in zip(t["tokens_per_round"], t["nodes"])))
    lines.append(coverage_line(got))
    if "training_sample" in got:
        fit = got["training_sample"]
        lines.append(f"on a sample of the training answers ({fit['sequences']} sequences): the chain's tokens a round "
                     f"at S = 1..{steps} {loop_line(fit)}; step-1 agreement by class "
                     + ", ".join(f"{g} {v[0]:.2f}" for g, v in fit["by_class"].items()))
        lines.append("held-out step-1 agreement by class: " + ", ".join(f"{g} {v[0]:.2f}" for g, v in got["by_class"].items()))
    lines.append("the chain by class (chitchat: the held-out conversations): " + ", ".join(f"{g} {v[-1]:.2f}" for g, v in got["loop_tokens_per_round_by_class"].items())
                 + f" at S = {steps}")
    return "\n".join(lines)
