"""The speculative loop at graph speed: fixed shapes, replayed CUDA graphs, decisions on the device.

A round, for a batch of B sequences and S draft steps, is four pieces on one stream:

    draft     the drafter writes d_1 .. d_S for every sequence into a fixed [B, S] buffer (tfe.Runtime:
              draft_async, a replay of the runtime's own graph; a PyTorch drafter: captured by this loop)
    verify    the target's forward over [y, d_1 .. d_S] at each sequence's own positions n .. n + S, against
              a static KV cache indexed by position (tfe.static_target): one CUDA graph per (B, S)
    accept    greedy or the speculative-sampling rule on the device; the emitted tokens, the target's rivals,
              the next positions and tokens, all into fixed buffers; one copy to the host: a second graph
    extend    the head absorbs each sequence's accepted rows from the verify's taps (the one eager call: its
              row counts are the host's, read from that copy)

The host waits once a round, for the copy, and then only appends tokens and enqueues the extend. A rejected
draft needs no cleanup: its K/V column is written again by the next round at the same position, and
causality by position keeps later rows from reading it before then. A sequence that has its tokens stops
advancing (its position and last token stay, on the device) while the others finish. Its last round may
have overshot its tokens by up to S, and it still verifies S + 1 columns from there each round, so the cache
needs prompt + new tokens + 2S columns.

With `branches` k > 1 (greedy), each sequence drafts k chains that differ from their first step: chain r
starts from the head's rank-r token, then continues greedily ("k then chains"). They take k rows of every
buffer, the target's cache included, and k drafter slots; each row verifies its own chain, and the accept
piece copies the row that kept the most (the lowest rank at a tie) over its siblings, its cache columns of
the round included, so that the k rows of a sequence leave every round equal but for their next drafts.

Without a GPU (or with graphs=False) the same pieces run eagerly, in the same order: the CPU tests check the
very code the GPU replays. tfe.speculative.Decoder is the eager loop over transformers' own cache, kept as the
reference this loop is checked against.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

import torch

from .speculative import (RIVALS, Decoder, Result, Sampling, _as_rivals, _rivals, _rivals_of_row, accept_greedy, check_taps,
                          target_probs)
from .static_target import StaticTarget
from .target import Target

COLUMN_STEP = 256  # cache columns are rounded up to this, so that runs of similar length share graphs
MAX_BRANCHES = 8  # first-step ranks 0..7: tfe::kMaxFirstRank + 1


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [..., V] by the inverse CDF at u [...] in (0, 1]: the token i with
    cdf[i - 1] < u * cdf[-1] <= cdf[i]. A token of probability 0 is never chosen. No host sync."""
    cdf = probs.cumsum(-1)
    x = (u * cdf[..., -1])[..., None]
    return (cdf < x).sum(-1).clamp_(max=probs.shape[-1] - 1)


def accept_sampled_fixed(
    drafts: torch.Tensor, probs: torch.Tensor, u_accept: torch.Tensor, u_sample: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The speculative-sampling rule for a deterministic draft without a host branch (capturable):
    drafts [B, S], probs [B, S + 1, V], u_accept [B, S] in [0, 1), u_sample [B] in (0, 1] ->
    (k [B] drafts kept, the next token [B]). Draft j is kept while u_j < p_j(d_j); at the first rejection
    the next token is drawn from p_k without d_k, renormalized; after S acceptances from p_{S+1}."""
    B, S = drafts.shape
    rows = torch.arange(B, device=probs.device)
    if S:
        p_draft = probs[:, :S].gather(-1, drafts[..., None]).squeeze(-1)
        kept = (u_accept < p_draft).long().cumprod(-1).sum(-1)
    else:
        kept = torch.zeros(B, dtype=torch.long, device=probs.device)
    p = probs[rows, kept]
    if S:
        rejected = drafts[rows, kept.clamp(max=S - 1)]
        keep_mass = (kept == S).to(p.dtype)[:, None]  # 0 at a rejection: the rejected draft is removed
        p = p.scatter(1, rejected[:, None], p.gather(1, rejected[:, None]) * keep_mass)
    return kept, sample_from(p, u_sample)


class _Shape:
    """What one (B, S, columns) needs: the static target, fixed buffers, and the graphs of its round. B
    counts rows: a sequence's `branches` rows side by side."""

    def __init__(self, target: Target, B: int, S: int, columns: int, compile_layers: bool, rivals: bool, branches: int = 1):
        dev = target.device
        self.B, self.S, self.q, self.branches = B, S, S + 1, branches
        # The rank a row's first draft step takes (int32: the runtime reads it on the device).
        self.ranks = torch.arange(B, dtype=torch.int32, device=dev) % branches
        self.static = StaticTarget(target, B, columns, compile_layers=compile_layers)
        self.columns = columns
        self.slot_ids = torch.arange(B, dtype=torch.int32, device=dev)
        self.drafts = torch.zeros(B, S, dtype=torch.int32, device=dev)
        self.last = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.produced = torch.zeros(B, dtype=torch.long, device=dev)  # tokens emitted so far, the first included
        self.max_new = torch.zeros((), dtype=torch.long, device=dev)
        self.logits = torch.zeros(B, self.q, target.vocab, dtype=torch.float32, device=dev)
        width = len(target.tap_layers) * target.hidden
        self.taps = torch.zeros(B, self.q, width, dtype=torch.bfloat16, device=dev)  # the head's dtype
        self.emitted = torch.zeros(B, self.q, dtype=torch.int32, device=dev)
        # kept, then emitted (q), then rivals' ids and gaps (q * RIVALS each); float64 holds each exactly.
        self.rivals = rivals
        self.report_width = 1 + self.q + (2 * self.q * RIVALS if rivals else 0)
        self.report = torch.zeros(B, self.report_width, dtype=torch.float64, device=dev)
        pin = dev.type == "cuda"
        self.report_host = torch.zeros(B, self.report_width, dtype=torch.float64, pin_memory=pin)
        self.copied = torch.cuda.Event() if pin else None
        self.graphs: dict[str, Any] = {}


class CapturedDecoder:
    """The loop with the target's forward over a static, position-indexed cache; on a GPU each round replays
    the verify and accept graphs of its (B, S). Same interface and Result as tfe.speculative.Decoder.

    `compile_layers`: the target's decoder layer through torch.compile (inductor's fused kernels) inside the
    captured graphs; compiled once per shape, the first round of a shape pays for it. `timing`: on a GPU,
    CUDA events around every piece of every round, for Result.split (a few microseconds of host time a
    round); a CPU run is always split, by the host's clock.
    `prefill_chunk`: the prompts go through the target and into the head in pieces of this many columns.
    `rivals`: keep the target's next best tokens beside each emitted one (Result.rivals, which the exactness
    checks read); a timed run leaves them out, as an engine would.
    `columns`: the least KV cache columns to allocate, so that calls of different lengths share one shape
    (its cache, graphs and compiled layer) instead of growing it.
    `branches`: chains a sequence drafts, the r-th from the head's rank-r first token (greedy; a drafter with
    `drafts_from_rank`); each takes a row of every buffer and a drafter slot."""

    def __init__(
        self,
        target: Target,
        drafter=None,
        *,
        steps: int = 4,
        sampling: Sampling | None = None,
        graphs: bool = True,
        compile_layers: bool | None = None,
        progress: bool = False,
        accept_log: Any = None,
        timing: bool = False,
        prefill_chunk: int | None = None,
        rivals: bool = True,
        columns: int = 0,
        branches: int = 1,
    ):
        check_taps(target, drafter)
        if branches < 1 or branches > MAX_BRANCHES:
            raise ValueError(f"branches = {branches}: 1 .. {MAX_BRANCHES}")
        if branches > 1:
            if drafter is None or not getattr(drafter, "drafts_from_rank", False):
                raise ValueError(f"branches = {branches} needs a drafter whose first step can take another rank than "
                                 "its best (the reference, the PyTorch port, or the runtime opened with first_ranks); "
                                 "this drafter drafts chains only: use branches = 1")
        self.branches = branches
        self.target = target
        self.min_columns = columns
        self.prefill_chunk = prefill_chunk
        self.rivals = rivals
        self.drafter = drafter
        self.steps = steps if drafter is not None else 0
        self.sampling = sampling or Sampling()
        self._check_greedy()
        self.graphs = graphs and target.device.type == "cuda"
        # Inductor's fused layer is about twice as fast in a graph as the eager ops (BENCHMARKS.md); on a CPU
        # compiling would cost more than it saves in a test.
        self.compile_layers = target.device.type == "cuda" if compile_layers is None else compile_layers
        self.progress = progress
        self.accept_log = accept_log
        self.timing = timing
        self._shape: _Shape | None = None

    def _check_greedy(self) -> None:
        if self.branches > 1 and not self.sampling.greedy:
            raise ValueError(f"branches = {self.branches} is greedy only: the sampled rule keeps one chain")

    # --- the pieces of a round -------------------------------------------------------------------------

    def _draft(self, sh: _Shape) -> None:
        ranks = sh.ranks if sh.branches > 1 else None
        if hasattr(self.drafter, "draft_into"):
            self.drafter.draft_into(sh.slot_ids, sh.S, sh.drafts, first_ranks=ranks)
        elif ranks is not None:
            sh.drafts.copy_(self.drafter.draft(range(sh.B), sh.S, first_ranks=ranks))
        else:
            sh.drafts.copy_(self.drafter.draft(range(sh.B), sh.S))

    def _verify(self, sh: _Shape) -> None:
        tokens = torch.cat([sh.last[:, None], sh.drafts.long()], dim=1)
        positions = sh.pos[:, None] + torch.arange(sh.q, device=sh.pos.device)
        logits, taps = sh.static.forward(tokens, positions)
        sh.logits.copy_(logits)
        sh.taps.copy_(taps)

    def _accept(self, sh: _Shape, generator) -> None:
        drafts = sh.drafts.long()
        if self.sampling.greedy:
            kept, nxt = accept_greedy(drafts, sh.logits)
        else:
            probs = target_probs(sh.logits, self.sampling)
            u_accept = torch.rand(sh.B, sh.S, device=probs.device, generator=generator)
            u_sample = 1.0 - torch.rand(sh.B, device=probs.device, generator=generator)
            kept, nxt = accept_sampled_fixed(drafts, probs, u_accept, u_sample)
        active = sh.produced < sh.max_new
        emitted = torch.cat([drafts, torch.zeros(sh.B, 1, dtype=drafts.dtype, device=drafts.device)], dim=1)
        emitted.scatter_(1, kept[:, None], nxt[:, None])
        take = self._winners(sh, kept) if sh.branches > 1 else None
        if take is not None:
            kept, nxt, emitted = kept[take], nxt[take], emitted[take]
        sh.emitted.copy_(emitted)
        parts = [kept[:, None], emitted]
        if sh.rivals:
            ids, gaps = _rivals(sh.logits)
            if take is not None:
                ids, gaps = ids[take], gaps[take]
            parts += [ids.flatten(1), gaps.flatten(1)]
        torch.cat([t.double() for t in parts], dim=1, out=sh.report)
        step = (kept + 1) * active
        sh.pos.add_(step)
        sh.produced.add_(step)
        sh.last.copy_(torch.where(active, nxt, sh.last))
        if sh.copied is not None:
            sh.report_host.copy_(sh.report, non_blocking=True)
        else:
            sh.report_host.copy_(sh.report)

    @staticmethod
    def _winners(sh: _Shape, kept: torch.Tensor) -> torch.Tensor:
        """Per row, the row of its sequence that kept the most drafts (the lowest rank at a tie); its taps and
        its cache columns of this round are copied over the sequence's other rows, so that they extend and
        attend what the winner verified."""
        k = sh.branches
        groups = sh.B // k
        best = kept.view(groups, k).argmax(1)  # the first of equal maxima
        take = (torch.arange(groups, device=kept.device) * k + best).repeat_interleave(k)
        sh.taps.copy_(sh.taps[take])
        rows = torch.arange(sh.B, device=kept.device)[:, None]
        columns = sh.pos[:, None] + torch.arange(sh.q, device=kept.device)  # a sequence's rows share positions
        for cache in (sh.static.keys, sh.static.values):
            cache[:, rows, :, columns] = cache[:, take[:, None], :, columns]
        return take

    def _extend(self, sh: _Shape, active: list[int], first: list[int], counts: list[int]) -> None:
        if not active:
            return
        taps = sh.taps.view(sh.B * sh.q, -1)
        tokens = sh.emitted.view(sh.B * sh.q)
        starts = [b * sh.q for b in active]
        if hasattr(self.drafter, "extend_batch"):
            self.drafter.extend_batch(active, first, counts, taps, tokens, starts)
        else:
            self.drafter.extend(
                [(b, p, taps[s : s + n], tokens[s : s + n]) for b, p, n, s in zip(active, first, counts, starts)]
            )

    # --- graphs ------------------------------------------------------------------------------------------

    def _capture(self, sh: _Shape, name: str, fn) -> None:
        """Runs fn once eagerly on a side stream (allocator warm-up, and compilation where asked), then
        records it into a graph of its own, replayed by _run. The eager run changes state (the cache, the
        positions): the caller restores what it must."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        sh.graphs[name] = graph

    def _prepare_graphs(self, sh: _Shape) -> None:
        """Captures the round's graphs of this shape: the state they touch is saved and put back, so that
        capture has no effect on the run."""
        saved = [t.clone() for t in (sh.last, sh.pos, sh.produced, sh.static.keys, sh.static.values)]
        if self.drafter is not None and getattr(self.drafter, "capturable", False):
            self._capture(sh, "draft", lambda: self._draft(sh))
        self._capture(sh, "verify", lambda: self._verify(sh))
        self._capture(sh, "accept", lambda: self._accept(sh, None))
        for t, s in zip((sh.last, sh.pos, sh.produced, sh.static.keys, sh.static.values), saved):
            t.copy_(s)
        torch.cuda.synchronize()

    def _run(self, sh: _Shape, name: str, fn) -> None:
        graph = sh.graphs.get(name)
        if graph is not None:
            graph.replay()
        else:
            fn()

    # --- generate ----------------------------------------------------------------------------------------

    def _shape_for(self, B: int, columns: int) -> _Shape:
        sh = self._shape
        if sh is None or (sh.B, sh.S) != (B, self.steps) or sh.columns < columns:
            self._shape = None  # the old cache and graphs go first: they may be large
            sh = self._shape = _Shape(self.target, B, self.steps, columns, self.compile_layers, self.rivals, self.branches)
        return sh

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> Result:
        """Exactly max_new_tokens new tokens per prompt (end-of-text does not stop a sequence, so that runs
        compare token for token)."""
        if len(prompts) == 0 or max_new_tokens < 1 or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one non-empty prompt and max_new_tokens >= 1")
        k = self.branches
        if k == 1:
            return self._generate(prompts, max_new_tokens)
        self._check_greedy()  # again: `sampling` may have been set since
        slots = getattr(self.drafter, "max_slots", None)
        if slots is not None and len(prompts) * k > slots:
            raise ValueError(f"{len(prompts)} sequences x {k} branches take {len(prompts) * k} drafter slots; "
                             f"the drafter has {slots}")
        # A sequence's rows stay equal but for their drafts: its first row speaks for it.
        rows = self._generate([p for p in prompts for _ in range(k)], max_new_tokens, primary=k)
        rows.tokens, rows.rivals, rows.accepted_by_sequence = rows.tokens[::k], rows.rivals[::k], rows.accepted_by_sequence[::k]
        return rows

    def _generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, primary: int = 1) -> Result:
        """generate over rows; the round's counts come from every `primary`-th row alone."""
        dev, B, S = self.target.device, len(prompts), self.steps
        needed = max(len(p) for p in prompts) + max_new_tokens + 2 * S  # the module docstring says why
        columns = -(-max(needed, self.min_columns) // COLUMN_STEP) * COLUMN_STEP
        sh = self._shape_for(B, columns)
        if self.graphs and not sh.graphs:
            sh.max_new.fill_(0)  # nothing is active while capturing
            self._prepare_graphs(sh)
        generator = None
        if self.graphs:
            torch.cuda.manual_seed(self.sampling.seed)  # captured graphs draw from the default generator
        else:
            generator = torch.Generator(device=dev)
            generator.manual_seed(self.sampling.seed)
        result = Result([[] for _ in prompts], [[] for _ in prompts], S, asked=[0] * S, kept=[0] * S)
        result.accepted_by_sequence = [[] for _ in prompts]
        packed_rivals: list[list[tuple[list[float], int]]] = [[] for _ in prompts]
        cuda = self.target.device.type == "cuda"
        clock = _RoundClock(cuda) if self.timing or not cuda else None
        self._sync()
        start = time.perf_counter()
        if self.drafter is not None:
            for slot in range(B):
                self.drafter.reset(slot)
        self._prefill(sh, prompts, generator, result)
        sh.max_new.fill_(max_new_tokens)
        pos_host = [len(p) for p in prompts]
        result.prefill_seconds = time.perf_counter() - start

        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=B // primary * max_new_tokens, unit="tok", desc="decode", file=sys.stderr, initial=B // primary)
        report = sh.report_host.numpy()
        q = S + 1
        mark = clock.mark if clock is not None else (lambda i: None)
        while min(len(t) for t in result.tokens) < max_new_tokens:
            mark(0)
            if S:
                self._run(sh, "draft", lambda: self._draft(sh))
            mark(1)
            self._run(sh, "verify", lambda: self._verify(sh))
            mark(2)
            self._run(sh, "accept", lambda: self._accept(sh, generator))
            mark(3)
            if sh.copied is not None:
                sh.copied.record()
                sh.copied.synchronize()
            active, first, counts = [], [], []
            for b in range(B):
                if len(result.tokens[b]) >= max_new_tokens:
                    continue
                row = report[b]
                k = int(row[0])
                active.append(b)
                first.append(pos_host[b])
                counts.append(k + 1)
                pos_host[b] += k + 1
                result.tokens[b] += [int(t) for t in row[1 : 2 + k]]
                if sh.rivals:
                    packed_rivals[b].append((row[1 + q :].tolist(), k + 1))
                result.accepted_by_sequence[b].append(k)
                if b % primary:
                    continue
                result.accepted_per_round.append(k)
                for j in range(S):
                    result.asked[j] += 1
                    result.kept[j] += int(j < k)
            if self.drafter is not None:
                mark(4)
                self._extend(sh, active, first, counts)
                mark(5)
            if self.accept_log is not None and S:
                self.accept_log.record([c - 1 for b, c in zip(active, counts) if b % primary == 0], S)
            result.rounds += 1
            if clock is not None:
                clock.round_done()
            if bar is not None:
                bar.update(sum(min(c, max_new_tokens) for b, c in zip(active, counts) if b % primary == 0))
        if bar is not None:
            bar.close()
        self._sync()
        result.seconds = time.perf_counter() - start
        result.split = clock.split(result.seconds - result.prefill_seconds, result.rounds) if clock else {}
        result.draft_seconds = result.split.get("draft", 0.0) * result.rounds + result.split.get("extend", 0.0) * result.rounds
        result.tokens = [t[:max_new_tokens] for t in result.tokens]
        for b, rounds in enumerate(packed_rivals):
            for flat, n in rounds:
                result.rivals[b] += _rivals_of_row(flat, q)[:n]
        result.rivals = [r[:max_new_tokens] for r in result.rivals] if self.rivals else [[] for _ in prompts]
        return result

    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)

    def _prefill(self, sh: _Shape, prompts, generator, result: Result) -> None:
        """The prompts through the target (eagerly: their shapes vary; in chunks of prefill_chunk columns),
        every prompt row into the head, and each sequence's first new token; sets the device state the first
        round starts from."""
        dev, B = self.target.device, len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(max(len(p) for p in prompts))
        padded = torch.zeros(B, width, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            padded[b, : len(p)] = torch.tensor(list(p), dtype=torch.long)
        rows = torch.arange(B, device=dev)
        ends = lengths - 1
        end_logits = None
        # Row p carries the token that follows it: the prompt's next token, or (set below) the first new token.
        following = torch.cat([padded[:, 1:], torch.zeros(B, 1, dtype=torch.long, device=dev)], dim=1)
        chunk = self.prefill_chunk or width
        pieces = []
        for a in range(0, width, chunk):
            e = min(a + chunk, width)
            # Padding rows write columns past their sequence's end, which its first round writes again.
            positions = torch.arange(a, e, device=dev).expand(B, -1)
            logits, taps = sh.static.forward(padded[:, a:e], positions, compiled=False, logit_rows=(ends - a).clamp(0, e - a - 1))
            here = ((ends >= a) & (ends < e))[:, None]
            end_logits = logits if end_logits is None else torch.where(here, logits, end_logits)
            pieces.append((a, e, taps))
        if self.sampling.greedy:
            first = end_logits.argmax(-1)
        else:
            u = 1.0 - torch.rand(B, device=dev, generator=generator)
            first = sample_from(target_probs(end_logits, self.sampling), u)
        ids, gaps = _rivals(end_logits)
        for b, (tok, i, g) in enumerate(zip(first.tolist(), ids.tolist(), gaps.tolist())):
            result.tokens[b].append(int(tok))
            result.rivals[b].append(_as_rivals(i, g))
        if self.drafter is not None:
            following[rows, ends] = first
            for a, e, taps in pieces:
                self.drafter.extend(
                    [(b, a, taps[b, : min(e, len(p)) - a], following[b, a : min(e, len(p))]) for b, p in enumerate(prompts) if len(p) > a]
                )
        sh.last.copy_(first)
        sh.pos.copy_(lengths)
        sh.produced.fill_(1)


class _RoundClock:
    """Marks at the borders of a round's pieces (0..5: draft, verify, accept, host, extend), read after the
    run: the time of each piece per round and the rest of the round's wall time. On a GPU (with timing) the
    marks are CUDA events, so a piece is its device time and the rest is host time the device did not cover;
    on a CPU they are the host's clock, where every piece is host time."""

    PIECES = {"draft": (0, 1), "verify": (1, 2), "accept": (2, 3), "extend": (4, 5)}

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.rounds: list[dict[int, Any]] = []
        self._now: dict[int, Any] = {}

    def mark(self, i: int) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._now[i] = e
        else:
            self._now[i] = time.perf_counter()

    def round_done(self) -> None:
        self.rounds.append(self._now)
        self._now = {}

    def _span(self, r: dict, a: int, b: int) -> float:
        return r[a].elapsed_time(r[b]) / 1e3 if self.cuda else r[b] - r[a]

    def split(self, loop_seconds: float, rounds: int) -> dict[str, float]:
        """Seconds per round: each piece, `round` (the loop's wall time / rounds) and `host` (round minus
        the pieces)."""
        if not self.rounds:
            return {}
        out = {}
        for name, (a, b) in self.PIECES.items():
            spans = [self._span(r, a, b) for r in self.rounds if a in r and b in r]
            if spans:
                out[name] = sum(spans) / len(self.rounds)
        out["round"] = loop_seconds / max(rounds, 1)
        out["host"] = max(0.0, out["round"] - sum(out[n] for n in self.PIECES if n in out))
        return out



LOOPS = ("captured", "eager")


def make_decoder(loop: str, target: Target, drafter=None, **options):
    """'captured' (tfe.captured.CapturedDecoder: fixed shapes, CUDA graphs on a GPU; the default of every
    command) or 'eager' (Decoder: transformers' own cache and forward, one call at a time)."""
    if loop == "captured":
        return CapturedDecoder(target, drafter, **options)
    if loop == "eager":
        return Decoder(target, drafter, **options)
    raise ValueError(f"unknown loop {loop!r} ({', '.join(LOOPS)})")
