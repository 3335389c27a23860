"""The EAGLE-3 head in PyTorch: one statement of its math (docs/head.md) for training and for drafting.

- `Eagle3Head` holds the weights, reads and writes the Hugging Face EAGLE-3 checkpoint, and states the layer
  once (`qkv`, `attend`, `rest_of_layer`, `logits`). `ttt` runs the training-time test over whole (packed)
  rows, as tfe.train_head trains it.
- `DraftRing` runs it as tfe's engine does (docs/head.md "Engine contract"): per slot a ring of
  W + 1 + max_steps K/V rows indexed by position, attention over max(first, p - W) .. p, h2 carried from step
  to step. tfe.speculative.TorchDrafter is a thin user of it.

Numerics: in fp32 every value is fp32; in bf16 (`head.to(torch.bfloat16)`) values between operations are bf16
as the spec says, while norm statistics, RoPE angles, attention scores, softmax and logits stay fp32. RoPE's
frequencies are computed in fp32 at each call rather than kept as a buffer, so a dtype cast of the module
cannot round them. The remaining difference from tfe's kernels is the order of fp32 sums (and PyTorch's
bf16 linears rounding a residual add twice), which decides only near-ties.
"""

from __future__ import annotations

import json
import math
import pathlib

import torch
import torch.nn.functional as F
from torch import nn

from .outputs import replacing, write_atomic


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with the rotate-half pairing (i, i + hd / 2), as transformers' Llama computes it; the angle's cos
    and sin in fp32, the result in x's dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def read_checkpoint(ckpt_dir: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint: model.safetensors, or the shards of model.safetensors.index.json
    (a tensor its metadata lists under "split", as tfe.train_head.write_trained_shards writes one larger than
    a file, joined again from its blocks of rows)."""
    from safetensors.torch import load_file

    root = pathlib.Path(ckpt_dir)
    index = root / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(root / "model.safetensors"))
    spec = json.loads(index.read_text())
    files = sorted(set(spec["weight_map"].values()))
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{index}: {name!r} is not a file of this directory")
        tensors.update(load_file(str(root / name)))
    for name, pieces in spec.get("metadata", {}).get("split", {}).items():
        missing = [p for p in pieces if p not in tensors]
        if missing:
            raise ValueError(f"{index}: {name} is split into {len(pieces)} blocks; the shards lack {', '.join(missing)}")
        tensors[name] = torch.cat([tensors.pop(p) for p in pieces])
    return tensors


class Eagle3Head(nn.Module):
    """The EAGLE-3 head for a Llama-like target (`target` is a tfe.target.Target; its embedding is shared,
    frozen, and its final norm and output rows of the draft vocabulary start the head's own). `ffn`: the MLP's
    width, by default the target's."""

    def __init__(self, target, draft_ids: torch.Tensor, ffn: int | None = None):
        super().__init__()
        cfg = target.model.config
        H = cfg.hidden_size
        self.H, self.T = H, len(target.tap_layers)
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or H // self.heads
        self.ffn = ffn or cfg.intermediate_size
        self.eps = 1e-5
        rope = getattr(cfg, "rope_parameters", None) or {}
        self.rope_theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"the target's RoPE {rope} is not the default one this head computes")
        nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim

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
        # A per-channel scale of the taps, for training only (`set_tap_scale`); None: fc reads the taps as they are.
        self.register_buffer("tap_scale", None, persistent=False)

    def set_tap_scale(self, scale: torch.Tensor | None) -> None:
        """Train fc on the taps scaled per channel (scale [T*H], e.g. 1 / each channel's RMS over the data). The
        target's taps differ in scale by 7x from tap to tap and by 100x from channel to channel; Adam moves each
        weight by about the same step, so unscaled, the loud channels learn fastest and the quiet ones hardly
        at all. The function is the same with the scale folded into fc's weight, which `fold_tap_scale` and
        `save` do: the checkpoint's fc reads the taps as they are."""
        self.tap_scale = None if scale is None else scale.to(self.fc.weight.device, torch.float32)

    def fc_weight(self) -> torch.Tensor:
        """fc's weight as the checkpoint holds it: applied to the taps as they are."""
        return self.fc.weight if self.tap_scale is None else self.fc.weight * self.tap_scale

    def fold_tap_scale(self) -> None:
        """Move the tap scale into fc's weight (the same function, the checkpoint's form)."""
        with torch.no_grad():
            self.fc.weight.copy_(self.fc_weight())
        self.tap_scale = None

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """g = fc(taps) [.., H] from the taps [.., T*H]."""
        # Scaled in fp32: the scale is what `fold_tap_scale` multiplies into fc's weight, not its bf16 rounding.
        return self.fc(taps if self.tap_scale is None else taps.float() * self.tap_scale)

    # -------------------------------------------------------------------------------------- the layer

    def rope(self, positions: torch.Tensor):
        """cos and sin [B, 1, N, hd] in fp32 for positions [B, N]."""
        hd = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=positions.device) / hd))
        angle = positions.float()[..., None] * inv_freq
        angle = torch.cat([angle, angle], dim=-1)
        return angle.cos()[:, None], angle.sin()[:, None]

    def qkv(self, g, tokens, positions):
        """q [B, heads, N, hd], k and v [B, kv_heads, N, hd] of rows g [B, N, H] carrying tokens [B, N]."""
        x = torch.cat([rms_norm(self.embed[tokens], self.input_norm, self.eps), rms_norm(g, self.hidden_norm, self.eps)], -1)
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, N, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, N, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rope(positions)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(self, q, keys, values, seen) -> torch.Tensor:
        """o [B, heads, N, hd]: q [B, heads, N, hd] over keys and values [B, kv_heads, M, hd] where seen
        [B, N, M] (bool) allows; scores, softmax and the weighted sum in fp32, rounded once."""
        rep = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        scores = (q.float() @ keys.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~seen[:, None], float("-inf"))
        return (torch.softmax(scores, -1) @ values.float()).to(q.dtype)

    def rest_of_layer(self, g, o):
        """h2 from the layer's input g [B, N, H] and attention's o [B, heads, N, hd]."""
        B, _, N, _ = o.shape
        h1 = g + self.o_proj(o.transpose(1, 2).reshape(B, N, -1))
        u = rms_norm(h1, self.post_norm, self.eps)
        return h1 + self.down_proj(F.silu(self.gate_proj(u)) * self.up_proj(u))

    def logits(self, h2):
        """Over the draft vocabulary, in fp32."""
        return self.lm_head(rms_norm(h2, self.final_norm, self.eps)).float()

    # -------------------------------------------------------------------------------------- training

    def ttt(self, taps, ids, steps: int, window: int = 511, positions=None, doc=None):
        """Training-time test over every index of a batch: per step k, the logits [B, N, Vd] of the draft
        made at index i for the token at i + k + 2. taps [B, N, T*H]; ids [B, N]. Packed rows give each
        token its position within its sequence (positions [B, N]) and its sequence's number (doc [B, N]):
        attention stays within a sequence. Step k at index i runs at position positions[i] + k with the
        true token ids[i + k + 1], attends the real rows of its sequence before it within the window and its
        own earlier steps at index i, as a draft does at run time."""
        B, N = ids.shape
        idx = torch.arange(N, device=ids.device)
        if positions is None:
            positions = idx.expand(B, N)
        same = torch.ones(B, N, N, dtype=torch.bool, device=ids.device) if doc is None else doc[:, :, None] == doc[:, None, :]
        causal = (idx[None, :] <= idx[:, None])[None] & same
        g = self.fuse(taps)
        keys, values, out = [], [], []
        scale = 1.0 / math.sqrt(self.head_dim)
        rep = self.heads // self.kv_heads
        for k in range(steps):
            tokens = F.pad(ids[:, k + 1 :], (0, k + 1))
            q, kk, vv = self.qkv(g, tokens, positions + k)
            keys.append(kk.repeat_interleave(rep, 1))
            values.append(vv.repeat_interleave(rep, 1))
            # The real rows j <= i of the sequence within the window of the query's position, then the
            # step's own earlier drafts at index i, the query's own key last.
            real = causal & (positions[:, None, :] >= positions[:, :, None] + k - window)
            scores = (q.float() @ keys[0].float().transpose(-1, -2)) * scale
            scores = scores.masked_fill(~real[:, None], float("-inf"))
            diag = [(q.float() * keys[j].float()).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]
            p = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1)
            o = p[..., :N] @ values[0].float()
            for j in range(1, k + 1):
                o = o + p[..., N + j - 1 : N + j] * values[j].float()
            g = self.rest_of_layer(g, o.to(g.dtype))
            out.append(self.logits(g))
        return out

    # -------------------------------------------------------------------------------------- files

    CHECKPOINT_NAMES = {
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
    def load(cls, ckpt_dir: str | pathlib.Path, target) -> "Eagle3Head":
        """A checkpoint in the layout `save` writes, in fp32 on the target's device: one model.safetensors or the
        shards a model.safetensors.index.json names. Without `embed_tokens.weight` the head shares the
        target's embedding, as EAGLE-3 heads do."""
        t = read_checkpoint(ckpt_dir)
        missing = [n for n in ("d2t", *cls.CHECKPOINT_NAMES) if n not in t]
        if missing:
            raise ValueError(f"{ckpt_dir}: the checkpoint lacks {', '.join(missing)}")
        d2t = t["d2t"].long()
        head = cls(target, d2t + torch.arange(len(d2t)), ffn=t["midlayer.mlp.gate_proj.weight"].shape[0])
        with torch.no_grad():
            for src, dst in cls.CHECKPOINT_NAMES.items():
                want = head.get_parameter(dst).shape
                if t[src].shape != want:
                    raise ValueError(f"{ckpt_dir}: {src} is {list(t[src].shape)}, this target's head needs {list(want)}")
                head.get_parameter(dst).copy_(t[src].float())
            if "embed_tokens.weight" in t:
                head.embed.copy_(t["embed_tokens.weight"].float())
        return head.to(target.device)

    def save(self, out_dir: pathlib.Path, target, window: int) -> None:
        """config.json + model.safetensors in the Hugging Face EAGLE-3 layout, weights in bf16."""
        from safetensors.torch import save_file

        bf = lambda t: t.detach().to(torch.bfloat16).contiguous().cpu()  # noqa: E731
        ids = self.draft_ids.long().cpu()
        tensors = {src: bf(self.get_parameter(dst)) for src, dst in self.CHECKPOINT_NAMES.items()}
        tensors["fc.weight"] = bf(self.fc_weight())
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
        with replacing(out_dir / "model.safetensors") as tmp:  # the temporary gets a new file's mode, not 0600
            save_file(tensors, str(tmp))
        write_atomic(out_dir / "config.json", json.dumps(config, indent=2) + "\n")


class DraftRing:
    """The head drafting as tfe's engine does (docs/head.md "Engine contract"), for `max_slots` sequences:
    per slot a ring of W + 1 + max_steps K/V rows (position p in row p mod R), its first and last real
    positions, and the last real row's g and token. Values are kept in the head's dtype."""

    def __init__(self, head: Eagle3Head, *, max_slots: int, max_steps: int, window: int):
        p = next(head.parameters())
        self.head, self.dtype, dev = head, p.dtype, p.device
        self.window = window
        self.ring_rows = window + 1 + max_steps
        self.keys = torch.zeros(max_slots, head.kv_heads, self.ring_rows, head.head_dim, dtype=self.dtype, device=dev)
        self.values = torch.zeros_like(self.keys)
        self.ring_pos = torch.full((max_slots, self.ring_rows), -1, dtype=torch.long, device=dev)
        self.first = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self.last = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self.g = torch.zeros(max_slots, head.H, dtype=self.dtype, device=dev)
        self.token = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self.filled = [False] * max_slots

    def reset(self, slot: int) -> None:
        self.ring_pos[slot] = -1
        self.filled[slot] = False

    def _write(self, slots, positions, k, v) -> None:
        rows = positions % self.ring_rows
        self.keys[slots, :, rows] = k.to(self.dtype)
        self.values[slots, :, rows] = v.to(self.dtype)
        self.ring_pos[slots, rows] = positions

    @torch.inference_mode()
    def extend(self, slot: int, pos: int, taps: torch.Tensor, tokens: torch.Tensor) -> None:
        """Real rows pos .. pos + n - 1 of one slot: taps [n, T*H] (read as bf16, as the engine reads them)
        and the token that follows each [n]."""
        n = tokens.shape[0]
        dev = self.keys.device
        positions = torch.arange(pos, pos + n, device=dev)
        g = self.head.fuse(taps.to(dev, torch.bfloat16).to(self.dtype))[None]
        _, k, v = self.head.qkv(g, tokens.to(dev).long()[None], positions[None])
        self._write(torch.full((n,), slot, device=dev), positions, k[0].transpose(0, 1), v[0].transpose(0, 1))
        if not self.filled[slot]:
            self.first[slot] = pos
            self.filled[slot] = True
        self.last[slot] = pos + n - 1
        self.g[slot] = g[0, -1]
        self.token[slot] = tokens[-1]

    def draft(self, slots, steps: int, first_ranks: torch.Tensor | None = None) -> torch.Tensor:
        """Target token ids [len(slots), steps]: step j's token is the draft for position last + j + 1."""
        return self.run(slots, steps, first_ranks=first_ranks)[0]

    @torch.inference_mode()
    def run(self, slots, steps: int, follow: torch.Tensor | None = None, first_ranks: torch.Tensor | None = None):
        """The draft pass: (target token ids [B, steps], logits over the draft vocabulary [B, steps, Vd]).
        With `follow` [B, >= steps - 1] (target ids), step j + 1 reads follow[:, j] instead of step j's own
        draft: another drafter's chain, to compare this head's choice with it step by step. With
        `first_ranks` [B], step 1 takes each slot's token of that rank (0: the best; equal logits rank by
        the lower draft-vocabulary index, as the best does) and the later steps their best, a branch of a
        draft tree."""
        h = self.head
        s = torch.tensor(list(slots), device=self.keys.device)
        g, tok, pos = self.g[s][:, None], self.token[s][:, None], self.last[s]
        out, logits = [], []
        for j in range(steps):
            p = pos + j
            q, k, v = h.qkv(g, tok, p[:, None])
            self._write(s, p, k[:, :, 0], v[:, :, 0])
            lo = torch.maximum(self.first[s], p - self.window)
            seen = (self.ring_pos[s] >= lo[:, None]) & (self.ring_pos[s] <= p[:, None])
            o = h.attend(q, self.keys[s], self.values[s], seen[:, None, :])
            g = h.rest_of_layer(g, o)
            logits.append(h.logits(g)[:, 0])
            if j == 0 and first_ranks is not None:
                ranked = logits[-1].sort(dim=-1, descending=True, stable=True).indices
                out.append(h.draft_ids[ranked.gather(1, first_ranks.to(s.device).long()[:, None])[:, 0]])
            else:
                out.append(h.draft_ids[logits[-1].argmax(-1)])
            tok = (out[-1] if follow is None else follow[:, j].to(s.device).long())[:, None]
        return torch.stack(out, 1), torch.stack(logits, 1)
