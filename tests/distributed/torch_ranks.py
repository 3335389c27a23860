"""Drafts to every rank from Python, with torch.distributed (NCCL) as engines use it.

Run with one process per GPU: torchrun --nproc-per-node 2 tests/distributed/torch_ranks.py [--rounds N]
Rank 0 opens a tfe.Runtime on a random tiny head; per round it extends with CUDA tensors, drafts
(draft_async) and sends; the other ranks only receive. torch.distributed hands rank 0's NCCL unique id to
every rank, and all_gather then checks that every rank holds rank 0's tokens and confidences, round after
round. Exits non-zero on any mismatch; prints one line per rank.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist

import tfe


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    box = [tfe.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    stream = torch.cuda.current_stream()
    bc = tfe.DraftBroadcast(box[0], world, rank, max_streams=16, max_steps=args.steps, device=rank, timeout=30.0)
    gen = torch.Generator(device="cuda").manual_seed(7)
    rt = None
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            head = tfe.random_head("tiny", os.path.join(tmp, "tiny.tfe"), seed=3)
            rt = tfe.Runtime(head, stream=stream, buckets=[1, 4, 16], max_steps=args.steps, max_slots=16)
        h = rt.header
        width = len(h["taps"]) * h["target_hidden"]
        next_pos = [0] * args.slots

        def rows(n):
            taps = (torch.randn((n, width), device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
            tokens = torch.randint(0, h["vocab"], (n,), device="cuda", dtype=torch.int32, generator=gen)
            return taps, tokens

        def extend(n_of):
            for s in range(args.slots):
                n = n_of(s)
                rt.extend(s, next_pos[s], *rows(n))
                next_pos[s] += n

        extend(lambda s: 3 + s)
        ids = torch.arange(args.slots, dtype=torch.int32, device="cuda")
    mismatches = 0
    for round_ in range(args.rounds):
        if rank == 0:
            rt.draft_async(ids, args.steps, stream=stream)
            tokens, confs = bc.send(rt, stream=stream)
        else:
            tokens, confs = bc.receive(args.slots, args.steps, stream=stream)
        mine = torch.cat([torch.from_dlpack(tokens).float().flatten(), torch.from_dlpack(confs).flatten()])
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        mismatches += sum(not torch.equal(everyone[0], e) for e in everyone[1:])
        if rank == 0:
            extend(lambda s: 1 + (round_ + s) % 3)
    bc.wait(stream=stream)
    print(f"rank {rank} of {world}: {args.rounds} rounds, {mismatches} rounds differing from rank 0", flush=True)
    dist.destroy_process_group()
    raise SystemExit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
