"""Types of tfe._tfe, the extension module (python/binding/). The package re-exports every name."""

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

__version__: str

# An array: a torch tensor (read through its accessors), or anything with DLPack or the buffer protocol (numpy,
# CuPy, JAX, ...).
_ArrayLike = Any
# A stream: None (the runtime's own), a raw cudaStream_t as an int (0: the null stream, torch's default), or an
# object with .cuda_stream (torch) or .ptr (CuPy).
_StreamLike = Any
_PathLike = str | os.PathLike[str]

class Error(ValueError):
    """A call tfe refused (a bad argument, file, option or state); nothing changed."""

class CudaError(RuntimeError):
    """A CUDA or cuBLASLt call failed, or no device is there; a runtime it came from is unusable."""

class DraftResult(NamedTuple):
    tokens: npt.NDArray[np.int32]  # [slots, steps] target token ids
    confidences: npt.NDArray[np.float32]  # [slots, steps]

class TensorInfo(NamedTuple):
    name: str
    dtype: str  # BF16, F32, I32, F8_E4M3
    shape: tuple[int, ...]
    nbytes: int

class PlanOptions:
    """The options of a plan (include/tfe/options.h); every field is also a keyword argument."""

    buckets: list[int]
    max_steps: int
    fp8: str  # auto, off, require
    arch: str
    max_slots: int
    extend_rows: int
    attention_split: str  # "per_bucket" or "same_drafts"
    cand_k: int  # 0: the head's
    first_ranks: bool  # step 1 may draft another rank than the best (a dense head's)
    def __init__(self, **options: object) -> None: ...
    def to_dict(self) -> dict[str, object]: ...
    def replace(self, **options: object) -> PlanOptions: ...
    def validate(self) -> None: ...
    def __eq__(self, other: object) -> bool: ...

def plan_option_names() -> list[str]: ...

class Preset:
    """A built-in head shape, planned without a head file (`--preset`, `--preset-fp8`)."""

    def __init__(self, name: str, fp8: bool = False) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def fp8(self) -> bool: ...
    @property
    def header(self) -> dict[str, Any]: ...

def presets() -> list[str]: ...

class Artifact:
    """A deploy artifact directory (tfe.compile, `tfe-plan compile -o`)."""

    def __init__(self, path: _PathLike) -> None: ...
    @property
    def path(self) -> str: ...
    def verify(self, head: _PathLike | None = None) -> dict[str, Any]:
        """Checks the artifact on the CPU (manifest, every sha256, the head it was compiled for); raises tfe.Error."""

class HeadFile:
    """A .tfe head file, mapped read-only and validated (with verify: every tensor's sha256 too)."""

    def __init__(self, path: _PathLike, verify: bool = False) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def header(self) -> dict[str, Any]: ...
    @property
    def header_sha256(self) -> str: ...
    @property
    def metadata(self) -> dict[str, str]: ...
    @property
    def tensors(self) -> list[TensorInfo]: ...
    def tensor(self, name: str) -> npt.NDArray[Any]: ...
    def __contains__(self, name: str) -> bool: ...
    def __len__(self) -> int: ...

def random_head(
    preset: str | None,
    out: _PathLike,
    *,
    seed: int = 0,
    fp8: bool = False,
    config: _PathLike | None = None,
    threads: int = 0,
) -> HeadFile: ...
def convert(
    eagle_dir: _PathLike,
    out: _PathLike,
    *,
    target: _PathLike | None = None,
    window: int = 511,
    fp8: bool = False,
    threads: int = 0,
) -> HeadFile: ...
def plan_yaml(head: _PathLike | HeadFile | Preset, *, plan: PlanOptions | None = None, **options: object) -> str: ...
def compile(
    head: _PathLike | HeadFile | Preset,
    out_dir: _PathLike,
    *,
    plan: PlanOptions | None = None,
    progress: Callable[[str], object] | None = None,
    **options: object,
) -> dict[str, object]: ...

_ExtendTuple = tuple[int, int, _ArrayLike, _ArrayLike]  # (slot, first_pos, taps, tokens)

class Reference:
    """The CPU reference: what the kernels must compute, with the same slot checks as the runtime."""

    def __init__(
        self,
        head: _PathLike | HeadFile,
        *,
        max_slots: int = 16,
        max_steps: int = 8,
        fp8: str = "auto",
        threads: int = 0,
        cand_k: int = 0,
        check_taps: bool = False,
    ) -> None: ...
    @overload
    def extend(self, slot: int, first_pos: int, taps: _ArrayLike, tokens: _ArrayLike) -> None:
        """Absorbs real rows: taps [rows, taps * target_hidden] bfloat16 (numpy: uint16 bits), tokens [rows]
        int32. first_pos: the slot's next position (an empty slot starts anywhere). Drafted rows are not kept."""
    @overload
    def extend(self, requests: Sequence[_ExtendTuple]) -> None:
        """Several slots at once: a (slot, first_pos, taps, tokens) tuple each."""
    def extend_batch(
        self,
        slots: Sequence[int] | _ArrayLike,
        first_pos: Sequence[int] | _ArrayLike,
        counts: Sequence[int] | _ArrayLike,
        taps: _ArrayLike,
        tokens: _ArrayLike,
        *,
        starts: Sequence[int] | _ArrayLike | None = None,
    ) -> None:
        """Request i: slots[i] at first_pos[i], counts[i] rows of taps/tokens from row starts[i] (default: right
        after the previous request's rows)."""
    def draft(
        self, slots: Sequence[int] | _ArrayLike, steps: int, *, first_ranks: Sequence[int] | None = None
    ) -> DraftResult:
        """`steps` tokens (1..max_steps) after each slot's last row: (tokens, confidences), numpy [slots, steps]
        int32 and float32. The slots keep their rows: the next extend continues them. first_ranks: per slot,
        the rank of step 1's token (0: the best .. 7; a dense head's), the branches of a draft tree."""
    def reset(self, slot: int) -> None:
        """Empties the slot: its next extend starts a new sequence."""
    @property
    def header(self) -> dict[str, Any]: ...
    @property
    def ring_rows(self) -> int: ...
    @property
    def max_slots(self) -> int: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def fp8(self) -> str: ...
    def uses_fp8(self, linear: str) -> bool: ...

def cuda_device_count() -> int: ...

class AcceptLog:
    """Drafts asked and kept by window position, a JSON line every `every` rounds (docs/runtime.md)."""

    def __init__(self, *, every: int = 0, path: _PathLike = "", label: str = "") -> None: ...
    def record(self, kept: Sequence[int], steps: int) -> None: ...
    def flush(self) -> None: ...
    def totals(self) -> dict[str, Any]:
        """rounds, sequences, kept_tokens, mean_kept, and asked / kept lists indexed by position - 1."""
    def close(self) -> None:
        """Writes the rounds not yet written and closes the file."""
    def __enter__(self) -> AcceptLog: ...
    def __exit__(self, *args: object) -> None: ...

class Runtime:
    """One draft head on one GPU (tfe::Runtime). Plan options not given come from the artifact, or the defaults."""

    def __init__(
        self,
        head: _PathLike | HeadFile,
        artifact: _PathLike | None = None,
        *,
        stream: _StreamLike = None,
        device: int = 0,
        plan: PlanOptions | None = None,
        graphs: bool = True,
        verify: bool = False,
        recompile_mismatched_artifact: bool = False,
        accept_log_every: int = 0,
        accept_log_path: _PathLike = "",
        accept_log_label: str = "",
        tap_dump: _PathLike = "",
        tap_dump_max_rows: int = 65536,
        self_check: bool = False,
        max_slots: int = ...,
        max_steps: int = ...,
        **options: object,
    ) -> None:
        """max_slots, max_steps and the other plan options (plan_option_names()) not given come from the
        artifact, else the defaults (PlanOptions)."""
    @overload
    def extend(
        self, slot: int, first_pos: int, taps: _ArrayLike, tokens: _ArrayLike, *, stream: _StreamLike = None
    ) -> None:
        """Taps [rows, taps * target_hidden] bfloat16 and tokens [rows] int32, both on the host or both on the
        runtime's device (no host copy; device taps' rows may be any stride apart)."""
    @overload
    def extend(self, requests: Sequence[_ExtendTuple], *, stream: _StreamLike = None) -> None: ...
    def extend_batch(
        self,
        slots: Sequence[int] | _ArrayLike,
        first_pos: Sequence[int] | _ArrayLike,
        counts: Sequence[int] | _ArrayLike,
        taps: _ArrayLike,
        tokens: _ArrayLike,
        *,
        starts: Sequence[int] | _ArrayLike | None = None,
        stream: _StreamLike = None,
    ) -> None:
        """Several slots from one pair of arrays (host, or the runtime's device; device taps' rows may be any
        stride apart): request i is slots[i] at first_pos[i], counts[i] rows from row starts[i] (default: right
        after the previous request's rows). Two array imports a call, not two a slot."""
    def draft(
        self, slots: Sequence[int] | _ArrayLike, steps: int, *, first_ranks: Sequence[int] | None = None
    ) -> DraftResult:
        """One graph replay: `steps` tokens after each slot's last row, (tokens, confidences) numpy [slots, steps].
        first_ranks (a plan with first_ranks): per slot, the rank of step 1's token (0: the best .. 7)."""
    def draft_async(
        self,
        slots: Sequence[int] | _ArrayLike,
        steps: int,
        *,
        tokens: _ArrayLike | None = None,
        confidences: _ArrayLike | None = None,
        stream: _StreamLike = None,
        first_ranks: Sequence[int] | _ArrayLike | None = None,
    ) -> DraftResult:
        """Enqueues a draft; returns (tokens, confidences) as device DLPack arrays [slots, steps], valid until
        the next draft. An int32 CUDA tensor of slot ids is read on the device (a torch.cuda.graph capture can
        record this form). first_ranks: as draft's, a list with host slots, an int32 CUDA tensor with device
        slots."""
    @property
    def draft_slots(self) -> _ArrayLike:
        """The runtime's own device slot-id buffer [largest bucket] int32."""
    def reset(self, slot: int, *, stream: _StreamLike = None) -> None:
        """Empties the slot: its next extend starts a new sequence."""
    def device_outputs(self) -> DraftResult:
        """The last draft's outputs on the device as DLPack arrays (not numpy), valid until the next draft."""
    def synchronize(self) -> None: ...
    def record_accepted(self, kept: Sequence[int], steps: int) -> None:
        """After the target verified a round: kept[i] of the `steps` tokens drafted for the i-th slot of that
        round's draft were accepted. Counted in accept_totals() and written to the accept log."""
    def accept_totals(self) -> dict[str, Any]: ...
    def write_tap_dump(self) -> None:
        """Writes the tap dump's safetensors file now, with every row kept so far (it is written again at
        close)."""
    def stats(self) -> dict[str, int]:
        """The runtime's counters, and library_ns / library_calls: time inside the library's calls made from
        Python, without the Python door around them."""
    @property
    def plan_options(self) -> PlanOptions: ...
    @property
    def header(self) -> dict[str, Any]: ...
    @property
    def fp8_in_use(self) -> bool: ...
    @property
    def ring_rows(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def graphs_enabled(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Runtime: ...
    def __exit__(self, *exc: object) -> None: ...

def nccl_unique_id() -> bytes:
    """Rank 0's NCCL unique id for DraftBroadcast (present where the package was built with NCCL)."""

class DraftBroadcast:
    """Drafts from rank 0 to every rank through NCCL (include/tfe/broadcast.h; docs/distributed.md)."""

    def __init__(
        self,
        unique_id: bytes,
        ranks: int,
        rank: int,
        *,
        max_streams: int,
        max_steps: int,
        device: int = 0,
        timeout: float = 60.0,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def ranks(self) -> int: ...
    def send(self, runtime: Runtime, *, stream: _StreamLike = None) -> DraftResult: ...
    def receive(self, rows: int, steps: int, *, stream: _StreamLike = None) -> DraftResult: ...
    def wait(self, *, stream: _StreamLike = None) -> None: ...
