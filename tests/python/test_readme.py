"""The README's Python examples, run as written, in order, in one namespace and a scratch directory. The
example that imports torch needs torch and a CUDA device, and skips, saying so, where either is missing;
the others run on any CPU."""

import os
import pathlib
import re

import pytest

import tfe

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_examples():
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)
    assert blocks, f"{README} has no ```python block"
    return blocks


def torch_cuda_missing():
    """Why the torch example cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not importable"
    return None if torch.cuda.is_available() else "no CUDA device"


def needs_torch(block):
    return re.search(r"^import torch", block, flags=re.M) is not None


def run_examples(blocks, scope, cwd):
    here = os.getcwd()
    os.chdir(cwd)
    try:
        for i, block in blocks:
            exec(compile(block, f"{README}, python example {i + 1}", "exec"), scope)
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def cpu_examples(tmp_path_factory):
    """The namespace and directory the examples without torch leave."""
    cwd = tmp_path_factory.mktemp("readme")
    scope = {}
    run_examples([(i, b) for i, b in enumerate(python_examples()) if not needs_torch(b)], scope, cwd)
    return scope, cwd


def test_readme_cpu_examples_run_as_written(cpu_examples):
    scope, cwd = cpu_examples
    assert isinstance(scope["head"], tfe.HeadFile)
    assert (cwd / "deploy" / "manifest.json").is_file()
    drafts, confidences = scope["drafts"], scope["confidences"]
    assert drafts.shape == confidences.shape == (1, 4)
    assert ((0 <= drafts) & (drafts < scope["head"].header["vocab"])).all()


def test_readme_torch_example_runs_as_written(cpu_examples):
    blocks = [(i, b) for i, b in enumerate(python_examples()) if needs_torch(b)]
    assert blocks, "the README shows the runtime"
    missing = torch_cuda_missing()
    if missing:
        pytest.skip(f"README python example {blocks[0][0] + 1} needs torch and a CUDA device: {missing}")
    scope, cwd = cpu_examples
    run_examples(blocks, dict(scope), cwd)


def test_readme_python_examples_name_only_what_exists():
    """Every tfe.NAME the examples call is in the package (a renamed call would otherwise pass unnoticed in
    the GPU example on a machine without a GPU)."""
    text = "\n".join(python_examples())
    names = set(re.findall(r"\btfe\.([A-Za-z_]+)", text))
    assert names and not {n for n in names if not hasattr(tfe, n)}
    for var, cls in (("ref", tfe.Reference), ("rt", tfe.Runtime)):
        methods = set(re.findall(rf"\b{var}\.([A-Za-z_]+)\(", text))
        assert methods and not {m for m in methods if not hasattr(cls, m)}, var
