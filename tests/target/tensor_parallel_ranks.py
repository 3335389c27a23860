"""One rank of tests/target/test_tensor_parallel.py, under torchrun with 2 processes on the CPUs (gloo).

Loads the split target once and runs tfe.tensor_parallel's checks twice:
  reference   the command as it runs: the CPU reference with the smoke-trained head drafts on rank 0
  oracle      rank 0 drafts the target's own greedy continuation with one draft a round made wrong, at a
              position that cycles with the round and the slot: every count of kept drafts, 0 .. S, occurs,
              and sequences of one batch keep different counts. A smoke head keeps few drafts; this makes
              the checks depend on every rank verifying rank 0's drafts (a rank verifying other tokens would
              change the logits of accepted rows through the all-reduce).
Each writes its report (JSON) to --out-dir; the exit status is non-zero where a check failed. (A rank that
received other drafts than rank 0's makes this fail: the ranks then keep different counts, fall out of step
and their next collective times out.) The process ends through tfe.tensor_parallel.exit_rank, as the
command does.
"""

import argparse
import os

import torch

from tfe import prompts as prompt_sets
from tfe import tensor_parallel as tp
from tfe.speculative import Decoder


class OracleDrafter:
    """Drafts from the known greedy sequences (prompt + new tokens), recognised by the tokens extended so far."""

    ring_rows = 1 << 20

    def __init__(self, sequences: list[list[int]], vocab: int):
        self.sequences = sequences
        self.vocab = vocab
        self.seen: dict[int, list[int]] = {}  # per slot: seen[i] is the token at position i + 1
        self.round = 0

    def reset(self, slot: int) -> None:
        self.seen[slot] = []

    def extend(self, requests) -> None:
        for slot, pos, _taps, tokens in requests:
            del self.seen[slot][pos:]
            self.seen[slot] += tokens.tolist()

    def draft(self, slots, steps: int) -> torch.Tensor:
        out = []
        for slot in slots:
            seen = self.seen[slot]
            match = [s for s in self.sequences if s[1 : 1 + len(seen)] == seen]
            if len(match) != 1:
                raise RuntimeError(f"slot {slot}: the extended tokens match {len(match)} known sequences, not 1")
            drafts = (match[0][1 + len(seen) : 1 + len(seen) + steps] + [0] * steps)[:steps]
            wrong = (self.round + slot) % (steps + 1)
            if wrong < steps:
                drafts[wrong] = (drafts[wrong] + 1) % self.vocab
            out.append(drafts)
        self.round += 1
        return torch.tensor(out, dtype=torch.long)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head", required=True)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out-dir", required=True)
    args = p.parse_args()
    common = ["--head", args.head, "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps)]
    rank, world, dev = tp.init_ranks("cpu", timeout=120.0)  # ranks out of step fail, not hang
    try:
        target = tp.load_split_target(world=world, dtype=torch.float32)
        a = tp.parse_args(common + ["-o", os.path.join(args.out_dir, "reference.json")])
        failed = tp.run(a, rank, world, dev, target=target)

        prompts = [target.encode_chat(q.text) for q in prompt_sets.evaluation_prompts()[:4]]
        longer = args.max_new_tokens + args.steps + 1  # drafts reach past the last token kept
        sequences = [p + Decoder(target).generate([p], longer).tokens[0] for p in prompts]  # every rank
        oracle = OracleDrafter(sequences, target.vocab) if rank == 0 else None
        a = tp.parse_args(common + ["-o", os.path.join(args.out_dir, "oracle.json")])
        failed |= tp.run(a, rank, world, dev, target=target, head=oracle)
    finally:
        torch.distributed.destroy_process_group()
    tp.exit_rank(int(failed))


if __name__ == "__main__":
    main()
