"""Speculative decoding of a real target with an EAGLE-3 head: the loop, its drafters, and the command.

One round, for every sequence of the batch at once:

    draft S steps        the head drafts d_1 .. d_S after the sequence's last token y (at position n)
    verify               one target forward over [y, d_1 .. d_S] at positions n .. n + S, against the KV cache
    accept               greedy: the longest prefix of drafts equal to the target's argmax; sampled: the
                         speculative-sampling rule below; then the target's own next token
    extend               the head absorbs the accepted rows: positions n .. n + k with their taps from the
                         verify forward and the token that follows each (d_1 .. d_k, then the target's token)

Rejected draft rows stay in the target's KV cache as columns that no later query attends (a per-sequence
mask), so sequences that accept different numbers of drafts share one batch without moving the cache. In the
head, the next extend overwrites them (docs/head.md, "Engine contract").

Sampled decoding uses the speculative-sampling rule for a deterministic draft (the draft distribution is a
point mass at d_j): accept d_j with probability p_j(d_j); at the first rejection sample from p_j with d_j
removed and renormalized; after S acceptances sample the bonus token from p_{S+1}. p is the target's
distribution after temperature and top-p, so the output distribution equals the target's own.

Drafters: `ReferenceDrafter` (tfe.Reference on the CPU) and `RuntimeDrafter` (tfe.Runtime on the GPU, taps
and tokens handed over as CUDA tensors). Without a drafter (or with steps = 0) the loop is the target's own
decoding, one token per forward: "drafts off".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from .target import Target


@dataclass
class Sampling:
    """temperature 0 is greedy (ties to the lower token id); else softmax(logits / temperature), then top-p."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The target's sampling distribution: softmax at the temperature, restricted to the smallest set of most
    likely tokens whose mass reaches top_p (the most likely token always kept), renormalized."""
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        sorted_p = sorted_p.masked_fill(mass_before >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def accept_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [B, S], logits [B, S + 1, V] -> (k [B] drafts kept, the target's next token [B])."""
    best = logits.argmax(-1)
    kept = (drafts == best[:, : drafts.shape[1]]).long().cumprod(-1).sum(-1)
    return kept, best.gather(1, kept[:, None]).squeeze(1)


def accept_sampled(
    drafts: torch.Tensor, probs: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [B, S], probs [B, S + 1, V] (the target's distributions) -> (k [B], the next token [B]) by the
    speculative-sampling rule for a deterministic draft."""
    B, S = drafts.shape
    rows = torch.arange(B, device=probs.device)
    if S:
        p_draft = probs[:, :S].gather(-1, drafts[..., None]).squeeze(-1)
        u = torch.rand(B, S, generator=generator, device=probs.device)
        kept = (u < p_draft).long().cumprod(-1).sum(-1)
    else:
        kept = torch.zeros(B, dtype=torch.long, device=probs.device)
    p = probs[rows, kept].clone()
    # At a rejection (kept < S) the rejected draft is removed from the distribution sampled from.
    rejected = kept < S
    if S and bool(rejected.any()):
        d = drafts[rows, kept.clamp(max=S - 1)]
        p[rows[rejected], d[rejected]] = 0.0
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return kept, torch.multinomial(p, 1, generator=generator).squeeze(1)


class Drafter(Protocol):
    """What the loop needs from a draft head: the calls of tfe.Reference / tfe.Runtime on torch tensors, and
    the target layers its head reads (`head_taps`, checked against the target's; a drafter without it is
    not checked)."""

    ring_rows: int
    head_taps: list

    def reset(self, slot: int) -> None: ...

    def extend(self, requests: Sequence[tuple[int, int, torch.Tensor, torch.Tensor]]) -> None:
        """(slot, first_pos, taps [rows, T * Ht], tokens [rows]) per slot, on the target's device."""

    def draft(self, slots: Sequence[int], steps: int) -> torch.Tensor:
        """[len(slots), steps] target token ids (int64, any device)."""


def split_requests(requests, ring_rows: int):
    """Calls of at most ring_rows rows per slot (one request per slot a call), in order."""
    pending = [list(r) for r in requests]
    while pending:
        call, rest = [], []
        for slot, pos, taps, tokens in pending:
            n = min(ring_rows, tokens.shape[0])
            call.append((slot, pos, taps[:n], tokens[:n]))
            if n < tokens.shape[0]:
                rest.append([slot, pos + n, taps[n:], tokens[n:]])
        yield call
        pending = rest


def packed(call, device):
    """One call's requests as extend_batch takes them: slots, first positions and row counts, and every
    request's rows in one taps (bf16) and one tokens (int32) tensor on `device`. One copy each, where a
    request apiece would cost a conversion and two array imports a sequence."""
    slots = [slot for slot, _, _, _ in call]
    first = [pos for _, pos, _, _ in call]
    counts = [tokens.shape[0] for _, _, _, tokens in call]
    taps = torch.cat([t for _, _, t, _ in call]).to(device=device, dtype=torch.bfloat16)
    tokens = torch.cat([k for _, _, _, k in call]).to(device=device, dtype=torch.int32)
    return slots, first, counts, taps, tokens


class ReferenceDrafter:
    """The CPU reference (tfe.Reference) as the drafter: taps go over as host bf16 tensors. It drafts the
    branches of a tree too (`first_ranks`, tfe.captured's `branches`), with a dense head."""

    def __init__(self, head, *, max_slots: int = 16, max_steps: int = 8, threads: int = 0):
        import tfe

        self.max_slots = max_slots
        self.ref = tfe.Reference(head, max_slots=max_slots, max_steps=max_steps, threads=threads)
        self.drafts_from_rank = self.ref.header["head_type"] == "dense"  # a two_stage head drafts its best only
        self.ring_rows = self.ref.ring_rows
        self.head_taps = head_taps(self.ref)

    def reset(self, slot: int) -> None:
        self.ref.reset(slot)

    def extend(self, requests) -> None:
        for call in split_requests(requests, self.ring_rows):
            slots, first, counts, taps, tokens = packed(call, "cpu")
            self.ref.extend_batch(slots, first, counts, taps, tokens)

    def draft(self, slots, steps: int, first_ranks: torch.Tensor | None = None) -> torch.Tensor:
        ranks = None if first_ranks is None else torch.as_tensor(first_ranks).tolist()
        tokens, _ = self.ref.draft(list(slots), steps, first_ranks=ranks)
        return torch.from_numpy(np.asarray(tokens)).long()

    def extend_batch(self, slots, first, counts, taps, tokens, starts) -> None:
        """extend_batch's form: one pair of row arrays (any device) for several slots."""
        self.ref.extend_batch(slots, first, counts, taps.cpu(), tokens.cpu(), starts=starts)


def runtime_buckets(max_slots: int) -> list[int]:
    """The default stream buckets, up to what `max_slots` can fill: the plan refuses a bucket of more streams
    than slots, and the defaults reach 16."""
    import tfe

    return sorted({min(b, max_slots) for b in tfe.PlanOptions().buckets})


class RuntimeDrafter:
    """The GPU runtime (tfe.Runtime) as the drafter, on the current torch stream: taps and tokens stay on the
    device (one extend_batch a call), and drafts come back from draft_async without a host wait. With
    `first_ranks` (a dense head) it drafts the branches of a tree too (tfe.captured's `branches`); an artifact
    compiled without that plan option is then planned and compiled anew. A call of more slots than the
    largest bucket runs as several passes."""

    def __init__(self, head, artifact=None, *, max_slots: int = 16, max_steps: int = 8, first_ranks: bool = False,
                 **options):
        import tfe

        if not torch.cuda.is_available():
            raise RuntimeError(
                "the runtime drafter needs a CUDA GPU, and torch sees none: on a CPU use the reference drafter "
                "(--drafter reference)"
            )
        if artifact is None and "buckets" not in options:
            options["buckets"] = runtime_buckets(max_slots)
        if first_ranks:
            options.update(first_ranks=True, recompile_mismatched_artifact=True)
        self.rt = tfe.Runtime(
            head,
            artifact,
            stream=torch.cuda.current_stream(),
            max_slots=max_slots,
            max_steps=max_steps,
            **options,
        )
        self.ring_rows = self.rt.ring_rows
        self.head_taps = head_taps(self.rt)
        self.drafts_from_rank = self.rt.plan_options.first_ranks
        self.largest = self.rt.plan_options.buckets[-1]  # the most slots one pass drafts
        # The runtime reads the taps when its stream gets there: keep them alive until the next round.
        self._in_flight: list = []

    def reset(self, slot: int) -> None:
        self.rt.reset(slot)

    def extend(self, requests) -> None:
        self._in_flight = []
        for call in split_requests(requests, self.ring_rows):
            rows = packed(call, call[0][2].device)  # the target's device; the runtime takes host rows too
            self._in_flight.append(rows)
            self.rt.extend_batch(*rows)

    def draft(self, slots, steps: int, first_ranks: torch.Tensor | None = None) -> torch.Tensor:
        slots = list(slots)
        ranks = None if first_ranks is None else [int(r) for r in first_ranks]
        parts = []
        for i in range(0, len(slots), self.largest):
            tokens, _ = self.rt.draft_async(slots[i : i + self.largest], steps,
                                            first_ranks=None if ranks is None else ranks[i : i + self.largest])
            parts.append(torch.from_dlpack(tokens).long())  # a copy: the runtime's buffer is reused by the next draft
        return torch.cat(parts)

    def draft_into(self, slot_ids: torch.Tensor, steps: int, out: torch.Tensor,
                   first_ranks: torch.Tensor | None = None) -> None:
        """Drafts for the int32 device slot ids into out (int32 [len(slot_ids), steps], contiguous), each
        slot's first step from its rank in first_ranks (int32 on the device; None: the best): a replay of the
        runtime's graph a largest bucket of slots, nothing copied through the host."""
        for i in range(0, len(slot_ids), self.largest):
            j = i + self.largest
            self.rt.draft_async(slot_ids[i:j], steps, tokens=out[i:j],
                                first_ranks=None if first_ranks is None else first_ranks[i:j])

    def extend_batch(self, slots, first, counts, taps, tokens, starts) -> None:
        """extend_batch's form on device rows (no host copy); the rows must stay unchanged until the stream
        has run the extend, as a round's fixed buffers do."""
        self.rt.extend_batch(slots, first, counts, taps, tokens, starts=starts)


class TorchDrafter:
    """The head run by PyTorch (tfe.torch_head: Eagle3Head loaded from the EAGLE-3 checkpoint, drafting
    through a DraftRing): the comparison point for tfe in the same loop, under the same contract as the
    runtime. bf16 on a GPU, fp32 on a CPU, unless `dtype` says. It drafts the branches of a tree too
    (`first_ranks`, tfe.captured's `branches`)."""

    drafts_from_rank = True

    def __init__(self, checkpoint, target: Target, *, max_slots: int = 16, max_steps: int = 8, window: int = 511, dtype=None):
        from .torch_head import DraftRing, Eagle3Head

        self.dtype = dtype or (torch.bfloat16 if target.device.type == "cuda" else torch.float32)
        self.head = Eagle3Head.load(checkpoint, target).to(self.dtype).eval()
        self.window = window
        self.max_slots = max_slots
        self.ring = DraftRing(self.head, max_slots=max_slots, max_steps=max_steps, window=window)
        self.head_taps = checkpoint_taps(checkpoint)

    def reset(self, slot: int) -> None:
        self.ring.reset(slot)

    def extend(self, requests) -> None:
        for slot, pos, taps, tokens in requests:
            self.ring.extend(slot, pos, taps, tokens)

    def draft(self, slots, steps: int, first_ranks: torch.Tensor | None = None) -> torch.Tensor:
        return self.ring.draft(slots, steps, first_ranks=first_ranks)


@dataclass
class Result:
    """One generate call: per sequence its new tokens and, per token, the target's rivals where it was chosen;
    the accept log; the time spent."""

    tokens: list[list[int]]
    # Per token, the target's next RIVALS best tokens there, each as (token, logits below the top one).
    rivals: list[list[list[tuple[int, float]]]]
    steps: int
    rounds: int = 0
    asked: list[int] = field(default_factory=list)  # per window position j = 1..S: rounds that offered a draft there
    kept: list[int] = field(default_factory=list)  # ... and accepted
    accepted_per_round: list[int] = field(default_factory=list)  # k of every sequence and round
    accepted_by_sequence: list[list[int]] = field(default_factory=list)  # the same, per sequence
    seconds: float = 0.0
    draft_seconds: float = 0.0  # in the drafter's calls, prefill extends included (DraftClock)
    prefill_seconds: float = 0.0
    # Seconds per round on the device by piece (draft, verify, accept, extend), the round's wall time and the
    # host time the device did not cover (tfe.captured with timing); empty otherwise.
    split: dict[str, float] = field(default_factory=dict)

    @property
    def margins(self) -> list[list[float]]:
        """Per sequence and token, the target's top-1 minus top-2 logit where it was chosen."""
        return [[r[0][1] for r in seq] for seq in self.rivals]

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafts kept per round and sequence (the target's own token not counted)."""
        a = self.accepted_per_round
        return sum(a) / len(a) if a else 0.0

    def sha256(self, i: int) -> str:
        return token_sha256(self.tokens[i])

    def accept_log(self) -> dict:
        return {
            "steps": self.steps,
            "rounds": self.rounds,
            "asked": self.asked,
            "kept": self.kept,
            "accept_rate_by_position": [k / a if a else 0.0 for a, k in zip(self.asked, self.kept)],
            "mean_accepted": self.mean_accepted,
            "tokens_per_round": self.mean_accepted + 1.0,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "draft_share": self.draft_seconds / self.seconds if self.seconds else 0.0,
        }


def token_sha256(tokens: Sequence[int]) -> str:
    """sha256 of the token ids as little-endian int32."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


RIVALS = 3  # the next best tokens kept beside each chosen one (a bf16 near-tie may involve three)


def _rivals(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Along the last dimension: the RIVALS best tokens after the top one [..., RIVALS] and how far below the
    top logit each lies [..., RIVALS]. The top one is argmax's (the lowest index among equal logits, as
    greedy decoding picks); topk orders equal values as it likes, so argmax's is taken out of its list."""
    top = logits.topk(RIVALS + 1, dim=-1)
    first = logits.argmax(-1, keepdim=True)
    # Stable: argmax's token moves to the end, the others keep topk's order.
    order = (top.indices == first).to(torch.int8).argsort(dim=-1, stable=True)[..., :RIVALS]
    ids, values = top.indices.gather(-1, order), top.values.gather(-1, order)
    return ids, top.values[..., :1] - values


def _as_rivals(ids: list, gaps: list) -> list[tuple[int, float]]:
    return [(int(t), float(g)) for t, g in zip(ids, gaps)]


def _rivals_of_row(flat: list[float], q: int) -> list[list[tuple[int, float]]]:
    """One sequence's rivals for its q rows from the host copy: q * RIVALS ids, then q * RIVALS gaps."""
    ids, gaps, R = flat[: q * RIVALS], flat[q * RIVALS :], RIVALS
    return [_as_rivals(ids[j * R : (j + 1) * R], gaps[j * R : (j + 1) * R]) for j in range(q)]


class DraftClock:
    """Time spent in the drafter's calls. On a GPU those calls return before the device has run them (the
    runtime only enqueues), so host time would miss the work: CUDA events on the current stream bracket each
    call instead: a span runs from when the stream reaches the call's first work to when its last is done,
    or, where the call itself waits (the CPU reference), to when it returns."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []
        self.host = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            self.spans.append([begin, None])
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans[-1][1] = end
        else:
            self.host += time.perf_counter() - self._t0

    def seconds(self) -> float:
        """The total; on a GPU, call it after the device has finished."""
        return self.host + sum(begin.elapsed_time(end) for begin, end in self.spans) / 1e3


class Decoder:
    """The loop over one target and (optionally) one drafter; `generate` decodes a batch of prompts."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter | None = None,
        *,
        steps: int = 4,
        sampling: Sampling | None = None,
        prefill_chunk: int | None = None,
        progress: bool = False,
        accept_log: Any = None,
    ):
        check_taps(target, drafter)
        self.target = target
        self.accept_log = accept_log  # a tfe.AcceptLog: each round's kept drafts, by window position
        self.drafter = drafter
        self.steps = steps if drafter is not None else 0
        self.sampling = sampling or Sampling()
        self.prefill_chunk = prefill_chunk
        self.progress = progress

    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)

    def _choose(self, drafts, logits, generator):
        if self.sampling.greedy:
            return accept_greedy(drafts, logits)
        return accept_sampled(drafts, target_probs(logits, self.sampling), generator)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> Result:
        """Exactly max_new_tokens new tokens per prompt (end-of-text does not stop a sequence, so that runs
        compare token for token)."""
        dev, B, S = self.target.device, len(prompts), self.steps
        if B == 0 or max_new_tokens < 1 or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one non-empty prompt and max_new_tokens >= 1")
        generator = torch.Generator(device=dev)
        generator.manual_seed(self.sampling.seed)
        result = Result([[] for _ in prompts], [[] for _ in prompts], S, asked=[0] * S, kept=[0] * S)
        # Each round's rivals as copied (flat, rows kept), unpacked once the clock has stopped: they serve the
        # checks, and the timed loop should not pay for their bookkeeping.
        packed_rivals: list[list[tuple[list[float], int]]] = [[] for _ in prompts]
        self._sync()
        start = time.perf_counter()
        if self.drafter is not None:
            for slot in range(B):
                self.drafter.reset(slot)

        clock = DraftClock(dev)
        cache = self.target.new_cache()
        last, pos, valid = self._prefill(prompts, cache, generator, result, clock)
        # Each sequence's next position, on the host beside pos on the device: requests need it as an int, and
        # reading it back would wait for the device once a sequence.
        pos_host = [len(p) for p in prompts]
        result.prefill_seconds = time.perf_counter() - start

        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=B * max_new_tokens, unit="tok", desc="decode", file=sys.stderr)
            bar.update(B)
        while min(len(t) for t in result.tokens) < max_new_tokens:
            if S:
                clock.start()
                drafts = self.drafter.draft(range(B), S).to(dev)
                clock.stop()
            else:
                drafts = torch.empty(B, 0, dtype=torch.long, device=dev)
            q = S + 1
            tokens = torch.cat([last[:, None], drafts], dim=1)
            positions = pos[:, None] + torch.arange(q, device=dev)
            causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
            mask = torch.cat([valid[:, None, :].expand(B, q, -1), causal.expand(B, q, q)], dim=-1)[:, None]
            out = self.target.forward(tokens, positions, cache, mask)
            kept, nxt = self._choose(drafts, out.logits, generator)
            rival_ids, rival_gaps = _rivals(out.logits)

            valid = torch.cat([valid, torch.arange(q, device=dev)[None, :] <= kept[:, None]], dim=1)
            emitted = torch.cat([drafts, torch.zeros(B, 1, dtype=torch.long, device=dev)], dim=1)
            emitted.scatter_(1, kept[:, None], nxt[:, None])
            # One copy to the host a round (accepted counts, emitted tokens, rivals; float64 holds each
            # exactly), taken before the extend is enqueued so that the device runs it while the host keeps
            # the books.
            host = [kept[:, None], emitted, rival_ids.flatten(1), rival_gaps.flatten(1)]
            rows = torch.cat([t.double() for t in host], dim=1).tolist()
            kept_host = [int(r[0]) for r in rows]
            emitted_host = [[int(t) for t in r[1 : q + 1]] for r in rows]
            if self.accept_log is not None and S:
                self.accept_log.record(kept_host, S)
            if self.drafter is not None:
                requests = [(b, pos_host[b], out.taps[b, : k + 1], emitted[b, : k + 1]) for b, k in enumerate(kept_host)]
                clock.start()
                self.drafter.extend(requests)
                clock.stop()
            before = sum(min(len(t), max_new_tokens) for t in result.tokens)
            for b, k in enumerate(kept_host):
                result.tokens[b] += emitted_host[b][: k + 1]
                packed_rivals[b].append((rows[b][1 + q :], k + 1))
                result.accepted_per_round.append(k)
                for j in range(S):
                    result.asked[j] += 1
                    result.kept[j] += int(j < k)
            result.rounds += 1
            pos = pos + kept + 1
            pos_host = [p + k + 1 for p, k in zip(pos_host, kept_host)]
            last = nxt
            if bar is not None:
                bar.update(sum(min(len(t), max_new_tokens) for t in result.tokens) - before)
        if bar is not None:
            bar.close()
        self._sync()
        result.seconds = time.perf_counter() - start
        result.draft_seconds = clock.seconds()
        result.tokens = [t[:max_new_tokens] for t in result.tokens]
        for b, rounds in enumerate(packed_rivals):
            for flat, n in rounds:
                result.rivals[b] += _rivals_of_row(flat, S + 1)[:n]
        result.rivals = [r[:max_new_tokens] for r in result.rivals]
        return result

    def _prefill(self, prompts, cache, generator, result, clock: DraftClock):
        """Runs the prompts through the target (in chunks of prefill_chunk columns), extends the head with
        every prompt row, and picks each sequence's first new token. Returns (that token [B], its position
        [B], the valid cache columns [B, C])."""
        dev, B = self.target.device, len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lengths.max())
        padded = torch.zeros(B, width, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            padded[b, : len(p)] = torch.tensor(list(p), dtype=torch.long)
        cols = torch.arange(width, device=dev)
        valid = cols[None, :] < lengths[:, None]
        first = torch.zeros(B, dtype=torch.long, device=dev)
        chunk = self.prefill_chunk or width
        for a in range(0, width, chunk):
            e = min(a + chunk, width)
            # A padding column attends only itself, so no row of the mask is empty; no real row reads it.
            seen = (cols[None, None, :e] <= cols[None, a:e, None]) & (
                valid[:, None, :e] | (cols[None, None, :e] == cols[None, a:e, None])
            )
            positions = cols[a:e].expand(B, -1)
            out = self.target.forward(padded[:, a:e], positions, cache, seen[:, None])
            ends = [(b, int(n) - 1) for b, n in enumerate(lengths.tolist()) if a <= int(n) - 1 < e]
            for b, end in ends:
                drafts = torch.empty(1, 0, dtype=torch.long, device=dev)
                _, tok = self._choose(drafts, out.logits[b : b + 1, end - a : end - a + 1], generator)
                first[b] = tok[0]
                result.tokens[b].append(int(tok[0]))
                ids, gaps = _rivals(out.logits[b, end - a])
                result.rivals[b].append(_as_rivals(ids.tolist(), gaps.tolist()))
            if self.drafter is not None:
                # Row p carries the token that follows it: the prompt's next token, or the first new token.
                following = torch.cat([padded, torch.zeros(B, 1, dtype=torch.long, device=dev)], dim=1)[:, 1:]
                following[torch.arange(B, device=dev), lengths - 1] = first
                requests = [
                    (b, a, out.taps[b, : min(e, int(n)) - a], following[b, a : min(e, int(n))])
                    for b, n in enumerate(lengths.tolist())
                    if int(n) > a
                ]
                clock.start()
                self.drafter.extend(requests)
                clock.stop()
        return first, lengths.clone(), valid


def left_padded(target: Target, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as transformers' generate takes a batch: ids [B, width] padded on the left with end-of-text,
    and the attention mask that hides the padding, on the target's device."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), target.tokenizer.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        mask[i, width - len(p) :] = 1
    return ids.to(target.device), mask.to(target.device)


def hf_generate(target: Target, ids: torch.Tensor, attention_mask: torch.Tensor, new: int, **options):
    """transformers' greedy `generate` for exactly `new` tokens a sequence: like the loop, end-of-text does not
    stop it (min_new_tokens would instead forbid end-of-text, and so change the tokens) and no logits
    processor runs. Raises where a version stopped early anyway. `options` go to generate."""
    with torch.inference_mode():
        out = target.model.generate(
            ids,
            attention_mask=attention_mask,
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=target.tokenizer.eos_token_id,
            **options,
        )
    made = (out.sequences if options.get("return_dict_in_generate") else out).shape[1] - ids.shape[1]
    if made != new:
        raise RuntimeError(f"transformers' generate made {made} tokens a sequence, not {new}, although eos_token_id=None")
    return out


def hf_greedy(target: Target, prompt: Sequence[int], max_new_tokens: int) -> Result:
    """The target's greedy decoding by transformers' own generate (one sequence, no padding): an independent
    check of the loop's drafts-off path, with rivals from its logits."""
    ids = torch.tensor([list(prompt)], device=target.device)
    out = hf_generate(target, ids, torch.ones_like(ids), max_new_tokens, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt) :].tolist()
    ids, gaps = _rivals(torch.stack(out.logits)[:, 0].float())
    rivals = [_as_rivals(i, g) for i, g in zip(ids.tolist(), gaps.tolist())]
    return Result([tokens], [rivals], 0)


def head_taps(head) -> list:
    """The target layers a .tfe head reads (a path, or anything with its header: tfe.HeadFile, tfe.Reference,
    tfe.Runtime): layer numbers, or "final" for the final norm's input, as load_target(tap_layers=...) takes
    them."""
    import tfe

    header = (tfe.HeadFile(str(head)) if isinstance(head, (str, os.PathLike)) else head).header
    return [t["layer"] for t in header["taps"]]


def checkpoint_taps(checkpoint) -> list[int]:
    """The target layers an EAGLE-3 checkpoint reads: eagle_config.eagle_aux_hidden_state_layer_ids names the
    layer whose output is tapped, one below the layer whose input Target taps."""
    config = json.loads((pathlib.Path(checkpoint) / "config.json").read_text())
    return [int(i) + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]


def read_taps(parser: argparse.ArgumentParser, head=None, checkpoint=None) -> list | None:
    """head_taps(--head), else checkpoint_taps(--checkpoint), else None (EAGLE-3's): what a command loads the
    target with; the parser's one-line error where the file is not a head, before the target loads."""
    import tfe

    try:
        return head_taps(head) if head else checkpoint_taps(checkpoint) if checkpoint else None
    except (tfe.Error, OSError, ValueError, KeyError, TypeError) as e:
        which = f"--head {head}" if head else f"--checkpoint {checkpoint}"
        parser.error(f"{which}: its taps cannot be read ({e})")


def check_taps(target: Target, drafter) -> None:
    """A drafter's head must read the layers the target taps: fed others, it drafts from the wrong residual
    stream, and the loop stays exact while its acceptance quietly falls."""
    taps = getattr(drafter, "head_taps", None)
    if taps is None:
        return
    layers = [target.num_layers if t == "final" else t for t in taps]
    if layers != target.tap_layers:
        raise ValueError(
            f"the head reads the target's layers {taps}, the target taps {target.tap_layers}: load the target "
            f"with load_target(..., tap_layers={taps})"
        )


def make_drafter(
    kind: str, head, *, max_slots: int, max_steps: int, artifact=None, checkpoint=None, target: Target | None = None,
    first_ranks: bool = False,
) -> Drafter | None:
    """'reference' (CPU), 'runtime' (GPU), 'torch' (the PyTorch port: needs the checkpoint and the target) or
    'none' (drafts off). `first_ranks`: the runtime opened to draft branches too (the others always can)."""
    if kind == "none":
        return None
    if kind == "torch":
        if checkpoint is None or target is None:
            raise ValueError("the torch drafter runs the EAGLE-3 checkpoint: pass --checkpoint")
        return TorchDrafter(checkpoint, target, max_slots=max_slots, max_steps=max_steps)
    if kind == "reference":
        return ReferenceDrafter(head, max_slots=max_slots, max_steps=max_steps)
    if kind == "runtime":
        return RuntimeDrafter(head, artifact, max_slots=max_slots, max_steps=max_steps, first_ranks=first_ranks)
    raise ValueError(f"unknown drafter {kind!r} (reference, runtime, torch, none)")


def check_common_arguments(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The checks every real-target command makes of its shared arguments before it loads the target: one
    line naming the argument and its limit (parser.error), not a traceback a minute later."""
    import os

    if getattr(a, "head", None) and not os.path.isfile(a.head):
        parser.error(f"--head {a.head}: no such file (a .tfe head: tfe-plan convert CHECKPOINT -o HEAD.tfe)")
    for name in ("checkpoint", "artifact"):
        value = getattr(a, name, None)
        if value and not os.path.isdir(value):
            parser.error(f"--{name} {value}: no such directory")
    if getattr(a, "gguf", None) and not os.path.exists(a.gguf):
        parser.error(f"--gguf {a.gguf}: no such file or directory")
    steps = getattr(a, "steps", None)
    if isinstance(steps, int) and not 1 <= steps <= MAX_STEPS:
        parser.error(f"--steps {steps}: must be 1..{MAX_STEPS} (draft steps a round)")
    if getattr(a, "max_new_tokens", 1) < 1:
        parser.error(f"--max-new-tokens {a.max_new_tokens}: must be at least 1")
    if getattr(a, "temperature", 0.0) < 0:
        parser.error(f"--temperature {a.temperature}: must be >= 0 (0: greedy)")
    top_p = getattr(a, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        parser.error(f"--top-p {top_p}: must be in (0, 1]")


MAX_STEPS = 16  # the largest max_steps a plan takes
