"""The target's forward for fixed shapes: a Llama decoder over a static KV cache indexed by position.

transformers' static cache writes every sequence of a batch at the same column (its `cache_position`), so a
batch whose sequences stand at different positions has to grow the cache by S + 1 columns a round and mask
the rejected ones. Here each sequence writes its K/V at its own positions (column = position), as gpt-fast
and the serving engines do: a rejected draft's column is simply written again by the next round, the cache
never grows past prompt + new tokens + 2S columns (tfe.captured), and the mask is causality by position, computed on the
device from the positions themselves. Every shape is fixed for a (batch, S) pair, so a round's forward is
captured once as a CUDA graph and replayed (tfe.captured).

The math is transformers' `LlamaForCausalLM`, op for op in the model's dtype: RMSNorm in fp32 scaled by the
weight in the model's dtype, RoPE with cos and sin rounded to the model's dtype, attention by SDPA, the SiLU
MLP, logits in the model's dtype widened to fp32. The weights are the loaded model's own tensors (q, k, v
and gate, up are laid side by side once, so that each pair or triple is one GEMM). Grouped-query attention
runs as one SDPA call over the K/V heads, each with its group's query heads stacked along the query rows
(they share the mask), so the cache is never repeated per query head.

`StaticTarget.forward` also returns the taps: the inputs of the target's tap layers, side by side, as
tfe.target.Target.forward does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .target import Target


def _supported(config) -> None:
    """Refuses what this forward would compute differently from transformers' Llama."""
    problems = []
    if getattr(config, "model_type", "llama") != "llama":
        problems.append(f"model_type {config.model_type!r} (llama only)")
    rope = getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind != "default":
        problems.append(f"rope_scaling type {kind!r} (default RoPE only)")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        problems.append("attention_bias / mlp_bias")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.hidden_act!r} (silu only)")
    if problems:
        raise ValueError("the static-cache target does not support " + ", ".join(problems))


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta")
    if theta is None:
        raise ValueError("the target's config names no rope_theta")
    return float(theta)


class StaticTarget:
    """A target's forward over its own static KV cache of `batch` rows x `columns` positions.

    forward(tokens [B, q], positions [B, q]) -> (logits fp32 [B, q, V], taps [B, q, T * hidden]): writes each
    row's K/V at its position and attends columns 0 .. position. Positions must lie in 0 .. columns - 1 and
    every column a row attends must have been written, by this call or an earlier one (the loop guarantees it:
    each round writes positions n .. n + S, and the next starts at most at n + S + 1).
    """

    def __init__(self, target: Target, batch: int, columns: int, *, compile_layers: bool = False):
        model = target.model
        cfg = model.config
        _supported(cfg)
        if batch < 1 or columns < 1:
            raise ValueError(f"a static cache needs batch >= 1 and columns >= 1 (got {batch}, {columns})")
        self.target = target
        self.batch, self.columns = batch, columns
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.dtype = model.dtype
        dev = model.device
        half = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=dev).float() / self.head_dim
        self.inv_freq = 1.0 / (_rope_theta(cfg) ** half)
        with torch.no_grad():
            self.layers = []
            for layer in model.model.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append(
                    (
                        layer.input_layernorm.weight,
                        torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        a.o_proj.weight,
                        layer.post_attention_layernorm.weight,
                        torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        m.down_proj.weight,
                    )
                )
        self.embed = model.model.embed_tokens.weight
        self.norm = model.model.norm.weight
        self.lm_head = model.lm_head.weight
        self.tap_layers = list(target.tap_layers)
        shape = (len(self.layers), batch, self.kv_heads, columns, self.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.values = torch.zeros(shape, dtype=self.dtype, device=dev)
        self._batch_index = torch.arange(batch, device=dev)[:, None]
        self._columns = torch.arange(columns, device=dev)
        # Inductor fuses each layer's element-wise work (norms, RoPE, the SiLU gate) into a few kernels; one
        # compiled function serves all layers, whose shapes are equal.
        self._layer = self._layer_eager
        if compile_layers:
            # Dynamo keeps one compiled layer per (batch, rows, columns); past its recompile limit (8) it would
            # fall back to the eager ops without a word, and a process that runs every bucket and S needs more.
            config = torch._dynamo.config
            name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, name, max(getattr(config, name), 256))
            self._layer = torch.compile(self._layer_eager, dynamic=False)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x32.to(self.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        rotated = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rotated * sin

    def _layer_eager(self, x, weights, keys, values, cos, sin, positions, mask):
        """One decoder layer on x [B, q, hidden]; writes K/V at `positions` into keys/values [B, kvh, C, d]."""
        w_in, w_qkv, w_o, w_post, w_gate_up, w_down = weights
        B, q, _ = x.shape
        H, KV, d = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(self._rms(x, w_in), w_qkv)
        qh, kh, vh = qkv.split([H * d, KV * d, KV * d], dim=-1)
        qh = self._rope(qh.view(B, q, H, d).transpose(1, 2), cos, sin)
        kh = self._rope(kh.view(B, q, KV, d).transpose(1, 2), cos, sin)
        vh = vh.view(B, q, KV, d).transpose(1, 2)
        # Each row's K/V at its own position: index [b, :, positions[b, j]].
        b = self._batch_index[:B]
        keys[b, :, positions] = kh.transpose(1, 2)
        values[b, :, positions] = vh.transpose(1, 2)
        rep = H // KV
        # Query heads h = g * rep + r read K/V head g: the group's rep heads become rep x q query rows.
        grouped = qh.reshape(B, KV, rep * q, d)
        o = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=d**-0.5)
        o = o.reshape(B, H, q, d).transpose(1, 2).reshape(B, q, H * d)
        x = x + F.linear(o, w_o)
        gate, up = F.linear(self._rms(x, w_post), w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w_down)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, *, compiled: bool = True, logit_rows=None):
        """tokens, positions int64 [B, q] (B <= batch) -> (logits fp32 [B, q, V], taps [B, q, T * hidden]).
        `compiled` False runs the layers eagerly even where compile_layers was asked (the prefill, whose
        shapes change with the prompts). `logit_rows` [B]: logits only at that row of each sequence [B, V]
        (a prefill needs the last prompt row's alone)."""
        B, q = tokens.shape
        layer = self._layer if compiled else self._layer_eager
        freqs = positions.float()[..., None] * self.inv_freq  # [B, q, d/2]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, q, d]
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        seen = self._columns <= positions[..., None]  # [B, q, C]: causality by position
        rep = self.heads // self.kv_heads
        mask = seen[:, None, None].expand(B, 1, rep, q, self.columns).reshape(B, 1, rep * q, self.columns)
        x = F.embedding(tokens, self.embed)
        taps = {}
        for i, weights in enumerate(self.layers):
            if i in self.tap_layers:
                taps[i] = x
            x = layer(x, weights, self.keys[i, :B], self.values[i, :B], cos, sin, positions, mask)
        if len(self.layers) in self.tap_layers:
            taps[len(self.layers)] = x
        if logit_rows is not None:
            x = x[torch.arange(B, device=x.device), logit_rows]
        x = self._rms(x, self.norm)
        logits = F.linear(x, self.lm_head).float()
        return logits, torch.cat([taps[i] for i in self.tap_layers], dim=-1)
