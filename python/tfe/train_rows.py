"""Training rows and the training-time-test loss: the data phase's sequences packed into rows of seq_len
tokens, the target's taps and labels for each row (computed once and kept while they fit), and the head's
weighted loss over its draft steps. tfe.train_head trains on them; tfe.train_eval scores held-out rows
with the same loss's drafts."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .target import Target
from .torch_head import Eagle3Head
from .train_data import Sequence, Settings


def draft_vocabulary(seqs: list[Sequence], vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent scored tokens (ties to the lower id), ascending by id; where the data holds
    fewer distinct tokens, the lowest unused ids fill the rest."""
    scored = [t for s in seqs for t in s.ids[max(s.scored_from, 1) :]]
    counts = torch.bincount(torch.tensor(scored, dtype=torch.long), minlength=vocab)
    # Stable sort: among equal counts the lower id comes first.
    order = torch.sort(-counts, stable=True).indices
    return torch.sort(order[:size]).values


@dataclass
class Rows:
    """Sequences laid in rows of N tokens: ids, the position of each token in its sequence, the sequence's
    number in its row (-1: padding) and whether the target's prediction there is scored; all [R, N]."""

    ids: torch.Tensor
    positions: torch.Tensor
    doc: torch.Tensor
    scored: torch.Tensor
    cls: list[str]  # per row, the class of its first sequence
    source: list[str]  # per row, the source of its first sequence


def pack(seqs: list[Sequence], n: int, packed: bool = True) -> Rows:
    """Sequences into rows of n tokens in order (first fit among the open rows when packed, else one a row)."""
    rows: list[list[Sequence]] = []
    room: list[int] = []
    for s in seqs:
        length = min(len(s.ids), n)
        slot = next((r for r in range(max(0, len(rows) - 8), len(rows)) if room[r] >= length), None) if packed else None
        if slot is None:
            rows.append([])
            room.append(n)
            slot = len(rows) - 1
        rows[slot].append(s)
        room[slot] -= length
    R = len(rows)
    ids = torch.zeros(R, n, dtype=torch.long)
    positions = torch.zeros(R, n, dtype=torch.long)
    doc = torch.full((R, n), -1, dtype=torch.long)
    scored = torch.zeros(R, n, dtype=torch.bool)
    for r, row in enumerate(rows):
        at = 0
        for d, s in enumerate(row):
            t = s.ids[:n]
            ids[r, at : at + len(t)] = torch.tensor(t)
            positions[r, at : at + len(t)] = torch.arange(len(t))
            doc[r, at : at + len(t)] = d
            scored[r, at + max(s.scored_from - 1, 0) : at + len(t)] = True
            at += len(t)
    return Rows(ids, positions, doc, scored, [row[0].cls for row in rows], [row[0].source for row in rows])


def target_pass(target: Target, ids: torch.Tensor, positions: torch.Tensor, doc: torch.Tensor):
    """Taps and logits of the target over packed rows: each sequence attends itself only (no cache)."""
    N = ids.shape[1]
    causal = torch.ones(N, N, dtype=torch.bool, device=ids.device).tril()[None]
    seen = causal & (doc[:, :, None] == doc[:, None, :]) & (doc >= 0)[:, None, :]
    seen = seen | torch.eye(N, dtype=torch.bool, device=ids.device)[None]  # padding attends itself
    out = target.forward(ids, positions, target.new_cache(), seen[:, None])
    return out.taps, out.logits


class Labels:
    """The target's taps and labels per row (`take(rows)`): computed once and kept on the device while they
    fit in cache_gib, else computed per batch."""

    def __init__(self, target: Target, rows: Rows, draft_ids: torch.Tensor, settings: Settings, log, name: str):
        self.target, self.rows, self.top = target, rows, min(settings.label_top, len(draft_ids))
        dev = target.device
        self.draft_ids = draft_ids.to(dev)
        self.t2d = torch.full((target.vocab,), -1, dtype=torch.long, device=dev)
        self.t2d[self.draft_ids] = torch.arange(len(draft_ids), device=dev)
        R, N = rows.ids.shape
        # bf16 taps, the labels (bf16 p, int16 or int32 idx), draftable, and the row's ids, positions, doc, scored
        per_row = N * (len(target.tap_layers) * target.model.config.hidden_size * 2 + self.top * 6 + 1 + 25)
        self.cached = None
        # The rows' own tensors where the labels are kept on the device too, so that `take` copies nothing from
        # the host: a copy from pageable memory waits for the stream, and the host could not run ahead.
        self.row_tensors: list[torch.Tensor] | None = None
        if R * per_row <= settings.cache_gib * 2**30:
            t0 = time.perf_counter()
            parts = [self._compute(torch.arange(a, min(a + settings.batch, R))) for a in range(0, R, settings.batch)]
            self.cached = [torch.cat(p) for p in zip(*parts)]
            self.row_tensors = [t.to(dev) for t in (rows.ids, rows.positions, rows.doc, rows.scored)]
            log(f"{name}: the target's taps and labels of {R} rows kept ({R * per_row / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s)")
        else:
            log(f"{name}: {R} rows need {R * per_row / 2**30:.1f} GiB, more than cache_gib: the target runs per batch")

    @torch.inference_mode()
    def _compute(self, which: torch.Tensor):
        dev = self.target.device
        r = self.rows
        ids, positions, doc = r.ids[which].to(dev), r.positions[which].to(dev), r.doc[which].to(dev)
        taps, logits = target_pass(self.target, ids, positions, doc)
        draftable = self.t2d[logits.argmax(-1)] >= 0
        p, idx = torch.softmax(logits[..., self.draft_ids], dim=-1).topk(self.top, dim=-1)
        p = p / p.sum(-1, keepdim=True)
        return taps.to(torch.bfloat16), p.to(torch.bfloat16), idx.to(torch.int16 if len(self.draft_ids) < 2**15 else torch.int32), draftable

    @torch.no_grad()
    def tap_rms(self, rows: int = 256) -> torch.Tensor:
        """Each tap channel's RMS [T*H] (fp32) over the real tokens of the first `rows` rows, the first of each
        sequence left out: the target's first position carries activations a thousand times the others'."""
        sums, count = 0.0, 0
        for a in range(0, min(rows, self.rows.ids.shape[0]), 16):  # 16 rows a pass where the target runs per batch
            _, positions, doc, _, taps, *_ = self.take(torch.arange(a, min(a + 16, rows, self.rows.ids.shape[0])))
            x = taps[(positions > 0) & (doc >= 0)].float()
            sums, count = sums + x.pow(2).sum(0), count + x.shape[0]
        return (sums / max(count, 1)).sqrt()

    def take(self, which: torch.Tensor):
        """(ids, positions, doc, scored, taps, label probabilities, their draft ids, draftable) of rows. With the
        labels kept, `which` on the target's device makes this a few gathers there and nothing more."""
        dev = self.target.device
        if self.cached is not None:
            which = which.to(dev)
            ids, positions, doc, scored = (t[which] for t in self.row_tensors)
            got = [t[which] for t in self.cached]
        else:
            which = which.cpu()
            r = self.rows
            ids, positions, doc, scored = (t[which].to(dev) for t in (r.ids, r.positions, r.doc, r.scored))
            got = self._compute(which)
        # A copy out of inference mode: autograd may save it.
        taps, p, idx, draftable = (t.clone() for t in got)
        return (ids, positions, doc, scored, taps, p, idx.long(), draftable)


def ahead(t: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """t[:, i + by] at index i along dim 1, `fill` past the end."""
    return F.pad(t[:, by:], (0, 0) * (t.dim() - 2) + (0, by), value=fill)


def step_mask(scored, draftable, doc, k: int) -> torch.Tensor:
    """Where step k's draft at index i is scored: the target's distribution at index i + k + 1 labels it,
    within one sequence, inside the scored text, with its argmax in the draft vocabulary."""
    return ahead(scored, k + 1) & ahead(draftable, k + 1) & (ahead(doc, k + 1, -1) == doc) & (doc >= 0)


def ttt_loss(head: Eagle3Head, batch, settings: Settings, autocast, ranks: list | None = None):
    """The weighted training-time-test loss, and per step the top-1 agreement and the positions scored.
    With `ranks`, each step's [B, N] rank of the target's token among the draft's logits (0: the draft's
    top 1; NOT_SCORED where the position is not scored) is appended to it."""
    ids, positions, doc, scored, taps, p, idx, draftable = batch
    with autocast:
        outs = head.ttt(taps if taps.device.type == "cuda" else taps.float(), ids, settings.ttt_steps, window=settings.seq_len - 1, positions=positions, doc=doc)
    loss = torch.zeros((), device=ids.device)
    agree, counted = [], []
    for k, draft_logits in enumerate(outs):
        mask = step_mask(scored, draftable, doc, k)
        # The cross-entropy with the label's top tokens, -sum p log softmax(z)[idx], as sum(p) lse(z) -
        # sum p z[idx]: no [B, N, Vd] log-softmax is written, read back and kept for the backward pass.
        z = draft_logits.float()
        pk = ahead(p, k + 1).float()
        per_pos = pk.sum(-1) * torch.logsumexp(z, dim=-1) - (pk * z.gather(-1, ahead(idx, k + 1))).sum(-1)
        n = mask.sum()
        loss = loss + (0.8**k) * (per_pos * mask).sum() / n.clamp_min(1)
        label = ahead(idx, k + 1)[..., :1]
        hit = (draft_logits.argmax(-1) == label[..., 0]) & mask
        agree.append(hit.sum().detach())
        counted.append(n.detach())
        if ranks is not None:
            # Ties go to the lower draft id, as argmax's do: bf16 logits tie often enough to count.
            mine = draft_logits.gather(-1, label)
            lower = torch.arange(draft_logits.shape[-1], device=label.device) < label
            rank = ((draft_logits > mine) | ((draft_logits == mine) & lower)).sum(-1)
            ranks.append(torch.where(mask, rank, NOT_SCORED).detach())
    return loss, agree, counted


NOT_SCORED = 1 << 30  # a rank no draft tree reaches (tfe.train_eval's trees)

def head_autocast(dev: torch.device):
    """bf16 autocast on a GPU (the head reads bf16 taps, as at run time); fp32 on a CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
