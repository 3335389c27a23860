"""The Python package `tfe` (python/): head files, the deploy calls against tfe-plan, the CPU reference
against `tfe-plan reference` vectors, every refusal, and, where there is one, the GPU runtime.

Runs on the CPU; what needs torch, a GPU or the safetensors package skips, saying which.
"""

import ast
import ctypes
import json
import os
import pathlib
import subprocess
import time

import numpy as np
import pytest

import tfe

try:
    import safetensors
except ImportError:  # pragma: no cover - depends on the machine
    safetensors = None

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

needs_safetensors = pytest.mark.skipif(safetensors is None, reason="the safetensors package is not installed")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
has_gpu = tfe.cuda_device_count() > 0
needs_gpu = pytest.mark.skipif(not has_gpu, reason="no CUDA device")
needs_torch_cuda = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available(), reason="torch with a CUDA device is not available"
)


def tfe_plan(*args):
    """Runs the packaged tfe-plan; returns its stdout."""
    done = subprocess.run([tfe.tfe_plan_executable(), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, f"tfe-plan {' '.join(map(str, args))} failed:\n{done.stderr}"
    return done.stdout


def read_safetensors(path):
    """name -> numpy array; BF16 as uint16 bits (numpy has no bf16)."""
    dtypes = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "F8_E4M3": np.uint8, "I64": np.int64}
    with open(path, "rb") as f:
        raw = f.read()
    return {
        name: np.frombuffer(bytes(t["data"]), dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        for name, t in safetensors.deserialize(raw)
    }


@pytest.fixture(scope="session")
def heads(tmp_path_factory):
    """Random heads by (preset, fp8), each made once."""
    root = tmp_path_factory.mktemp("heads")
    made = {}

    def get(preset="tiny", fp8=False):
        key = (preset, fp8)
        if key not in made:
            made[key] = tfe.random_head(preset, root / f"{preset}{'-fp8' if fp8 else ''}.tfe", seed=11, fp8=fp8)
        return made[key]

    return get


def row_width(header):
    return len(header["taps"]) * header["target_hidden"]


def random_rows(header, rows, seed):
    """bf16 bits of taps near unit size, and tokens in the vocabulary."""
    rng = np.random.default_rng(seed)
    taps = rng.standard_normal((rows, row_width(header)), dtype=np.float32)
    bits = (taps.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16 value
    tokens = rng.integers(0, header["vocab"], rows, dtype=np.int32)
    return bits, tokens


# ------------------------------------------------------------------------------------------------ package


def test_version_and_names():
    assert tfe.__version__.count(".") == 2
    assert {"tiny", "tiny-two-stage", "llama3-8b-eagle3", "tfe-two-stage"} <= set(tfe.presets())
    assert issubclass(tfe.Error, ValueError)
    assert issubclass(tfe.CudaError, RuntimeError)
    assert not issubclass(tfe.CudaError, ValueError)


def test_stub_lists_exactly_the_module():
    """The .pyi shipped with the package names every public name of the extension, and no other."""
    stub = pathlib.Path(tfe.__file__).with_name("_tfe.pyi")
    assert stub.exists(), f"{stub} is not installed with the package"
    assert pathlib.Path(tfe.__file__).with_name("py.typed").exists()
    tree = ast.parse(stub.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
    declared = {n for n in declared if not n.startswith("_") or n == "__version__"}
    public = {n for n in dir(tfe._tfe) if not n.startswith("_") or n == "__version__"}
    assert declared == public


def test_the_calls_of_a_slot_are_typed_and_documented():
    """help() on the extend / draft / reset calls shows typed arguments (not nanobind's `object | None` for
    an untyped handle) and what the call does; Runtime shows max_slots and max_steps by name."""
    for cls in (tfe.Reference, tfe.Runtime):
        for name in ("extend", "extend_batch", "draft", "reset"):
            doc = getattr(cls, name).__doc__
            signature, _, text = doc.partition("\n")
            assert "object | None" not in signature, (cls, name, signature)
            assert text.strip(), (cls, name, "no docstring")
        assert "steps: int" in cls.draft.__doc__ and "slot: int" in cls.reset.__doc__
    init = tfe.Runtime.__init__.__doc__
    assert "max_slots: int" in init and "max_steps: int" in init


def test_tfe_plan_entry_point():
    assert "random" in tfe_plan("--help")


# ----------------------------------------------------------------------------------------------- head files


def test_head_file_inspection(heads):
    head = heads("tiny")
    h = head.header
    assert h == tfe.Preset("tiny").header
    assert h["head_type"] == "dense" and h["fp8"] == []
    assert len(head.header_sha256) == 64
    assert head.metadata["tfe.header"] == json.dumps(json.loads(head.metadata["tfe.header"]), separators=(",", ":"))
    names = [t.name for t in head.tensors]
    assert {"fc", "embed", "wq", "lm_head", "d2t"} <= set(names)
    info = {t.name: t for t in head.tensors}
    assert info["fc"].dtype == "BF16" and info["fc"].shape == (h["hidden"], row_width(h))
    assert info["d2t"].dtype == "I32" and info["d2t"].shape == (h["draft_vocab"],)
    assert info["fc"].nbytes == 2 * h["hidden"] * row_width(h)
    assert len(head) == len(names) and "fc" in head and "nothing" not in head
    fc = head.tensor("fc")
    assert fc.dtype == np.uint16 and fc.shape == info["fc"].shape and not fc.flags.writeable
    d2t = head.tensor("d2t")
    targets = d2t + np.arange(h["draft_vocab"])
    assert targets.min() >= 0 and targets.max() < h["vocab"]
    assert tfe.HeadFile(head.path, verify=True).header_sha256 == head.header_sha256


def test_head_file_fp8_forms(heads):
    head = heads("tiny-two-stage", fp8=True)
    assert head.header["head_type"] == "two_stage"
    assert set(head.header["fp8"]) >= {"wq", "lr_a", "target_head"}
    assert head.tensor("wq.fp8").dtype == np.uint8
    assert head.tensor("wq.scale").dtype == np.float32


@needs_safetensors
def test_head_tensors_equal_what_safetensors_reads(heads):
    head = heads("tiny", fp8=True)
    ours = {t.name: head.tensor(t.name) for t in head.tensors}
    theirs = read_safetensors(head.path)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name


def test_head_file_refusals(tmp_path, heads):
    with pytest.raises(tfe.Error, match="missing.tfe"):
        tfe.HeadFile(tmp_path / "missing.tfe")
    bad = tmp_path / "bad.tfe"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError):
        tfe.HeadFile(bad)
    with pytest.raises(TypeError, match="path"):
        tfe.HeadFile(3)
    with pytest.raises(tfe.Error, match="nothing"):
        heads("tiny").tensor("nothing")


def test_random_head_equals_the_cli(tmp_path):
    ours = tfe.random_head("tiny-two-stage", tmp_path / "a.tfe", seed=5, fp8=True)
    tfe_plan("random", "--preset", "tiny-two-stage", "--seed", 5, "--fp8", "-o", tmp_path / "b.tfe")
    assert (tmp_path / "a.tfe").read_bytes() == (tmp_path / "b.tfe").read_bytes()
    assert ours.header["name"] == "tiny-two-stage"
    with pytest.raises(tfe.Error, match="nope"):
        tfe.random_head("nope", tmp_path / "c.tfe")
    with pytest.raises(tfe.Error, match="exactly one"):
        tfe.random_head(None, tmp_path / "c.tfe")
    with pytest.raises(tfe.Error, match="seed"):
        tfe.random_head("tiny", tmp_path / "c.tfe", seed=-1)
    with pytest.raises(tfe.Error, match=r"threads = -5 is outside 0\.\.1024"):
        tfe.random_head("tiny", tmp_path / "c.tfe", threads=-5)
    with pytest.raises(tfe.Error, match=r"out: .* holds a NUL byte"):
        tfe.random_head("tiny", f"{tmp_path}/c\0.tfe")
    assert not (tmp_path / "c.tfe").exists()


def test_random_head_from_a_config(tmp_path):
    # The header section of a dumped plan is a config `random` takes.
    import re

    text = tfe.plan_yaml(tfe.Preset("tiny"))
    block = re.search(r"^  header:\n((?:    .*\n)+)", text, re.M)
    assert block, "no header block in the plan"
    config = tmp_path / "header.yaml"
    config.write_text("\n".join(line[4:] for line in block.group(1).splitlines()) + "\n")
    head = tfe.random_head(None, tmp_path / "c.tfe", config=config, seed=3)
    assert head.header == tfe.Preset("tiny").header
    # The output rule: never the config it reads, a device, a FIFO or a directory; each left as it was.
    before = config.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, message in [
        (config, r"out .*header\.yaml: is the command's input"),
        ("/dev/null", r"out /dev/null: is a character device"),
        (fifo, r"is a FIFO"),
        (tmp_path, r"is a directory"),
    ]:
        with pytest.raises(tfe.Error, match=message):
            tfe.random_head(None, out, config=config, seed=3)
    assert config.read_bytes() == before
    assert fifo.is_fifo() and pathlib.Path("/dev/null").is_char_device()


def write_eagle3_checkpoint(directory, **config_overrides):
    """A tiny EAGLE-3 checkpoint in the Hugging Face layout (F32 tensors, which convert rounds to bf16)."""
    H, nh, nkv, hd, F, V, Vd = 64, 4, 2, 16, 128, 256, 64
    rng = np.random.default_rng(2)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": H,
        "intermediate_size": F,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "vocab_size": V,
        "draft_vocab_size": Vd,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},
    }
    config.update(config_overrides)
    shapes = {
        "fc.weight": (H, 3 * H),
        "embed_tokens.weight": (V, H),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, nh * hd),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (F, H),
        "midlayer.mlp.up_proj.weight": (F, H),
        "midlayer.mlp.down_proj.weight": (H, F),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
    }
    tensors = {}
    for name, shape in shapes.items():
        values = rng.standard_normal(shape).astype(np.float32)
        tensors[name] = (1 + 0.05 * values if len(shape) == 1 else values / np.sqrt(shape[-1])).astype(np.float32)
    targets = np.sort(rng.choice(V, Vd, replace=False))
    tensors["d2t"] = (targets - np.arange(Vd)).astype(np.int64)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


@needs_safetensors
def test_convert_equals_the_cli(tmp_path):
    ckpt = write_eagle3_checkpoint(tmp_path / "eagle3")
    head = tfe.convert(ckpt, tmp_path / "a.tfe", window=64, fp8=True)
    tfe_plan("convert", ckpt, "--window", 64, "--fp8", "-o", tmp_path / "b.tfe")
    assert (tmp_path / "a.tfe").read_bytes() == (tmp_path / "b.tfe").read_bytes()
    h = head.header
    assert (h["hidden"], h["window"], [t["layer"] for t in h["taps"]]) == (64, 64, [2, 4, 6])
    assert h["rope"]["llama3"] is True


@needs_safetensors
def test_convert_refusals(tmp_path):
    ckpt = write_eagle3_checkpoint(tmp_path / "eagle3", norm_before_residual=True)
    with pytest.raises(tfe.Error, match="norm_before_residual"):
        tfe.convert(ckpt, tmp_path / "a.tfe")
    with pytest.raises(tfe.Error, match="window"):
        tfe.convert(write_eagle3_checkpoint(tmp_path / "ok"), tmp_path / "a.tfe", window=0)
    assert not (tmp_path / "a.tfe").exists()
    # Its own checkpoint's file as the output: refused before the conversion, the file as it was.
    weights = tmp_path / "ok" / "model.safetensors"
    before = weights.read_bytes()
    with pytest.raises(tfe.Error, match=r"convert: out .*model\.safetensors: is the command's input"):
        tfe.convert(tmp_path / "ok", weights)
    assert weights.read_bytes() == before


@needs_safetensors
def test_convert_warns_of_positions_past_the_window(tmp_path):
    ckpt = write_eagle3_checkpoint(tmp_path / "long", max_position_embeddings=2048)
    with pytest.warns(UserWarning, match="max_position_embeddings = 2048, but the window is 64 rows"):
        tfe.convert(ckpt, tmp_path / "a.tfe", window=64)
    assert (tmp_path / "a.tfe").exists()
    done = subprocess.run([tfe.tfe_plan_executable(), "convert", str(ckpt), "--window", "64", "-o",
                           str(tmp_path / "b.tfe")], capture_output=True, text=True)
    assert done.returncode == 0 and "warning: " in done.stderr and "max_position_embeddings = 2048" in done.stderr


# ------------------------------------------------------------------------------------------- plans, compile


def test_plan_options_fields():
    o = tfe.PlanOptions()
    d = o.to_dict()
    assert d["buckets"] == [1, 2, 4, 8, 16] and d["max_steps"] == 8 and d["fp8"] == "auto" and d["arch"] == "sm_90"
    assert set(d) == set(tfe.plan_option_names())
    p = tfe.PlanOptions(buckets=[1, 4], max_steps=4, fp8="off", max_slots=8, extend_rows=64, attention_split="same_drafts")
    assert (p.buckets, p.max_steps, p.fp8, p.max_slots, p.extend_rows, p.attention_split) == (
        [1, 4], 4, "off", 8, 64, "same_drafts")
    assert p == o.replace(**{k: v for k, v in p.to_dict().items()}) and p != o
    p.max_steps = 6
    assert p.max_steps == 6
    assert "max_steps=6" in repr(p)
    assert not o.first_ranks and tfe.PlanOptions(first_ranks=True).first_ranks


def test_first_ranks_plans_ranked_and_refuses_two_stage():
    yaml = tfe.plan_yaml(tfe.Preset("tiny"), first_ranks=True, buckets=[1, 2], max_steps=2)
    assert "first_ranks: true" in yaml and "s1.ranked" in yaml and "host_ranks" in yaml
    assert "s2.ranked" not in yaml and "s2.top1" in yaml
    assert yaml == tfe_plan("dump", "--preset", "tiny", "--first-ranks", "--buckets", "1,2", "--max-steps", 2)
    with pytest.raises(tfe.Error, match="first_ranks is on, but a two_stage head drafts its best token only"):
        tfe.plan_yaml(tfe.Preset("tiny-two-stage"), first_ranks=True)
    with pytest.raises(TypeError, match="first_ranks"):
        tfe.PlanOptions(first_ranks="yes")


def test_plan_options_refusals():
    with pytest.raises(tfe.Error, match="max_steps = 0"):
        tfe.PlanOptions(max_steps=0)
    with pytest.raises(tfe.Error, match="buckets"):
        tfe.PlanOptions(buckets=[4, 2])
    with pytest.raises(tfe.Error, match="fp8.*maybe"):
        tfe.PlanOptions(fp8="maybe")
    with pytest.raises(TypeError, match="max_stepz"):
        tfe.PlanOptions(max_stepz=3)
    with pytest.raises(TypeError, match="max_steps"):
        tfe.PlanOptions(max_steps="8")
    with pytest.raises(TypeError, match="attention_split"):
        tfe.PlanOptions(attention_split=1)
    with pytest.raises(tfe.Error, match="attention split `sometimes`"):
        tfe.PlanOptions(attention_split="sometimes")
    with pytest.raises(TypeError, match="tiled_weights"):
        tfe.PlanOptions(tiled_weights=False)  # tuning is not a plan option
    with pytest.raises(tfe.Error, match="max_slots"):
        tfe.PlanOptions(max_slots=2**40)


def test_plan_yaml_equals_the_cli(heads, tmp_path):
    head = heads("tiny")
    args = ["--buckets", "1,2,4", "--max-steps", 4, "--fp8", "off", "--max-slots", 8, "--extend-rows", 64,
            "--attention-split", "same_drafts"]
    opts = dict(buckets=[1, 2, 4], max_steps=4, fp8="off", max_slots=8, extend_rows=64, attention_split="same_drafts")
    assert tfe.plan_yaml(head, **opts) == tfe_plan("dump", head.path, *args)
    assert tfe.plan_yaml(head.path, plan=tfe.PlanOptions(**opts)) == tfe_plan("dump", head.path, *args)
    assert tfe.plan_yaml(tfe.Preset("tiny-two-stage", fp8=True)) == tfe_plan(
        "dump", "--preset", "tiny-two-stage", "--preset-fp8"
    )
    with pytest.raises(tfe.Error, match="max_steps"):
        tfe.plan_yaml(head, max_steps=17)
    with pytest.raises(TypeError, match="head"):
        tfe.plan_yaml(42)
    with pytest.raises(tfe.Error, match="nope"):
        tfe.Preset("nope")


def test_compile_writes_the_artifact(heads, tmp_path):
    head = heads("tiny")
    lines = []
    s = tfe.compile(head, tmp_path / "deploy", buckets=[1, 2], max_steps=2, fp8="off", progress=lines.append)
    assert s["specs"] > 0 and s["hits"] + s["misses"] == s["specs"] and len(lines) == s["specs"]
    manifest = json.loads((tmp_path / "deploy" / "manifest.json").read_text())
    assert manifest["arch"] == "sm_90"
    assert (tmp_path / "deploy" / "plan.yaml").read_text() == tfe.plan_yaml(head, buckets=[1, 2], max_steps=2, fp8="off")
    assert len(list((tmp_path / "deploy" / "kernels").glob("*.cubin"))) == s["specs"]
    # A trailing slash names the same folder, new or existing (the README's form).
    for _ in range(2):
        tfe.compile(head, f"{tmp_path / 'slash'}/", buckets=[1, 2], max_steps=2, fp8="off")
        assert json.loads((tmp_path / "slash" / "manifest.json").read_text()) == manifest
    # A folder that is not an artifact is refused before any kernel compiles, and keeps its files.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    seen = []
    with pytest.raises(tfe.Error, match=r"holds no manifest\.json"):
        tfe.compile(head, f"{tmp_path / 'mine'}/", buckets=[1, 2], max_steps=2, fp8="off", progress=seen.append)
    assert seen == [] and (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    # Verified on the CPU: every sha256, and the head it was compiled for.
    info = tfe.Artifact(tmp_path / "deploy").verify(head=head.path)
    assert info["kernels"] == s["specs"] and info["head_sha256"] == head.header_sha256
    with pytest.raises(tfe.Error, match="compiled for the head with sha256"):
        tfe.Artifact(tmp_path / "deploy").verify(head=heads("tiny-two-stage").path)
    cubin = sorted((tmp_path / "deploy" / "kernels").glob("*.cubin"))[0]
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 1
    cubin.write_bytes(bytes(data))
    with pytest.raises(tfe.Error, match=r"\.cubin has sha256 .*the manifest records"):
        tfe.Artifact(f"{tmp_path / 'deploy'}/").verify()


def test_compile_progress_error_is_raised(heads, tmp_path):
    def boom(line):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        tfe.compile(heads("tiny"), tmp_path / "deploy", buckets=[1], max_steps=1, progress=boom)
    with pytest.raises(TypeError, match="progress"):
        tfe.compile(heads("tiny"), tmp_path / "deploy", progress=3)


# ------------------------------------------------------------------------------------------- the reference


@pytest.mark.parametrize(
    "preset,fp8,mode", [("tiny", False, "auto"), ("tiny-two-stage", False, "auto"), ("tiny", True, "require"),
                        ("tiny-two-stage", True, "off")]
)
@needs_safetensors
def test_reference_equals_tfe_plan_reference(heads, tmp_path, preset, fp8, mode):
    """tfe.Reference, fed the CLI's own inputs, drafts the CLI's tokens and confidences bit for bit."""
    head = heads(preset, fp8)
    B, N, S = 3, 40, 4
    out = tmp_path / "vectors.safetensors"
    tfe_plan("reference", head.path, "--streams", B, "--rows", N, "--steps", S, "--seed", 9, "--fp8", mode, "-o", out)
    v = read_safetensors(out)
    ref = tfe.Reference(head, max_slots=B, max_steps=S, fp8=mode)
    assert ref.ring_rows < N  # the rows go in ring-sized chunks, several slots a call, as the CLI sends them
    for begin in range(0, N, ref.ring_rows):
        end = min(N, begin + ref.ring_rows)
        ref.extend([tfe.ExtendRequest(b, begin, v["taps"][b, begin:end], v["tokens"][b, begin:end]) for b in range(B)])
    d = ref.draft(list(range(B)), S)
    assert d.tokens.dtype == np.int32 and d.tokens.shape == (B, S)
    assert d.confidences.dtype == np.float32 and d.confidences.shape == (B, S)
    assert np.array_equal(d.tokens, v["draft_tokens"])
    assert np.array_equal(d.confidences.view(np.uint32), v["confidences"].view(np.uint32))


@pytest.fixture
def ref_setup(heads):
    """A reference with slots 0 and 1 extended, and the draft they give."""
    head = heads("tiny")
    h = head.header

    def make():
        ref = tfe.Reference(head, max_slots=4, max_steps=4)
        for slot in (0, 1):
            taps, tokens = random_rows(h, 6, seed=slot)
            ref.extend(slot, 0, taps, tokens)
        return ref

    baseline = make().draft([0, 1], 3)
    return make, h, baseline


def same_draft(a, b):
    return np.array_equal(a.tokens, b.tokens) and np.array_equal(a.confidences, b.confidences)


def test_reference_basic_calls(ref_setup):
    make, h, baseline = ref_setup
    ref = make()
    assert (ref.max_slots, ref.max_steps, ref.fp8) == (4, 4, "auto")
    assert ref.ring_rows == h["window"] + 1 + 4
    assert ref.header == h
    tokens, confidences = ref.draft([0, 1], 3)  # a DraftResult unpacks as a tuple
    assert np.array_equal(tokens, baseline.tokens)
    assert ((confidences > 0) & (confidences <= 1)).all()
    assert same_draft(ref.draft(np.array([0, 1], dtype=np.int64), 3), baseline)
    assert same_draft(ref.draft(range(2), 3), baseline)
    # Drafts do not move a slot: drafting again gives the same tokens.
    assert same_draft(ref.draft([0, 1], 3), baseline)
    # A continued extend moves slot 1 on; a reset empties it.
    taps, tokens = random_rows(h, 2, seed=7)
    ref.extend(1, 6, taps, tokens)
    assert not same_draft(ref.draft([0, 1], 3), baseline)
    ref.reset(1)
    with pytest.raises(tfe.Error, match="slot 1 is empty"):
        ref.draft([1], 1)


def test_reference_read_only_and_sliced_rows(ref_setup):
    """Read-only arrays and row slices (contiguous) are taken as they are."""
    make, h, baseline = ref_setup
    ref = make()
    taps, tokens = random_rows(h, 10, seed=3)
    taps.setflags(write=False)
    tokens.setflags(write=False)
    ref.extend(2, 100, taps[4:], tokens[4:])  # a slot may start at any position
    assert ref.draft([2], 2).tokens.shape == (1, 2)


def test_reference_extend_batch_equals_the_request_list(ref_setup, heads):
    """extend_batch over one pair of arrays (packed, or at given starts with rows between) drafts as the
    request list does; every refusal names its field and changes nothing."""
    make, h, baseline = ref_setup
    rows = [random_rows(h, 6, seed=slot) for slot in (0, 1)]
    taps = np.concatenate([r[0] for r in rows])
    tokens = np.concatenate([r[1] for r in rows])
    packed = tfe.Reference(heads("tiny"), max_slots=4, max_steps=4)
    packed.extend_batch([0, 1], [0, 0], [6, 6], taps, tokens)
    assert same_draft(packed.draft([0, 1], 3), baseline)
    # Parts of each slot's rows, in any order, with rows between them left out.
    spread = tfe.Reference(heads("tiny"), max_slots=4, max_steps=4)
    spread.extend_batch(np.array([1, 0]), [0, 0], [2, 3], taps, tokens, starts=[6, 0])
    spread.extend_batch([0, 1], [3, 2], [3, 4], taps, tokens, starts=[3, 8])
    assert same_draft(spread.draft([0, 1], 3), baseline)

    ref = make()
    for args, kwargs, message in [
        (([0], [0, 0], [1], taps, tokens), {}, "first_pos: 2 entries, but slots has 1"),
        (([0], [0], [1, 1], taps, tokens), {}, "counts: 2 entries, but slots has 1"),
        (([0], [0], [1], taps, tokens), {"starts": [0, 1]}, "starts: 2 entries, but slots has 1"),
        (([0], [0], [-1], taps, tokens), {}, r"counts\[0\]: -1 is outside 0\.\."),
        (([0], [0], [1], taps, tokens), {"starts": [-2]}, r"starts\[0\]: -2 is outside 0\.\."),
        (([0, 1], [6, 6], [6, 7], taps, tokens), {}, r"counts\[0\.\.1\] add up to 6 \+ 7 rows, past the 12 rows"),
        (([0], [6], [2], taps, tokens), {"starts": [11]}, r"starts\[0\] \+ counts\[0\] = 11 \+ 2, past the 12 rows"),
        (([0], [6], [1], taps, tokens[:5]), {}, "taps has 12 rows but tokens has 5 entries"),
        (([0], [6], [1], taps[:, :-1], tokens), {}, "taps: expected shape"),
        (([0], [6], [1], taps, tokens.astype(np.int64)), {}, "tokens: expected int32"),
        (([0], [6], [1], taps, tokens), {"starts": [np.float32(1)]}, "starts"),
        (([0, 0], [6, 6], [1, 1], taps, tokens), {}, "slot 0"),
        # Positions and counts at the integer limits: refused, never wrapped.
        (([0, 1], [0, 0], [6, 2**63 - 1], taps, tokens), {}, r"add up to 6 \+ 9223372036854775807 rows, past"),
        (([0], [6], [2**63 - 1], taps, tokens), {"starts": [1]}, r"= 1 \+ 9223372036854775807, past"),
        (([0], [6], [2**63], taps, tokens), {}, r"counts\[0\]: 9223372036854775808 is outside"),
        (([2], [2**63 - 1], [2], taps, tokens), {}, r"last position 9223372036854775807 \+ 1 exceeds"),
        (([2], [2**63 - 5], [8], taps, tokens), {}, r"last position 9223372036854775803 \+ 7 exceeds"),
        (([2], [2**31 - 1], [1], taps, tokens), {}, r"last position 2147483647 \+ 0 exceeds"),
        (([2], [-(2**63)], [1], taps, tokens), {}, r"first position -9223372036854775808 is negative"),
    ]:
        with pytest.raises((tfe.Error, TypeError), match=message):
            ref.extend_batch(*args, **kwargs)
    assert same_draft(ref.draft([0, 1], 3), baseline)


class FakeDeviceArray:
    """A DLPack producer that says its data lives on cuda:0 (the pointer is never read): the device
    refusal, tested without torch or a GPU."""

    class DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p),
            ("device_type", ctypes.c_int32),
            ("device_id", ctypes.c_int32),
            ("ndim", ctypes.c_int32),
            ("code", ctypes.c_uint8),
            ("bits", ctypes.c_uint8),
            ("lanes", ctypes.c_uint16),
            ("shape", ctypes.POINTER(ctypes.c_int64)),
            ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
        ]

    class DLManagedTensor(ctypes.Structure):
        pass

    DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    def __init__(self, shape, code, bits):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed = FakeDeviceArray.DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = 0x1000
        t.device_type, t.device_id = 2, 0  # kDLCUDA
        t.ndim = len(shape)
        t.code, t.bits, t.lanes = code, bits, 1
        t.shape = self.shape
        t.strides = None
        t.byte_offset = 0

    def __dlpack__(self, stream=None, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (2, 0)


def test_reference_refusals_change_nothing(ref_setup):
    """Every refused extend, draft and reset raises tfe.Error (a ValueError) naming what was wrong, and a
    draft afterwards equals the draft without the refused call."""
    make, h, baseline = ref_setup
    ref = make()
    W = row_width(h)
    taps, tokens = random_rows(h, 3, seed=5)
    wide = np.zeros((3, 2 * W), dtype=np.uint16)
    misaligned = np.zeros(16, dtype=np.uint8)[1:13].view(np.int32)  # 3 int32 at an odd address
    assert misaligned.ctypes.data % 4 != 0

    extend_cases = [
        # (slot, first_pos, taps, tokens), error type, message pattern
        ((0, 6, taps.astype(np.float32), tokens), tfe.Error, r"taps: expected bfloat16 .*got float32"),
        ((0, 6, taps.view(np.int16), tokens), tfe.Error, r"taps: expected bfloat16 .*got int16"),
        ((0, 6, taps[:, :-1], tokens), tfe.Error, rf"taps: expected shape \[rows, {W}\].*got \[3, {W - 1}\]"),
        ((0, 6, taps[0], tokens[:1]), tfe.Error, r"taps: expected 2 dimensions"),
        ((0, 6, wide[:, ::2], tokens), tfe.Error, r"taps: not C-contiguous"),
        ((0, 6, np.asfortranarray(taps), tokens), tfe.Error, r"taps: not C-contiguous"),
        ((0, 6, taps, tokens.astype(np.int64)), tfe.Error, r"tokens: expected int32, got int64"),
        ((0, 6, taps, tokens[:2]), tfe.Error, r"taps has 3 rows but tokens has 2"),
        ((0, 6, taps, tokens.reshape(3, 1)), tfe.Error, r"tokens: expected 1 dimension "),
        ((0, 6, taps, list(tokens)), tfe.Error, r"tokens: expected an array of int32.*got list"),
        ((0, 6, taps[:, None], tokens), tfe.Error, r"taps: expected 2 dimensions"),
        ((0, 6, taps, np.arange(6, dtype=np.int32)[::2]), tfe.Error, r"tokens: not C-contiguous"),
        ((0, 6, taps, misaligned), tfe.Error, r"tokens: its data .* not aligned"),
        ((0, 6, FakeDeviceArray((3, W), 4, 16), tokens), tfe.Error,
         r"taps: a tensor on cuda:0; extend takes host memory: pass a CPU tensor"),
        ((0, 6, taps, FakeDeviceArray((3,), 0, 32)), tfe.Error, r"tokens: a tensor on cuda:0"),
        ((99, 6, taps, tokens), tfe.Error, r"slot 99 is outside 0\.\.3"),
        ((-1, 6, taps, tokens), tfe.Error, r"slot -1 is outside"),
        ((2**40, 6, taps, tokens), tfe.Error, r"slot: 1099511627776 is outside"),
        ((0, 8, taps, tokens), tfe.Error, r"first position 8 does not continue the slot \(expected 6; a gap"),
        ((0, 5, taps, tokens), tfe.Error, r"expected 6; a step back"),
        ((0, 6, taps[:0], tokens[:0]), tfe.Error, r"a span of 0 rows"),
        ((0, 6, np.empty((0, W), np.uint16), np.empty(0, np.int32)), tfe.Error, r"a span of 0 rows"),
        ((0, 6, np.lib.stride_tricks.as_strided(taps, (0, W), (0, 0)), tokens[:0]), tfe.Error, r"a span of 0 rows"),
        ((0, 6, taps, np.array([1, h["vocab"], 2], dtype=np.int32)), tfe.Error,
         rf"tokens\[1\] = {h['vocab']} is outside \[0, {h['vocab']}\)"),
        ((0, 6, taps, np.array([1, -1, 2], dtype=np.int32)), tfe.Error, r"tokens\[1\] = -1"),
        (("0", 6, taps, tokens), TypeError, r"slot: expected an int, got str"),
        ((0, 6.0, taps, tokens), TypeError, r"first_pos: expected an int, got float"),
        ((True, 6, taps, tokens), TypeError, r"slot: expected an int, got bool"),
        # Positions at the integer limits: refused, never wrapped into a ring row.
        ((2, 2**63 - 1, taps[:2], tokens[:2]), tfe.Error, r"last position 9223372036854775807 \+ 1 exceeds"),
        ((2, 2**63 - 5, taps, tokens), tfe.Error, r"last position 9223372036854775803 \+ 2 exceeds"),
        ((2, 2**31 - 1, taps, tokens), tfe.Error, r"last position 2147483647 \+ 2 exceeds"),
        ((2, -(2**63), taps, tokens), tfe.Error, r"first position -9223372036854775808 is negative"),
        ((2, 2**63, taps, tokens), tfe.Error, r"first_pos: 9223372036854775808 is outside"),
        ((0, 2**63 - 1, taps, tokens), tfe.Error, r"exceeds"),
    ]
    for args, error, pattern in extend_cases:
        with pytest.raises(error, match=pattern):
            ref.extend(*args)
    # The list form names the request.
    good = tfe.ExtendRequest(0, 6, taps, tokens)
    list_cases = [
        ([good, (1, 6, taps.astype(np.float32), tokens)], r"requests\[1\]\.taps: expected bfloat16"),
        ([good, (0, 9, taps, tokens)], r"slot 0 appears in requests\[0\] and requests\[1\]"),
        ([good, (1, 7, taps, tokens)], r"extend of slot 1: first position 7 does not continue"),
        ([good, (3, 0, np.zeros((ref.ring_rows + 1, W), np.uint16), np.zeros(ref.ring_rows + 1, np.int32))],
         r"exceeds the ring"),
    ]
    for requests, pattern in list_cases:
        with pytest.raises(tfe.Error, match=pattern):
            ref.extend(requests)
    with pytest.raises(TypeError, match=r"requests\[0\]: expected a \(slot, first_pos, taps, tokens\) tuple, got 3"):
        ref.extend([(0, 6, taps)])
    with pytest.raises(TypeError, match=r"requests: expected a list"):
        ref.extend(taps)
    with pytest.raises(TypeError, match="give slot, first_pos, taps and tokens"):
        ref.extend(0, 6, taps)

    draft_cases = [
        (([0, 9], 3), tfe.Error, r"slot 9 is outside"),
        (([0, 2], 3), tfe.Error, r"slot 2 is empty"),
        (([0, 0], 3), tfe.Error, r"slot 0 appears twice"),
        (([], 3), tfe.Error, r"no slots given"),
        (([0], 0), tfe.Error, r"steps = 0 is outside 1\.\.4"),
        (([0], 5), tfe.Error, r"steps = 5 is outside 1\.\.4"),
        (([0, 1, 2, 3, 0], 1), tfe.Error, r"5 slots exceed"),
        ((np.array([0, 1], dtype=np.float32), 3), tfe.Error, r"slots: expected integers, got float32"),
        ((np.array([[0, 1]], dtype=np.int32), 3), tfe.Error, r"slots: expected 1 dimension "),
        ((FakeDeviceArray((2,), 0, 32), 3), tfe.Error, r"slots: a tensor on cuda:0"),
        (([0, "1"], 3), TypeError, r"slots\[1\]: expected an int, got str"),
        (([0, 2**33], 3), tfe.Error, r"slots\[1\]: 8589934592 is outside"),
        (("01", 3), tfe.Error, r"slots: expected an array"),
    ]
    for args, error, pattern in draft_cases:
        with pytest.raises(error, match=pattern):
            ref.draft(*args)
    with pytest.raises(tfe.Error, match="slot 7 is outside"):
        ref.reset(7)

    assert same_draft(ref.draft([0, 1], 3), baseline)
    # The refused calls left slot 0 at position 5: it continues at 6.
    ref.extend(good)
    assert not same_draft(ref.draft([0, 1], 3), baseline)


def test_reference_check_taps_refuses_non_finite_rows(ref_setup, heads):
    """check_taps: a NaN or infinite tap is refused naming slot, row and position, and changes nothing;
    off (the default), the row is taken."""
    make, h, baseline = ref_setup
    taps, tokens = random_rows(h, 3, seed=8)
    bad = taps.copy()
    bad[1, 5] = 0x7FC0  # bf16 NaN
    checked = tfe.Reference(heads("tiny"), max_slots=4, max_steps=4, check_taps=True)
    with pytest.raises(tfe.Error, match=r"extend of slot 2: taps row 1 \(position 41\) holds NaN at value 5"):
        checked.extend(2, 40, bad, tokens)
    bad[1, 5] = 0x7F80  # +inf
    with pytest.raises(tfe.Error, match="holds an infinity"):
        checked.extend_batch([2], [40], [3], bad, tokens)
    checked.extend(2, 40, taps, tokens)  # still usable, the slot untouched
    tfe.Reference(heads("tiny"), max_slots=4, max_steps=4).extend(2, 40, bad, tokens)


def test_reference_options_refused(heads):
    head = heads("tiny")
    with pytest.raises(tfe.Error, match="max_steps"):
        tfe.Reference(head, max_steps=17)
    with pytest.raises(tfe.Error, match="max_slots"):
        tfe.Reference(head, max_slots=0)
    with pytest.raises(tfe.Error, match=r"max_slots: 67108864 is outside 1\.\.4096"):
        tfe.Reference(head, max_slots=2**26)
    with pytest.raises(tfe.Error, match=r"threads = -5 is outside 0\.\.1024"):
        tfe.Reference(head, threads=-5)
    with pytest.raises(tfe.Error, match=r"head: .* holds a NUL byte at offset 3"):
        tfe.Reference("abc\0def.tfe")
    with pytest.raises(tfe.Error, match="fp8.*sometimes"):
        tfe.Reference(head, fp8="sometimes")
    with pytest.raises(tfe.Error, match="fp8 = require: linear `fc` has no FP8 form"):
        tfe.Reference(head, fp8="require")  # the head has no FP8 forms
    with pytest.raises(tfe.Error, match="preset has no weights"):
        tfe.Reference(tfe.Preset("tiny"))
    # A path works as well as a HeadFile.
    assert tfe.Reference(head.path).header == head.header


@needs_torch
def test_reference_takes_torch_bf16(heads):
    """torch bf16 (read through torch's accessors, other dtypes through DLPack) drafts what the same bits as
    numpy uint16 draft."""
    head = heads("tiny")
    h = head.header
    taps, tokens = random_rows(h, 5, seed=1)
    a = tfe.Reference(head, max_slots=2, max_steps=2)
    a.extend(0, 0, taps, tokens)
    b = tfe.Reference(head, max_slots=2, max_steps=2)
    t = torch.from_numpy(taps.astype(np.int32)).to(torch.int16).view(torch.bfloat16)
    b.extend(0, 0, t, torch.from_numpy(tokens))
    assert same_draft(a.draft([0], 2), b.draft(torch.tensor([0]), 2))
    with pytest.raises(tfe.Error, match=r"taps: expected bfloat16 .*got float32"):
        b.extend(0, 5, t.float(), torch.from_numpy(tokens))
    with pytest.raises(tfe.Error, match="not C-contiguous"):
        b.extend(0, 5, torch.zeros((row_width(h), 5), dtype=torch.bfloat16).t(), torch.from_numpy(tokens))
    with pytest.raises(tfe.Error, match=r"taps: expected bfloat16 .*got float16"):
        b.extend(0, 5, t.half(), torch.from_numpy(tokens))
    with pytest.raises(tfe.Error, match=r"tokens: expected int32, got bool"):  # a dtype read through DLPack
        b.extend(0, 5, t, torch.from_numpy(tokens) > 0)
    # Views that start inside their storage are read from their own first element.
    d = tfe.Reference(head, max_slots=2, max_steps=2)
    wide_taps = torch.cat([torch.full((3, row_width(h)), float("nan"), dtype=torch.bfloat16), t])
    wide_tokens = torch.cat([torch.full((3,), -1, dtype=torch.int32), torch.from_numpy(tokens)])
    d.extend(0, 0, wide_taps[3:], wide_tokens[3:])
    assert same_draft(a.draft([0], 2), d.draft([0], 2))
    # A tensor that requires grad: torch versions differ in whether DLPack exports it. Either it is read
    # as its detached bits (the same draft) or refused with the hint; never read as something else.
    c = tfe.Reference(head, max_slots=2, max_steps=2)
    g = t.clone().requires_grad_(True)
    try:
        c.extend(0, 0, g, torch.from_numpy(tokens))
    except tfe.Error as e:
        assert "requires grad needs .detach" in str(e)
    else:
        assert same_draft(a.draft([0], 2), c.draft([0], 2))


@needs_torch_cuda
def test_reference_refuses_cuda_tensors(heads):
    head = heads("tiny")
    taps, tokens = random_rows(head.header, 2, seed=1)
    ref = tfe.Reference(head, max_slots=2, max_steps=2)
    t = torch.from_numpy(taps.astype(np.int32)).to(torch.int16).view(torch.bfloat16).cuda()
    with pytest.raises(tfe.Error, match="extend takes host memory"):
        ref.extend(0, 0, t, torch.from_numpy(tokens))


# ------------------------------------------------------------------------------------------------- runtime


@pytest.mark.skipif(has_gpu, reason="a CUDA device is present: this checks the message without one")
def test_runtime_without_a_gpu_raises_runtime_error(heads):
    with pytest.raises(RuntimeError, match="tfe.Runtime needs a CUDA device") as e:
        tfe.Runtime(heads("tiny"))
    assert isinstance(e.value, tfe.CudaError) and not isinstance(e.value, ValueError)
    with pytest.raises(RuntimeError, match="CUDA device"):
        tfe.Runtime(heads("tiny").path, max_steps=4)


def test_runtime_arguments_checked_before_the_device(heads):
    head = heads("tiny")
    with pytest.raises(tfe.Error, match="max_steps = 0"):
        tfe.Runtime(head, max_steps=0)
    with pytest.raises(TypeError, match="arch"):
        tfe.Runtime(head, arch="sm_90")
    with pytest.raises(TypeError, match="bucketz"):
        tfe.Runtime(head, bucketz=[1])
    with pytest.raises(tfe.Error, match="stream: -1 is outside 0.."):
        tfe.Runtime(head, stream=-1)
    with pytest.raises(TypeError, match="stream"):
        tfe.Runtime(head, stream="s")
    # When graphs are captured is a measurement's choice (runtime/testing.h), not an engine's argument.
    with pytest.raises(TypeError, match="capture"):
        tfe.Runtime(head, capture="lazy")
    with pytest.raises(TypeError, match="head"):
        tfe.Runtime(1.5)


@pytest.fixture(scope="module")
def runtime(heads):
    if not has_gpu:
        pytest.skip("no CUDA device")
    rt = tfe.Runtime(heads("tiny"), buckets=[1, 2, 4], max_steps=4, max_slots=8, fp8="off")
    yield rt
    rt.close()


@needs_gpu
def test_runtime_opens_and_reports(runtime, heads):
    assert runtime.header == heads("tiny").header
    o = runtime.plan_options
    assert (o.buckets, o.max_steps, o.max_slots, o.fp8) == ([1, 2, 4], 4, 8, "off")
    assert runtime.ring_rows == runtime.header["window"] + 1 + 4
    assert not runtime.fp8_in_use and runtime.stream != 0 and runtime.device == 0
    assert set(runtime.stats()) >= {"replays", "eager_passes", "extend_chunks", "weight_bytes"}


@needs_gpu
def test_runtime_drafts_as_the_reference(runtime, heads):
    """Step-1 drafts agree with the CPU reference (the kernels sum in another order, so a near-tie may
    differ: tests/gpu/test_draft.cpp compares with margins; here most slots must agree)."""
    h = runtime.header
    ref = tfe.Reference(heads("tiny"), max_slots=8, max_steps=4, fp8="off")
    slots = [0, 1, 2, 3]
    for s in slots:
        runtime.reset(s)
        taps, tokens = random_rows(h, 12, seed=20 + s)
        runtime.extend(s, 0, taps, tokens)
        ref.extend(s, 0, taps, tokens)
    before = runtime.stats()["replays"] + runtime.stats()["eager_passes"]
    got, want = runtime.draft(slots, 4), ref.draft(slots, 4)
    assert runtime.stats()["replays"] + runtime.stats()["eager_passes"] == before + 1
    agree = got.tokens[:, 0] == want.tokens[:, 0]
    assert agree.sum() >= len(slots) - 1, (got.tokens, want.tokens)
    assert np.abs(got.confidences[agree, 0] - want.confidences[agree, 0]).max() < 2e-2


@needs_torch_cuda
def test_runtime_device_outputs(runtime):
    h = runtime.header
    runtime.reset(6)
    taps, tokens = random_rows(h, 4, seed=6)
    runtime.extend(6, 0, taps, tokens)
    d = runtime.draft([6], 3)
    dev_tokens, dev_conf = runtime.device_outputs()
    torch.cuda.current_stream().wait_stream(torch.cuda.ExternalStream(runtime.stream))
    assert np.array_equal(torch.from_dlpack(dev_tokens).cpu().numpy(), d.tokens)
    assert np.array_equal(torch.from_dlpack(dev_conf).cpu().numpy(), d.confidences)


@needs_gpu
def test_runtime_refusals_change_nothing(runtime):
    h = runtime.header
    runtime.reset(5)
    taps, tokens = random_rows(h, 4, seed=3)
    runtime.extend(5, 0, taps, tokens)
    baseline = runtime.draft([5], 3)
    more, more_tokens = random_rows(h, 2, seed=4)
    for args, pattern in [
        ((5, 6, more, more_tokens), "a gap"),
        ((5, 4, more.astype(np.float32), more_tokens), "taps: expected bfloat16"),
        ((9, 0, more, more_tokens), "slot 9 is outside"),
        ((5, 4, FakeDeviceArray((2, row_width(h)), 4, 16), more_tokens), "give both on the device or both on the host"),
    ]:
        with pytest.raises(tfe.Error, match=pattern):
            runtime.extend(*args)
    with pytest.raises(tfe.Error, match="steps"):
        runtime.draft([5], 5)
    assert same_draft(runtime.draft([5], 3), baseline)


@needs_gpu
def test_runtime_with_an_artifact(heads, tmp_path):
    head = heads("tiny")
    tfe.compile(head, tmp_path / "deploy", buckets=[1, 2], max_steps=2, max_slots=4, arch=f"sm_{90}")
    with tfe.Runtime(head, tmp_path / "deploy") as rt:
        assert rt.plan_options.buckets == [1, 2]
        taps, tokens = random_rows(head.header, 3, seed=8)
        rt.extend([tfe.ExtendRequest(0, 0, taps, tokens)])
        assert rt.draft([0], 2).tokens.shape == (1, 2)
    assert rt.closed
    with pytest.raises(tfe.Error, match="closed"):
        rt.draft([0], 1)
    with pytest.raises(tfe.Error, match="max_slots"):
        tfe.Runtime(head, tmp_path / "deploy", max_slots=8)  # differs from the artifact's options


@needs_torch_cuda
def test_runtime_takes_a_torch_stream(heads):
    s = torch.cuda.Stream()
    with tfe.Runtime(heads("tiny"), stream=s, buckets=[1], max_steps=1, max_slots=2) as rt:
        assert rt.stream == s.cuda_stream
        taps, tokens = random_rows(rt.header, 2, seed=1)
        cuda_taps = torch.from_numpy(taps.astype(np.int32)).to(torch.int16).view(torch.bfloat16).cuda()
        with pytest.raises(tfe.Error, match="give both on the device or both on the host"):
            rt.extend(0, 0, cuda_taps, torch.from_numpy(tokens))
        rt.extend(0, 0, cuda_taps.cpu(), torch.from_numpy(tokens))
        assert rt.draft([0], 1).tokens.shape == (1, 1)


@needs_torch_cuda
def test_runtime_on_torchs_default_stream_drafts_as_on_its_own(heads):
    options = dict(buckets=[1, 4], max_steps=3, max_slots=4)
    with tfe.Runtime(heads("tiny"), **options) as own, tfe.Runtime(
        heads("tiny"), stream=torch.cuda.default_stream(), **options
    ) as default:
        assert default.stream == 0
        for slot in range(3):
            taps, tokens = random_rows(own.header, 2 + slot, seed=40 + slot)
            own.extend(slot, 0, taps, tokens)
            default.extend(slot, 0, *cuda_rows(taps, tokens))
        for steps in (1, 3):
            a, b = own.draft([0, 1, 2], steps), default.draft([0, 1, 2], steps)
            assert np.array_equal(a.tokens, b.tokens)
            assert np.array_equal(a.confidences.view(np.uint32), b.confidences.view(np.uint32))
        assert default.stats()["replays"] >= 2
        assert default.stats()["library_calls"] == 5 and default.stats()["library_ns"] > 0


# ---------------------------------------------------------------------------------- the engine's door (GPU)


def cuda_rows(taps, tokens, pad=0):
    """Host rows as CUDA tensors; with `pad`, the taps are a view of a wider buffer (rows `pad` apart more)."""
    t = torch.from_numpy(taps.astype(np.int32)).to(torch.int16).view(torch.bfloat16).cuda()
    if pad:
        wide = torch.full((t.shape[0], t.shape[1] + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
        wide[:, : t.shape[1]] = t
        t = wide[:, : t.shape[1]]
    return t, torch.from_numpy(tokens).cuda()


def twin_runtimes(heads, **options):
    head = heads("tiny")
    options = dict(buckets=[1, 4], max_steps=3, max_slots=6, stream=torch.cuda.current_stream(), **options)
    return tfe.Runtime(head, **options), tfe.Runtime(head, **options)


@needs_torch_cuda
def test_device_extend_and_draft_async_equal_the_host_forms(heads):
    host, device = twin_runtimes(heads)
    h = host.header
    for slot in range(4):
        taps, tokens = random_rows(h, 3 + slot, seed=20 + slot)
        host.extend(slot, 0, taps, tokens)
        device.extend(slot, 0, *cuda_rows(taps, tokens, pad=8))
    for steps in (1, 3):
        want = host.draft([3, 0, 2], steps)
        tokens, confs = device.draft_async([3, 0, 2], steps)
        assert np.array_equal(torch.from_dlpack(tokens).cpu().numpy(), want.tokens)
        assert torch.equal(torch.from_dlpack(confs).cpu(), torch.from_numpy(want.confidences))
        ids = torch.tensor([3, 0, 2], dtype=torch.int32, device="cuda")
        out_tokens = torch.full((3, steps), -7, dtype=torch.int32, device="cuda")
        out_confs = torch.full((3, steps), float("nan"), device="cuda")
        device.draft_async(ids, steps, tokens=out_tokens, confidences=out_confs)
        assert np.array_equal(out_tokens.cpu().numpy(), want.tokens)
        assert torch.equal(out_confs.cpu(), torch.from_numpy(want.confidences))


@needs_torch_cuda
def test_device_extend_batch_equals_the_host_request_list(heads):
    """extend_batch reading each slot's rows where a verify pass leaves them (4 rows a slot in one strided
    buffer, the first counts[i] kept) drafts bit for bit as per-slot host requests."""
    host, device = twin_runtimes(heads)
    h = host.header
    taps, tokens = random_rows(h, 16, seed=33)
    cuda_taps, cuda_tokens = cuda_rows(taps, tokens, pad=16)
    nxt = [0] * 4
    for counts in ([1, 4, 2, 3], [4, 1, 3, 2]):
        host.extend([(s, nxt[s], taps[4 * s : 4 * s + c], tokens[4 * s : 4 * s + c]) for s, c in enumerate(counts)])
        order = [2, 0, 3, 1]
        device.extend_batch(order, [nxt[s] for s in order], [counts[s] for s in order], cuda_taps, cuda_tokens,
                            starts=[4 * s for s in order])
        nxt = [n + c for n, c in zip(nxt, counts)]
        want = host.draft([0, 1, 2, 3], 3)
        got_tokens, got_confs = device.draft_async([0, 1, 2, 3], 3)
        assert np.array_equal(torch.from_dlpack(got_tokens).cpu().numpy(), want.tokens)
        assert torch.equal(torch.from_dlpack(got_confs).cpu(), torch.from_numpy(want.confidences))


@needs_torch_cuda
def test_runtime_drafter_packs_a_rounds_rows_as_per_slot_requests(heads):
    """tfe.speculative.RuntimeDrafter extends a round's requests (more rows than the ring holds, split into
    calls, packed into one extend_batch each) and drafts bit for bit as per-slot host requests."""
    from tfe.speculative import RuntimeDrafter

    head = heads("tiny")
    options = dict(buckets=[1, 4], max_steps=3, max_slots=6)
    drafter = RuntimeDrafter(head, **options)
    host = tfe.Runtime(head, stream=torch.cuda.current_stream(), **options)
    ring = drafter.ring_rows
    h = host.header
    nxt = [0] * 4
    for round_, counts in enumerate(([ring + 3, 1, 2 * ring, 5], [2, 4, 1, 3])):
        requests = []
        for s, c in enumerate(counts):
            taps, tokens = random_rows(h, c, seed=60 + 4 * round_ + s)
            for i in range(0, c, ring):
                host.extend(s, nxt[s] + i, taps[i : i + ring], tokens[i : i + ring])
            requests.append((s, nxt[s], *cuda_rows(taps, tokens)))
        drafter.extend(requests)
        nxt = [n + c for n, c in zip(nxt, counts)]
        want = host.draft([3, 1, 0, 2], 3)
        got = drafter.draft([3, 1, 0, 2], 3)
        assert np.array_equal(got.cpu().numpy(), want.tokens), round_


@needs_torch_cuda
def test_draft_async_in_a_torch_cuda_graph_equals_the_direct_call(heads):
    recorded, direct = twin_runtimes(heads)
    h = direct.header
    slots = [0, 1, 2, 3]
    for s in slots:
        taps, tokens = random_rows(h, 2 + s, seed=40 + s)
        recorded.extend(s, 0, *cuda_rows(taps, tokens))
        direct.extend(s, 0, taps, tokens)
    ids = torch.tensor(slots, dtype=torch.int32, device="cuda")
    out_tokens = torch.zeros((4, 3), dtype=torch.int32, device="cuda")
    out_confs = torch.zeros((4, 3), device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded.draft_async(ids, 3, tokens=out_tokens, confidences=out_confs, stream=torch.cuda.current_stream())
    rng = np.random.default_rng(3)
    next_pos = {s: 2 + s for s in slots}
    for round_ in range(6):
        order = [int(x) for x in rng.permutation(slots)]  # the engine's batch order changes between replays
        ids.copy_(torch.tensor(order, dtype=torch.int32))
        out_tokens.fill_(-7)
        out_confs.fill_(float("nan"))
        graph.replay()
        want = direct.draft(order, 3)
        assert np.array_equal(out_tokens.cpu().numpy(), want.tokens), round_
        assert torch.equal(out_confs.cpu(), torch.from_numpy(want.confidences)), round_
        for s in slots:
            taps, tokens = random_rows(h, 1 + (round_ + s) % 3, seed=100 * round_ + s)
            recorded.extend(s, next_pos[s], *cuda_rows(taps, tokens))
            direct.extend(s, next_pos[s], taps, tokens)
            next_pos[s] += len(tokens)


@needs_torch_cuda
def test_a_device_round_does_not_wait_for_the_device(heads):
    """With the stream held busy by a long kernel, extend of device rows and draft_async return at once: a
    call that synchronized would wait for the kernel."""
    rt, _ = twin_runtimes(heads)
    h = rt.header
    taps, tokens = random_rows(h, 4, seed=2)
    rt.extend(0, 0, *cuda_rows(taps, tokens))
    more = cuda_rows(*random_rows(h, 2, seed=3))
    ids = torch.tensor([0], dtype=torch.int32, device="cuda")
    rt.draft_async(ids, 2)  # captures the enqueued graph outside the timed round
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the runtime's (= torch's) stream
        start = time.perf_counter()
        rt.extend(0, 4, *more)
        rt.draft_async(ids, 2)
        elapsed = time.perf_counter() - start
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert elapsed < 0.1, f"a round took {elapsed:.3f} s of host time behind a busy stream"


@pytest.mark.skipif(not hasattr(tfe, "DraftBroadcast"), reason="the package was built without NCCL")
def test_draft_broadcast_refuses_bad_arguments_by_name():
    with pytest.raises(tfe.Error, match=r"unique_id: 3 bytes; an NCCL unique id is 128"):
        tfe.DraftBroadcast(b"abc", 2, 0, max_streams=4, max_steps=2)
    with pytest.raises(tfe.Error, match=r"timeout: -1 s is outside \(0, 86400\]"):
        tfe.DraftBroadcast(bytes(128), 2, 0, max_streams=4, max_steps=2, timeout=-1.0)
    if not has_gpu:
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            tfe.DraftBroadcast(bytes(128), 2, 0, max_streams=4, max_steps=2)


@needs_torch_cuda
def test_device_tensors_are_refused_by_name_and_nothing_changes(heads):
    rt, _ = twin_runtimes(heads)
    h = rt.header
    W = row_width(h)
    taps, tokens = random_rows(h, 3, seed=60)
    rt.extend(0, 0, *cuda_rows(taps, tokens))
    baseline = rt.draft([0], 2)
    t, k = cuda_rows(*random_rows(h, 2, seed=61))
    wide = torch.zeros((W, 2), dtype=torch.bfloat16, device="cuda").t()  # a row's values W apart
    for args, pattern in [
        ((0, 3, t.float(), k), r"taps: expected bfloat16"),
        ((0, 3, wide, k), r"taps: a row's values must be contiguous"),
        ((0, 3, t, k.long()), r"tokens: expected int32"),
        ((0, 3, t, torch.arange(4, dtype=torch.int32, device="cuda")[::2]), r"tokens: not C-contiguous"),
        ((0, 3, t, k.cpu()), r"give both on the device or both on the host"),
        ((0, 3, t[:, :-1], k), rf"taps: expected shape \[rows, {W}\]"),
        ((0, 4, t, k), r"a gap"),
    ]:
        with pytest.raises(tfe.Error, match=pattern):
            rt.extend(*args)
    ids = torch.tensor([0], dtype=torch.int32, device="cuda")
    with pytest.raises(tfe.Error, match=r"slots: expected int32 on the device"):
        rt.draft_async(ids.long(), 2)
    with pytest.raises(tfe.Error, match=r"tokens: shape \[1, 1\] holds less than \[1, 2\]"):
        rt.draft_async(ids, 2, tokens=torch.zeros((1, 1), dtype=torch.int32, device="cuda"))
    with pytest.raises(tfe.Error, match=r"confidences: expected float32"):
        rt.draft_async(ids, 2, confidences=torch.zeros((1, 2), dtype=torch.float64, device="cuda"))
    with pytest.raises(tfe.Error, match=r"tokens: on cpu; an enqueued draft writes device memory"):
        rt.draft_async(ids, 2, tokens=torch.zeros((1, 2), dtype=torch.int32))
    assert same_draft(rt.draft([0], 2), baseline)
