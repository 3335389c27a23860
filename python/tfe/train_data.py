"""The training data of tfe-train-head: the target's own answers to requests of every class, within a bound.

- sources: tfe.prompts' training split (templated prompts of ten classes), human conversations
  (chitchat-dataset, where installed), requests the target first writes itself (self-instruct: about the
  training subjects and, with `self_subjects`, subjects it lists itself first, which also fill the prose,
  science and role-play templates: source "named"), questions it lists itself (`self_questions`: source
  "questions"), and chunks
  of the standard library's sources; held out: tfe.prompts.evaluation_prompts and held-out conversations.
- answers: one greedy and `sampled_answers` sampled (temperature 0.8, top-p 0.95), as EAGLE-3 regenerates
  its data with the target, so the head learns the target's own continuations. They are written in batches of
  `gen_batch` through tfe.captured's loop with drafts off (the target's forward over a static cache, one CUDA
  graph a token), or transformers' generate (`data_loop`). The phase stops at its bound between batches
  (greedy answers of every source first, then the sampled rounds) and says what it made.
- `Settings`: what a training run uses, its data and its training (tfe.train_head reads the rest).
- `save_data` / `load_data`: the phase's sequences as one file, so that runs compare training settings on
  the same data.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import random
import time
from dataclasses import asdict, dataclass

import torch

from . import prompts as prompt_sets
from .captured import CapturedDecoder
from .outputs import write_atomic
from .speculative import Sampling, left_padded
from .target import Target


@dataclass
class Settings:
    """What a run uses; the defaults are the GPU run, `smoke()` the CPU run of a few minutes."""

    minutes: float = 10.0  # data + training
    data_share: float = 0.3  # the data phase's bound, a share of `minutes` (2.9M tokens took under 144 s on an H100)
    prompts_per_class: int = 300  # templated training prompts of each class (fewer where a class has fewer)
    self_instruct: int = 4000  # requests the target writes itself
    self_subjects: int = 600  # lists of subjects (about ten each) the target writes first: templated prompts and requests about them
    self_questions: int = 1000  # lists of users' questions (about ten each) the target writes: each a training prompt
    list_tokens: int = 96  # the most one of those lists may take
    # More conversations or sampled answers than these crowd the classes out of the data phase's bound and
    # cost held-out acceptance (BENCHMARKS.md): the loop drafts greedy answers to requests of every class.
    chitchat: int = 1000  # human conversations
    sampled_answers: int = 1  # per prompt, beside the greedy one
    answer_tokens: int = 256
    request_tokens: int = 96  # self-instruct: the most a request the target writes may take
    stdlib_chunks: int = 600
    eval_per_class: int = 3  # held-out prompts of each class (tfe.prompts.evaluation_prompts)
    eval_chitchat: int = 30  # held-out conversations: scored apart from the classes (`held_out_agreement`)
    eval_new_tokens: int = 128  # the simulated loop's new tokens a held-out prompt, as tfe-speedup --acceptance's
    eval_points: int = 8  # held-out evaluations, spread over the training time
    fit_per_class: int = 6  # training answers of each class scored beside the held-out ones (train_eval.training_sample)
    seq_len: int = 512  # at most the head's window + 1, so that training attends what a draft attends
    draft_vocab: int = 16384  # 0.98 of held-out answers' tokens (8192: 0.96; the loop counts the rest as misses)
    ttt_steps: int = 7
    ffn: int = 0  # the head's MLP width; 0: the target's (its intermediate_size)
    batch: int = 16  # packed rows an update
    # "channel": fc trains on the taps scaled to unit RMS per channel (Eagle3Head.set_tap_scale); "none": as they are
    tap_scale: str = "channel"
    lr: float = 6e-4
    warmup: float = 0.03
    label_top: int = 64
    cache_gib: float = 48.0
    max_updates: int = 1_000_000
    min_updates: int = 1  # even where the data phase took the whole budget
    gen_batch: int = 512  # 21k answer tokens/s on an H100 (256 with a larger cache: 18k)
    data_loop: str = "captured"  # "captured" (tfe.captured, drafts off) or "generate" (transformers')
    # The training step through torch.compile in this mode ("default", "reduce-overhead": also CUDA graphs,
    # "max-autotune"); "": eager. Its first update compiles it.
    compile: str = "default"
    seed: int = 0

    @staticmethod
    def smoke() -> "Settings":
        return Settings(
            minutes=1.5,
            data_share=0.7,
            prompts_per_class=1,
            self_instruct=1,
            self_subjects=1,
            self_questions=1,
            list_tokens=24,
            chitchat=1,
            sampled_answers=1,
            answer_tokens=12,
            request_tokens=16,
            stdlib_chunks=4,
            eval_per_class=1,
            eval_chitchat=1,
            eval_points=2,
            fit_per_class=1,
            seq_len=96,
            draft_vocab=2048,
            ttt_steps=3,
            batch=4,
            tap_scale="channel",  # the smoke run covers the scale's fold
            compile="",  # compiling costs a CPU more than the smoke run's 20 updates; a test compares the two steps
            lr=1e-3,
            label_top=16,
            cache_gib=1.0,
            max_updates=20,
            min_updates=20,  # the same head on a slow machine as on a fast one: the tests compare its drafts
            gen_batch=16,
        )


@dataclass
class Sequence:
    ids: list[int]
    scored_from: int  # predictions at positions >= scored_from - 1 are scored (the answer, or all text)
    cls: str
    source: str  # template, self-instruct, chitchat, stdlib


def prompt_limit(settings: Settings) -> int:
    """The longest training prompt answered: a longer one leaves its answer at most 8 tokens of a sequence."""
    return settings.seq_len - 9


def encode(target: Target, p: prompt_sets.Prompt) -> list[int]:
    """A prompt with its earlier turns in the model's chat template, ready for the assistant's answer."""
    if not p.history:
        return target.encode_chat(p.text)
    messages = [{"role": r, "content": t} for r, t in p.history] + [{"role": "user", "content": p.text}]
    ids = target.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class DataClock:
    """The data phase's bound: past a generate call's first batch (so that every source and round has some),
    a batch starts only if one more like the last still fits. The last, not the slowest: a loop's first
    batch also captures and compiles it, and batches are otherwise alike (gen_batch prompts, the same
    answer length)."""

    def __init__(self, seconds: float):
        self.start, self.seconds, self.last, self.stopped = time.perf_counter(), seconds, 0.0, 0

    def allows(self) -> bool:
        return time.perf_counter() - self.start + self.last <= self.seconds

    def took(self, seconds: float) -> None:
        self.last = seconds


def generate(
    target: Target, jobs: list, settings: Settings, clock: DataClock | None, log, *, tokens: int, sample: bool, seed: int = 0,
    loops: dict | None = None,
):
    """The target's continuations of jobs [(prompt ids, anything)], gen_batch at a time: a list of (prompt
    ids, anything, answer ids) in order, each answer cut after its first end-of-text, shorter where the clock
    stopped it. Sampled: temperature 0.8, top-p 0.95, batches drawn from seed + their first index. `loops`
    keeps the captured loops (a greedy and a sampled one) from call to call: make_data passes one for the
    phase, so that each is captured and compiled once."""
    run = _batches(target, settings, tokens, sample, seed, loops)
    eos = target.tokenizer.eos_token_id
    out = []
    for a in range(0, len(jobs), settings.gen_batch):
        if a > 0 and clock is not None and not clock.allows():
            clock.stopped += len(jobs) - a
            break
        t0 = time.perf_counter()
        group = jobs[a : a + settings.gen_batch]
        for (p, tag), answer in zip(group, run([p for p, _ in group], a)):
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            out.append((p, tag, answer))
        if clock is not None:
            clock.took(time.perf_counter() - t0)
        log(f"generated {len(out)}/{len(jobs)} ({'sampled' if sample else 'greedy'}, {time.perf_counter() - t0:.1f} s a batch)")
    return out


def _batches(target: Target, settings: Settings, tokens: int, sample: bool, seed: int, loops: dict | None):
    """run(prompts, first index) -> their answers, through settings.data_loop."""
    if settings.data_loop == "captured":
        sampling = Sampling(temperature=0.8, top_p=0.95) if sample else Sampling()
        return _captured_batches(target, settings, tokens, sampling, seed, {} if loops is None else loops)
    return _hf_batches(target, tokens, sample)


def _captured_batches(target: Target, settings: Settings, tokens: int, sampling: Sampling, seed: int, loops: dict):
    """Batches through tfe.captured's loop with drafts off: the target's forward over a static cache,
    replayed as a CUDA graph a token (on a GPU). Every batch has gen_batch rows (a short last one is
    filled with copies of its first prompt) and the cache is sized for the longest prompt a row can hold
    and the longest answer, so that one shape, captured and compiled once, serves the whole phase."""
    key = "greedy" if sampling.greedy else "sampled"  # their accept graphs differ
    if key not in loops:
        # Room for the longest prompt answered and the longest answer: every column past what a row reaches is
        # still read by each step's attention.
        columns = prompt_limit(settings) + max(settings.answer_tokens, settings.request_tokens, settings.list_tokens) + 1
        loops[key] = CapturedDecoder(target, sampling=sampling, rivals=False, columns=columns)
    decoder = loops[key]

    def run(prompts: list[list[int]], first_index: int) -> list[list[int]]:
        n = len(prompts)
        prompts = prompts + [prompts[0]] * (settings.gen_batch - n)
        decoder.sampling = Sampling(sampling.temperature, sampling.top_p, seed=seed + first_index)
        return decoder.generate(prompts, tokens).tokens[:n]

    return run


def _hf_batches(target: Target, tokens: int, sample: bool):
    """Batches through transformers' generate (left-padded, its dynamic cache): the slower way, kept as
    the comparison point for the captured loop's data."""
    tok = target.tokenizer
    sampling = dict(do_sample=True, temperature=0.8, top_p=0.95) if sample else dict(do_sample=False)

    def run(prompts: list[list[int]], first_index: int) -> list[list[int]]:
        ids, mask = left_padded(target, prompts)
        with torch.inference_mode():
            done = target.model.generate(ids, attention_mask=mask, max_new_tokens=tokens, pad_token_id=tok.eos_token_id, **sampling)
        width = ids.shape[1]
        return [done[i, width:].tolist() for i in range(len(prompts))]

    return run


def listed_by_target(target: Target, settings: Settings, clock: DataClock, log, loops: dict, asks: list[prompt_sets.Prompt],
                     clean, what: str, seed: int) -> list[str]:
    """The items of the lists the target writes for `asks` (sampled, at most list_tokens each), through
    `clean`, without repeats (ignoring case), in the order listed."""
    jobs = [(target.encode_chat(p.text), p.cls) for p in asks]
    eos = target.tokenizer.eos_token_id
    listed: dict[str, str] = {}
    for _, _, answer in generate(target, jobs, settings, clock, log, tokens=settings.list_tokens, sample=True, seed=seed, loops=loops):
        text = target.tokenizer.decode(answer, skip_special_tokens=True)
        for item in prompt_sets.listed_items(text, complete=bool(answer) and answer[-1] == eos):
            kept = clean(item)
            if kept:
                listed.setdefault(kept.lower(), kept)
    log(f"{what}: the target listed {len(listed)} distinct in {len(asks)} lists")
    return list(listed.values())


def self_instruct_prompts(target: Target, settings: Settings, clock: DataClock, log, loops: dict,
                          subjects: list[str] = ()) -> list[prompt_sets.Prompt]:
    """Requests the target writes itself (sampled, at most request_tokens) about the training subjects and
    `subjects`, kept where they read as a request."""
    asks = prompt_sets.self_instruct_requests(settings.self_instruct, settings.seed, subjects)
    jobs = [(target.encode_chat(p.text), p.cls) for p in asks]
    out = []
    for _, cls, answer in generate(target, jobs, settings, clock, log, tokens=settings.request_tokens, sample=True, seed=settings.seed, loops=loops):
        text = target.tokenizer.decode(answer, skip_special_tokens=True).strip().strip('"').strip()
        if len(text) >= 12:
            out.append(prompt_sets.Prompt(cls, text))
    return out


def stdlib_text(target: Target, settings: Settings) -> list[Sequence]:
    """Chunks of seq_len tokens from the training split's standard-library sources, files in a fixed
    shuffled order."""
    files = prompt_sets.stdlib_files("train")
    random.Random(settings.seed).shuffle(files)
    out: list[Sequence] = []
    for path in files:
        if len(out) >= settings.stdlib_chunks:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        for a in range(0, max(len(ids) - settings.seq_len // 2, 1), settings.seq_len):
            out.append(Sequence(ids[a : a + settings.seq_len], 0, "stdlib", "stdlib"))
            if len(out) >= settings.stdlib_chunks:
                break
    return out


def held_out_data(target: Target, settings: Settings, log, loops: dict | None = None) -> tuple[list[Sequence], str | None]:
    """The held-out sequences: the target's greedy answers to the evaluation prompts (source "template") and
    to held-out conversations (source "chitchat"); and why the conversations are missing, or None."""
    held = [(p, "template") for p in prompt_sets.evaluation_prompts(per_class=settings.eval_per_class)]
    talks, why = prompt_sets.chitchat_prompts(settings.eval_chitchat, settings.seed, split="eval")
    held += [(p, "chitchat") for p in talks]
    if why:
        log(f"chitchat: {why}; its conversations are left out")
    jobs = [(encode(target, p), (p.cls, src)) for p, src in held]
    evaluation = [
        Sequence((p + a)[: settings.seq_len], len(p), cls, src)
        for p, (cls, src), a in generate(target, jobs, settings, None, log, tokens=settings.answer_tokens, sample=False, loops=loops)
    ]
    return evaluation, why


def make_data(target: Target, settings: Settings, log, profiler=None) -> tuple[list[Sequence], list[Sequence], dict]:
    """(training sequences, held-out sequences, the phase's report), within the data bound. `profiler`
    (tfe.train_head.profiled): one more greedy batch of the first answers runs under it, outside the bound,
    and its report goes to the log: where a step of the answers' loop goes."""
    clock = DataClock(settings.minutes * 60 * settings.data_share)
    report: dict = {}
    loops: dict = {}  # the captured loops (greedy, sampled), kept for the phase
    # Held-out first: every figure needs it, and it is small.
    evaluation, why = held_out_data(target, settings, log, loops)
    if why:
        report["chitchat"] = why
    # Training prompts: templated, conversations, then the target's own requests.
    sources = {"template": prompt_sets.training_prompts(settings.prompts_per_class, settings.seed)}
    sources["chitchat"], _ = prompt_sets.chitchat_prompts(settings.chitchat, settings.seed, split="train")
    subjects = listed_by_target(target, settings, clock, log, loops, prompt_sets.subject_requests(settings.self_subjects, settings.seed),
                                prompt_sets.clean_subject, "subjects", settings.seed + 1) if settings.self_subjects else []
    questions = listed_by_target(target, settings, clock, log, loops, prompt_sets.question_requests(settings.self_questions, settings.seed),
                                 prompt_sets.clean_question, "questions", settings.seed + 2) if settings.self_questions else []
    report["listed_subjects"], report["listed_questions"] = len(subjects), len(questions)
    sources["named"] = prompt_sets.subject_prompts(subjects, settings.seed)
    sources["questions"] = [prompt_sets.Prompt("chat", q) for q in questions]
    sources["self-instruct"] = self_instruct_prompts(target, settings, clock, log, loops, subjects)
    rng = random.Random(settings.seed)
    prompts = [(p, src) for src, ps in sources.items() for p in ps]
    rng.shuffle(prompts)
    jobs = [(encode(target, p), (p.cls, src)) for p, src in prompts]
    jobs = [j for j in jobs if len(j[0]) <= prompt_limit(settings)]
    report["prompts"] = {src: len(ps) for src, ps in sources.items()}
    if profiler is not None and jobs:
        batch = [p for p, _ in jobs[: settings.gen_batch]]
        run = _batches(target, settings, settings.answer_tokens, False, 0, loops)
        t = time.perf_counter()
        run(batch, 0)  # captured and compiled before the profile (the held-out answers have done it already)
        log(profiler(lambda: run(batch, 0), settings.answer_tokens, "a step of the greedy answers"))
        clock.start += time.perf_counter() - t
    made = []
    t0 = time.perf_counter()
    for round in range(1 + settings.sampled_answers):
        made += generate(target, jobs, settings, clock, log, tokens=settings.answer_tokens, sample=round > 0,
                         seed=settings.seed + (round << 20), loops=loops)
    answer_tokens = sum(len(a) for _, _, a in made)
    rate = answer_tokens / max(time.perf_counter() - t0, 1e-9)
    log(f"answers: {len(made)} of {len(jobs) * (1 + settings.sampled_answers)}, {answer_tokens} tokens, "
        f"{rate:.0f} tokens/s ({settings.data_loop}, batches of {settings.gen_batch})")
    loops.clear()  # their caches and graphs: the training's taps and labels take the memory next
    if target.device.type == "cuda":
        torch.cuda.empty_cache()
    seqs = [Sequence((p + a)[: settings.seq_len], len(p), cls, src) for p, (cls, src), a in made]
    seqs += stdlib_text(target, settings)
    seqs = [s for s in seqs if len(s.ids) >= 4]
    report.update(
        {
            "answers": len(made),
            "answer_tokens": answer_tokens,
            "answer_tokens_per_second": rate,
            "answers_asked": len(jobs) * (1 + settings.sampled_answers),
            "answers_left_at_the_bound": clock.stopped,
            "sequences_by_source": {s: sum(q.source == s for q in seqs) for s in sorted({q.source for q in seqs})},
            "sequences_by_class": {c: sum(q.cls == c for q in seqs) for c in sorted({q.cls for q in seqs})},
            "held_out_sequences": len(evaluation),
            "bound_seconds": clock.seconds,
        }
    )
    return seqs, evaluation, report


DATA_FORMAT = "tfe-train-head data 1"


def save_data(path: pathlib.Path, seqs: list[Sequence], evaluation: list[Sequence], report: dict, settings: Settings) -> None:
    """The data phase's sequences and report as one JSON file, for `load_data`; gzip-compressed where the
    name ends in .gz (about a third of the size: small enough to travel beside a head)."""
    out = {"format": DATA_FORMAT, "seq_len": settings.seq_len, "report": report,
           "training": [asdict(q) for q in seqs], "held_out": [asdict(q) for q in evaluation]}
    text = json.dumps(out, separators=(",", ":")) + "\n"
    write_atomic(path, gzip.compress(text.encode(), mtime=0) if path.suffix == ".gz" else text)


def load_data(path: pathlib.Path, settings: Settings) -> tuple[list[Sequence], list[Sequence], dict]:
    """What `save_data` wrote: (training sequences, held-out sequences, the report of the run that made
    them); refused where the file is another kind or was made for other rows."""
    try:
        raw = path.read_bytes()
        got = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"--data {path}: cannot be read as training data ({e})") from None
    if not isinstance(got, dict) or got.get("format") != DATA_FORMAT:
        raise ValueError(f"--data {path}: not a file tfe-train-head wrote (format {DATA_FORMAT!r})")
    if got["seq_len"] != settings.seq_len:
        raise ValueError(f"--data {path}: made for rows of {got['seq_len']} tokens, this run packs {settings.seq_len}")
    return [Sequence(**q) for q in got["training"]], [Sequence(**q) for q in got["held_out"]], got["report"]
