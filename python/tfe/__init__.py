"""tfe: EAGLE-3 draft heads on CUDA graphs, from Python.

The module mirrors the C++ API (include/tfe/):

    head = tfe.HeadFile("head.tfe")                   # header, tensors; tfe.random_head / tfe.convert make one
    tfe.compile(head, "deploy/", max_slots=32)        # the deploy artifact (tfe-plan compile)
    rt = tfe.Runtime(head, "deploy/", stream=torch.cuda.Stream())
    rt.extend(slot, first_pos, taps, tokens)          # taps bf16 [rows, taps*target_hidden], tokens int32 [rows]
    tokens, confidences = rt.draft([slot], 4)         # numpy [slots, steps]
    rt.reset(slot)

tfe.Reference is the CPU reference with the same extend / draft / reset. Arrays pass through DLPack or the
buffer protocol without a copy (torch, CuPy, JAX, numpy; numpy holds bf16 as uint16 bits). Every argument
is checked first: a refused call raises tfe.Error (a ValueError) naming the argument, the expected and the
actual, and changes nothing; a CUDA failure raises tfe.CudaError (a RuntimeError), after which that
runtime refuses every call.
"""

from typing import Any, NamedTuple


def _load_torch_nccl() -> None:
    """A module built with NCCL links libnccl.so.2, and one soname is loaded once per process. torch's CUDA
    wheels ship their own NCCL (the nvidia-nccl package), often newer than the toolkit's that the module was
    built against, and torch needs its symbols: loaded first, the toolkit's makes a later `import torch` fail
    (undefined symbol). So where torch and that package are installed and torch is not yet imported, their
    NCCL is loaded before the module, and both use it (NCCL keeps its API across versions)."""
    import importlib.util
    import sys

    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    nvidia = importlib.util.find_spec("nvidia")
    if nvidia is None or not nvidia.submodule_search_locations:
        return
    import ctypes
    import os

    for root in nvidia.submodule_search_locations:
        lib = os.path.join(root, "nccl", "lib", "libnccl.so.2")
        if os.path.isfile(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            return


_load_torch_nccl()

from ._cli import tfe_plan_executable
from ._tfe import (
    AcceptLog,
    Artifact,
    CudaError,
    DraftResult,
    Error,
    HeadFile,
    PlanOptions,
    Preset,
    Reference,
    Runtime,
    TensorInfo,
    __version__,
    compile,
    convert,
    cuda_device_count,
    plan_option_names,
    plan_yaml,
    presets,
    random_head,
)

try:  # built where NCCL was found (docs/distributed.md)
    from ._tfe import DraftBroadcast, nccl_unique_id
except ImportError:
    pass


class ExtendRequest(NamedTuple):
    """One slot's real rows for extend([...]): positions first_pos .. first_pos + rows - 1."""

    slot: int
    first_pos: int
    taps: Any  # bf16 [rows, taps * target_hidden] (or uint16 bits): host (C-contiguous) or the runtime's device
    tokens: Any  # int32 [rows]: the target token that follows each row, in the same memory as taps


__all__ = [
    "AcceptLog",
    "Artifact",
    "CudaError",
    "DraftResult",
    "Error",
    "ExtendRequest",
    "HeadFile",
    "PlanOptions",
    "Preset",
    "Reference",
    "Runtime",
    "TensorInfo",
    *(["DraftBroadcast", "nccl_unique_id"] if "DraftBroadcast" in globals() else []),
    "__version__",
    "compile",
    "convert",
    "cuda_device_count",
    "plan_option_names",
    "plan_yaml",
    "presets",
    "random_head",
    "tfe_plan_executable",
]
