"""Exactness checks of the speculative loop on the real target, and its sampled distribution.

Greedy: every run's token ids must equal the target's own greedy decoding (the loop with drafts off, one
sequence at a time), which must itself equal transformers' `generate`:
    drafts off, 4 sequences together     (4 equals 1)
    drafts on, 1 sequence and 4 together (drafts on equal drafts off; 4 equal 1)
    drafts on, the prompt in two pieces  (a prompt extended in two pieces equals the whole)
In fp32 a difference fails. In bf16 the target's own logits round differently for different batch shapes
and row counts, so a run may leave the reference where the target's top logits nearly tie. Each difference
is listed where it starts with the two tokens and how far each lies below the other in the other's logits,
and it passes only as a near-tie flip: the run's token is among the reference's next best there (Result's
rivals), the reference's token among the run's, and neither lies more than `--bf16-tie` below (default
1.0 logit; bf16's spacing at this target's logits, 16 to 40, is 0.125 to 0.25, and two forward paths over
the same tokens differ by up to about 0.75 in a logit). A wrong token from a fault in the loop has no
reason to be such a pair.

Sampled: the first two new tokens of one prompt, drawn many times by the loop with drafts on, against the
target's exact distribution of those two tokens (temperature, top-p), by a chi-square test.

`tfe-check-exact --head HEAD.tfe` runs them and writes a JSON report; tests/target uses the same functions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

import torch

from . import prompts as prompt_sets
from .captured import LOOPS, make_decoder
from .outputs import check_output_file, write_atomic
from .speculative import (Drafter, Result, Sampling, check_common_arguments, hf_greedy, make_drafter, read_taps,
                          target_probs, token_sha256)
from .target import Target, load_target


@dataclass
class Difference:
    run: str
    sequence: int
    index: int  # the first new token that differs
    reference_token: int
    run_token: int
    margin: float  # the reference's top-1 minus top-2 logit there
    below: float  # how far the run's token lies below the reference's top in the reference's logits (nan: not a rival)
    run_below: float  # how far the reference's token lies below the run's top in the run's logits (nan: not a rival)

    def near_tie(self, tie: float) -> bool:
        return self.below <= tie and self.run_below <= tie  # false where either is nan

    def __str__(self) -> str:
        def gap(x: float) -> str:
            return "not among the next best" if x != x else f"{x:.4g} below"

        return (
            f"{self.run}: sequence {self.sequence} differs from token {self.index} "
            f"({self.reference_token} -> {self.run_token}; the run's token {gap(self.below)} in the reference, "
            f"the reference's {gap(self.run_below)} in the run; target margin {self.margin:.4g})"
        )


@dataclass
class GreedyReport:
    dtype: str
    runs: dict[str, list[str]] = field(default_factory=dict)  # run -> sha256 per sequence
    differences: list[Difference] = field(default_factory=list)
    accept: dict[str, dict] = field(default_factory=dict)
    speed: dict[str, dict] = field(default_factory=dict)  # run -> new tokens, seconds, tokens/s

    def failures(self, tie: float | None) -> list[Difference]:
        """Every difference in fp32 (tie None); in bf16 those that are not a near-tie flip."""
        return [d for d in self.differences if tie is None or not d.near_tie(tie)]


def run_speed(results: list[Result]) -> dict:
    """New tokens, seconds and tokens/s over the generate calls of one run (one per sequence, or one)."""
    tokens = sum(r.new_tokens for r in results)
    seconds = sum(r.seconds for r in results)
    return {"new_tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else 0.0}


def _sequences(results: list[Result]) -> list[tuple[list[int], list[float], list]]:
    """(tokens, margins, rivals) of every sequence of the results, in order."""
    return [s for r in results for s in zip(r.tokens, r.margins, r.rivals)]


def _below(rivals: list[tuple[int, float]], token: int) -> float:
    return next((gap for t, gap in rivals if t == token), float("nan"))


def _compare(name: str, results: list[Result], reference: list[Result], report: GreedyReport) -> None:
    """Each sequence of `results` against the one-sequence reference run of the same prompt."""
    run = _sequences(results)
    report.runs[name] = [token_sha256(tokens) for tokens, _, _ in run]
    for i, ((tokens, _, rivals), ref) in enumerate(zip(run, _sequences(reference))):
        want, want_margins, want_rivals = ref
        if len(tokens) != len(want):  # every run makes exactly max_new_tokens: a shorter one is a fault
            raise ValueError(f"{name}: sequence {i} has {len(tokens)} tokens, the reference {len(want)}")
        if tokens == want:
            continue
        at = next(j for j, (a, b) in enumerate(zip(tokens, want)) if a != b)
        a, b = want[at], tokens[at]
        report.differences.append(
            Difference(name, i, at, a, b, want_margins[at], _below(want_rivals[at], b), _below(rivals[at], a))
        )


def greedy_checks(
    target: Target,
    drafter: Drafter,
    *,
    prompts: list[list[int]],
    max_new_tokens: int,
    steps: int,
    with_hf: bool = True,
    loop: str = "captured",
    log=lambda message: None,
) -> GreedyReport:
    """The greedy runs above with `loop` (tfe.speculative.make_decoder), each compared with that loop's
    drafts-off run one sequence at a time; with the captured loop also the eager loop's drafts-off run of all
    prompts together (the two loops agree). `log` gets a line with each run's time."""
    report = GreedyReport(str(target.dtype).replace("torch.", ""))
    clock = time.perf_counter()

    def done(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        log(f"   {name}: {now - clock:.1f} s")
        clock = now

    def decoder(drafter=None, **options):
        return make_decoder(loop, target, drafter, **options)

    alone = [decoder().generate([p], max_new_tokens) for p in prompts]
    report.runs["drafts off, 1 sequence"] = [r.sha256(0) for r in alone]
    report.speed["drafts off, 1 sequence"] = run_speed(alone)
    done("drafts off, 1 sequence")
    if with_hf:
        _compare("transformers generate", [hf_greedy(target, p, max_new_tokens) for p in prompts], alone, report)
        done("transformers generate")
    off = decoder().generate(prompts, max_new_tokens)
    _compare("drafts off, 4 sequences", [off], alone, report)
    report.speed["drafts off, 4 sequences"] = run_speed([off])
    done("drafts off, 4 sequences")
    if loop != "eager":
        eager = make_decoder("eager", target).generate(prompts, max_new_tokens)
        _compare("eager loop, drafts off, 4 sequences", [eager], alone, report)
        done("eager loop, drafts off, 4 sequences")
    spec = decoder(drafter, steps=steps)
    ones = [spec.generate([p], max_new_tokens) for p in prompts]
    _compare("drafts on, 1 sequence", ones, alone, report)
    report.speed["drafts on, 1 sequence"] = run_speed(ones)
    done("drafts on, 1 sequence")
    four = spec.generate(prompts, max_new_tokens)
    _compare("drafts on, 4 sequences", [four], alone, report)
    report.speed["drafts on, 4 sequences"] = run_speed([four])
    report.accept["drafts on, 4 sequences"] = four.accept_log()
    done("drafts on, 4 sequences")
    pieces = [
        decoder(drafter, steps=steps, prefill_chunk=(len(p) + 1) // 2).generate([p], max_new_tokens)
        for p in prompts
    ]
    _compare("drafts on, prompt in two pieces", pieces, alone, report)
    done("drafts on, prompt in two pieces")
    return report


def exact_two_token_distribution(target: Target, prompt: list[int], sampling: Sampling) -> dict[tuple[int, int], float]:
    """P(first two new tokens) of the target under `sampling`, by enumerating the first token's support."""
    dev = target.device
    ids = torch.tensor([prompt], device=dev)
    with torch.inference_mode():
        p1 = target_probs(target.model(input_ids=ids).logits[0, -1], sampling)
        support = p1.nonzero().flatten()
        both = torch.cat([ids.expand(len(support), -1), support[:, None]], dim=1)
        p2 = target_probs(target.model(input_ids=both).logits[:, -1], sampling)
    out = {}
    for i, t1 in enumerate(support.tolist()):
        for t2 in p2[i].nonzero().flatten().tolist():
            out[(t1, t2)] = float(p1[t1] * p2[i, t2])
    return out


def chi_square(counts: dict, expected: dict[tuple, float], samples: int, min_expected: float = 5.0):
    """(statistic, degrees of freedom, p-value) over cells expected >= min_expected times, the rest lumped."""
    big = [c for c, p in expected.items() if p * samples >= min_expected]
    cells = [(counts.get(c, 0), expected[c] * samples) for c in big]
    rest_obs = samples - sum(o for o, _ in cells)
    rest_exp = samples - sum(e for _, e in cells)
    if rest_exp >= min_expected:
        cells.append((rest_obs, rest_exp))
    elif rest_obs > 0 and rest_exp > 0:
        cells[-1] = (cells[-1][0] + rest_obs, cells[-1][1] + rest_exp)
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = max(len(cells) - 1, 1)
    p = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, dof, p


def sampled_check(
    target: Target,
    drafter: Drafter,
    *,
    prompt: list[int],
    samples: int,
    steps: int,
    sampling: Sampling,
    batch: int = 16,
    loop: str = "captured",
    progress: bool = False,
) -> dict:
    """Draws `samples` two-token continuations with drafts on and tests them against the exact distribution.
    `progress`: a bar on stderr, and the expected duration once the first batch is timed."""
    expected = exact_two_token_distribution(target, prompt, sampling)
    counts: dict[tuple[int, int], int] = {}
    drawn = 0
    seed = sampling.seed
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=samples, unit="draw", desc="sampled", file=sys.stderr)
    start = time.perf_counter()
    while drawn < samples:
        n = min(batch, samples - drawn)
        run = make_decoder(loop, target, drafter, steps=steps, sampling=Sampling(sampling.temperature, sampling.top_p, seed))
        for toks in run.generate([prompt] * n, 2).tokens:
            counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
        if bar is not None:
            if drawn == 0:
                each = (time.perf_counter() - start) / n
                bar.write(f"sampled: {samples} draws, about {each * samples / 60:.1f} min at this pace")
            bar.update(n)
        drawn += n
        seed += 1
    if bar is not None:
        bar.close()
    stat, dof, p = chi_square(counts, expected, samples)
    outside = sum(c for k, c in counts.items() if k not in expected)
    return {"samples": samples, "cells": len(expected), "chi2": stat, "dof": dof, "p_value": p, "outside_support": outside}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="tfe-check-exact",
        description="Greedy exactness (drafts on = drafts off = transformers, 4 sequences = 1, two-piece prompt = "
        "whole) and the sampled distribution test, on SmolLM2-135M-Instruct with an EAGLE-3 head.",
    )
    ap.add_argument("--head", required=True, help="the .tfe head")
    ap.add_argument("--drafter", choices=["reference", "runtime"], help="default: runtime on a GPU, else reference")
    ap.add_argument("--artifact", help="tfe-plan compile's deploy directory for the runtime")
    ap.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="repeatable; default float32 (and bfloat16 on a GPU)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--bf16-tie", type=float, default=1.0,
                    help="bf16: a difference must start where each token lies at most this below the other (logits)")
    ap.add_argument("--samples", type=int, default=None,
                    help="draws for the sampled test (0: skip it; default 2000 on a GPU, 300 on a CPU: a CPU draws about "
                    "2-4 a second with 16 a batch)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--device", default=None)
    ap.add_argument("--gguf")
    ap.add_argument("--loop", choices=LOOPS, default="captured", help="the loop checked (default captured)")
    ap.add_argument("-o", "--out", help="write the report here (JSON)")
    a = ap.parse_args(argv)
    check_common_arguments(ap, a)  # before the target loads
    if a.out:
        try:
            check_output_file(a.out, "--out", inputs=[a.head, a.gguf])
        except ValueError as e:
            ap.error(str(e))
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.samples is None:
        a.samples = 2000 if device.startswith("cuda") else 300
    if a.samples < 0:
        ap.error(f"--samples {a.samples}: must be >= 0")
    if a.drafter == "runtime" and not device.startswith("cuda"):
        ap.error("--drafter runtime needs a CUDA GPU; on a CPU use --drafter reference")
    dtypes = a.dtype or (["float32", "bfloat16"] if device.startswith("cuda") else ["float32"])
    taps = read_taps(ap, a.head)  # the last check: it reads the file
    kind = a.drafter or ("runtime" if device.startswith("cuda") else "reference")
    texts = [p.text for p in prompt_sets.evaluation_prompts()[:4]]  # prose, code, tool call, chat
    report: dict = {"head": a.head, "drafter": kind, "loop": a.loop, "steps": a.steps, "max_new_tokens": a.max_new_tokens, "greedy": {}}
    ok = True
    for name in dtypes:
        t0 = time.perf_counter()
        target = load_target(a.gguf, device=device, dtype=getattr(torch, name), tap_layers=taps)
        drafter = make_drafter(kind, a.head, max_slots=16, max_steps=max(8, a.steps), artifact=a.artifact)
        prompts = [target.encode_chat(t) for t in texts]
        print(f"== greedy, {name}: target loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        g = greedy_checks(
            target, drafter, prompts=prompts, max_new_tokens=a.max_new_tokens, steps=a.steps, loop=a.loop,
            log=lambda m: print(m, flush=True),
        )
        tie = None if name == "float32" else a.bf16_tie
        failures = g.failures(tie)
        ok &= not failures
        report["greedy"][name] = {
            "sha256": g.runs,
            "differences": [vars(d) for d in g.differences],
            "failures": [vars(d) for d in failures],
            "accept": g.accept,
        }
        print(f"== greedy, {name}: {len(g.differences)} difference(s), {len(failures)} failing")
        for d in g.differences:
            print(f"   {d}{'  FAIL' if d in failures else ''}")
        for run, shas in g.runs.items():
            print(f"   {run:34s} " + " ".join(s[:12] for s in shas))
        if a.samples and name == dtypes[0]:
            t0 = time.perf_counter()
            s = sampled_check(
                target,
                drafter,
                prompt=prompts[3],
                samples=a.samples,
                steps=a.steps,
                sampling=Sampling(a.temperature, a.top_p, 1),
                loop=a.loop,
                progress=True,
            )
            report["sampled"] = s
            ok &= s["p_value"] > 1e-3 and s["outside_support"] == 0
            print(f"== sampled ({name}): chi2 {s['chi2']:.1f} on {s['dof']} dof, p = {s['p_value']:.3g}, "
                  f"{s['outside_support']} draws outside the support ({time.perf_counter() - t0:.1f} s)", flush=True)
        del target, drafter
    report["passed"] = bool(ok)
    if a.out:
        write_atomic(a.out, json.dumps(report, indent=1))
    print("exactness: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
