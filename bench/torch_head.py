#!/usr/bin/env python3
"""The tfe draft head in plain PyTorch, as a user would write it from docs/head.md.

  torch_head.py --head HEAD.tfe [--drafts DRAFTS.safetensors] [--streams 1,2,4,8,16] [--steps 1,8]
                [--iters 50] [--device cuda|cpu] [--no-graph] [--json OUT.json]

It reads the .tfe (a safetensors file: the `safetensors` package when present, else its JSON header and
torch.frombuffer), keeps per slot a ring of K/V rows indexed by position mod R and the last real row's g,
exactly as tfe does, and then:
  * extends every slot with the real rows of DRAFTS (the prefix taps, tokens and positions written by
    `tfe-bench --drafts-out`, or the vectors of `tfe-plan reference`);
  * drafts `steps` tokens for slots 0..B-1 and compares them with tfe's (the drafts' `draft_tokens`):
    tokens equal, and at each slot's first disagreement why, from PyTorch's values there
    (`judge_disagreement`): a near-tie of the two tokens' logits, a near-tie at the cand_k boundary of the
    low-rank scores (two_stage), or neither (a near-tie is a disagreement that only the order of fp32 sums
    decides);
  * times one whole draft call (inputs up, the pass, tokens and confidences down, synchronized) eagerly and
    as one captured torch.cuda.CUDAGraph replay, for each streams B and steps S; per step = call / S.

Numerics follow the spec: bf16 storage between ops; fp32 sums, norm statistics, softmax and logits. Linears
run as bf16 GEMMs with fp32 accumulation (torch.mm(..., out_dtype=torch.float32) where this PyTorch has it,
so that a linear's output, a residual add and a logit are each rounded once; else F.linear, whose bf16
output makes each residual add a second rounding). FP8 linears run as a user runs e4m3 weights with bf16
activations in PyTorch: the weight is widened to bf16 at each call and multiplied, then the row scale is
applied (x @ q.to(bf16).T * scale). torch._scaled_mm needs both operands in FP8, so it does not apply to
bf16 activations.

Every part fails on its own: its error is printed and recorded in the JSON, and the rest still runs.

It imports nothing of tfe, unlike the loop's and the trainer's head (tfe.torch_head): it runs the .tfe
layout, two-stage vocabulary heads and FP8 linears included, which an EAGLE-3 checkpoint has no form for,
with the spec's bf16 roundings, and it must run where only torch is installed.
"""
import argparse
import json
import math
import mmap
import os
import struct
import sys
import time
import traceback
import warnings

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the script is useless without torch, but says so in its JSON too
    torch = None
    TORCH_ERROR = str(e)

LINEARS = ["fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head", "lr_a", "lr_b", "target_head"]


def linears_in_use(header):
    out = ["fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"]
    return out + (["lm_head"] if header["head_type"] == "dense" else ["lr_a", "lr_b", "target_head"])


def parse_list(text, lo, hi, option):
    values = []
    for item in text.split(","):
        if ".." in item:
            a, b = (int(v) for v in item.split(".."))
            values.extend(range(a, b + 1))
        else:
            values.append(int(item))
    for v in values:
        if not lo <= v <= hi:
            raise ValueError(f"{option} {text}: {v} is outside {lo}..{hi}")
    return values


# ---------------------------------------------------------------------------------------------- file reading

def torch_dtypes():
    return {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32, "F8_E4M3": torch.float8_e4m3fn,
            "F16": torch.float16, "I64": torch.int64}


class SafetensorsReader:
    """Tensors of a safetensors file by name. With the `safetensors` package when it is installed (and
    `loader` allows it), else by its layout: 8-byte little-endian header length, JSON header, raw data."""

    def __init__(self, path, loader="auto"):
        self.path = path
        self.how = None
        if loader in ("auto", "safetensors"):
            try:
                from safetensors import safe_open
                self._st = safe_open(path, framework="pt", device="cpu")
                self.metadata = self._st.metadata() or {}
                self.names = set(self._st.keys())
                self.how = "safetensors package"
            except Exception as e:  # not installed, or too old for F8_E4M3
                if loader == "safetensors":
                    raise
                self._why_manual = str(e)
        self._map = None
        if self.how is None:
            self._open_map()
            self.metadata = self._metadata
            self.names = set(self._entries)
            self.how = "json header + torch.frombuffer"

    def _open_map(self):
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the descriptor
        self._base = 8 + n
        self._metadata = header.pop("__metadata__", {}) or {}
        self._entries = header

    def get(self, name):
        if name not in self.names:
            raise KeyError(f"{self.path}: no tensor `{name}`")
        if self.how == "safetensors package":
            try:
                return self._st.get_tensor(name)
            except Exception:  # e.g. a package too old for F8_E4M3: read this tensor by the layout
                if self._map is None:
                    self._open_map()
        e = self._entries[name]
        begin, end = e["data_offsets"]
        dtype = torch_dtypes()[e["dtype"]]
        count = (end - begin) // torch.empty(0, dtype=dtype).element_size()
        with warnings.catch_warnings():  # a read-only map: the tensor is cloned before anyone writes
            warnings.simplefilter("ignore")
            t = torch.frombuffer(self._map, dtype=dtype, count=count, offset=self._base + begin)
        return t.reshape(e["shape"]).clone()


# --------------------------------------------------------------------------------------------------- the head

class Linear:
    """One linear [out, in]: bf16, or e4m3 with an fp32 scale per output row. `mode` is how its fp32 sums
    are had (see mm_mode): "mm" torch.mm with out_dtype=float32; "upcast" both operands widened to fp32
    (the CPU); "bf16" F.linear's bf16 output (then a residual add rounds twice, and logit heads keep an fp32
    copy of their weight so that logits are fp32 sums)."""

    def __init__(self, name, mode, w=None, q=None, scale=None, logits=False):
        self.name, self.mode, self.w, self.q, self.scale = name, mode, w, q, scale
        self.w32 = (w if q is None else q).float() if mode == "bf16" and logits else None

    def _weight_bf16(self):
        return self.w if self.q is None else self.q.to(torch.bfloat16)

    def acc(self, x):
        """fp32 [rows, out]: sum_k w_jk x_k, times scale_j for FP8."""
        if self.mode == "mm":
            a = torch.mm(x, self._weight_bf16().t(), out_dtype=torch.float32)
        elif self.mode == "upcast":
            a = F.linear(x.float(), (self.w if self.q is None else self.q).float())
        elif self.w32 is not None:
            a = F.linear(x.float(), self.w32)
        else:
            a = F.linear(x, self._weight_bf16()).float()
        return a if self.q is None else a * self.scale

    def __call__(self, x):
        """bf16(acc)."""
        if self.mode == "bf16" and self.q is None:
            return F.linear(x, self.w)
        return self.acc(x).to(torch.bfloat16)

    def residual(self, x, res):
        """bf16(res + acc), rounded once (twice in mode "bf16")."""
        return (res.float() + self.acc(x)).to(torch.bfloat16)


def mm_mode(device, forced="auto"):
    """How linears get their fp32 sums here, and a line that says so."""
    if forced == "upcast":
        return "upcast", "forced: linears widen both operands to fp32 (exact fp32 sums)"
    if forced == "bf16":
        return "bf16", "forced: F.linear in bf16, fp32 copies of the logit heads"
    if device.type != "cuda":
        return "upcast", "CPU: linears widen both operands to fp32 (exact fp32 sums)"
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(3, 64, generator=g).to(device, torch.bfloat16)
        b = torch.randn(5, 64, generator=g).to(device, torch.bfloat16)
        got = torch.mm(a, b.t(), out_dtype=torch.float32)
        want = a.float() @ b.float().t()
        if got.dtype != torch.float32 or (got - want).abs().max().item() > 1e-3:
            raise RuntimeError("a result other than the fp32 product")
        return "mm", "torch.mm(x, w.T, out_dtype=torch.float32): bf16 GEMM with fp32 output"
    except Exception as e:
        return "bf16", (f"torch.mm out_dtype unusable ({type(e).__name__}: {e}); F.linear in bf16, fp32 copies of "
                        "the logit heads")


class Head:
    def __init__(self, reader, device, fp8_linears, mode):
        md = reader.metadata
        if "tfe.header" not in md:
            raise ValueError(f"{reader.path}: no tfe.header in __metadata__ (not a .tfe head)")
        self.h = h = json.loads(md["tfe.header"])
        self.device = device
        bf16 = torch.bfloat16
        self.H, self.nh, self.nkv, self.hd = h["hidden"], h["heads"], h["kv_heads"], h["head_dim"]
        self.W, self.eps, self.dense = h["window"], float(h["rms_eps"]), h["head_type"] == "dense"
        self.taps = h["taps"]
        self.Ht = h["target_hidden"]

        def get(name, dtype=None):
            t = reader.get(name)
            return t.to(device) if dtype is None else t.to(device, dtype)

        self.linears = {}
        for name in linears_in_use(h):
            logits = name in ("lm_head", "lr_b")
            if name in fp8_linears:
                self.linears[name] = Linear(name, mode, q=get(name + ".fp8"), scale=get(name + ".scale", torch.float32),
                                            logits=logits)
            else:
                self.linears[name] = Linear(name, mode, w=get(name), logits=logits)
        self.norms = {n: get(n) for n in ["input_norm", "hidden_norm", "post_norm", "final_norm"]}
        if h["qk_norm"]:
            self.norms["q_norm"], self.norms["k_norm"] = get("q_norm"), get("k_norm")
        for i, tap in enumerate(self.taps):
            if tap["norm"]:
                self.norms[f"tap_norm.{i}"] = get(f"tap_norm.{i}")
        self.embed = get("embed")
        self.d2t = get("d2t").long()
        if not self.dense:
            self.cand_k = h["cand_k"]
        self.inv_freq = self._inv_freq().to(device)
        self.scale = (1.0 / torch.sqrt(torch.tensor(float(self.hd), dtype=torch.float32))).item()
        assert all(t.dtype == bf16 for t in self.norms.values())

    def _inv_freq(self):
        """theta^(-2i/hd) in fp32, then llama3 scaling in fp32 (as HF transformers computes it)."""
        r = self.h["rope"]
        inv = 1.0 / (torch.tensor(r["theta"], dtype=torch.float32) **
                     (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        if not r["llama3"]:
            return inv
        factor, low, high, old = r["factor"], r["low_freq_factor"], r["high_freq_factor"], r["original_max_positions"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)

    # rms(x) = bf16( w * bf16( x * rsqrt(mean(x^2) + eps) ) ), statistics in fp32
    def rms(self, x, w):
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(torch.bfloat16)
        return (w.float() * y.float()).to(torch.bfloat16)

    def rope(self, x, pos):
        """x [rows, heads, hd] bf16, pos [rows] int64: rotate-half in fp32, rounded once."""
        angle = pos.float()[:, None] * self.inv_freq[None, :]
        c, s = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
        half = self.hd // 2
        a, b = x[..., :half].float(), x[..., half:].float()
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(torch.bfloat16)

    def qk(self, x, pos):
        """K (and Q) of layer inputs x [rows, 2H] at positions pos: linear, qk_norm, RoPE."""
        rows = x.shape[0]
        k = self.linears["wk"](x).view(rows, self.nkv, self.hd)
        v = self.linears["wv"](x).view(rows, self.nkv, self.hd)
        q = self.linears["wq"](x).view(rows, self.nh, self.hd)
        if self.h["qk_norm"]:
            q, k = self.rms(q, self.norms["q_norm"]), self.rms(k, self.norms["k_norm"])
        return self.rope(q, pos), self.rope(k, pos), v

    def layer_input(self, tok, g):
        return torch.cat([self.rms(self.embed[tok], self.norms["input_norm"]), self.rms(g, self.norms["hidden_norm"])],
                         dim=-1)


class Slots:
    """Per slot: a ring of R rows of K and V (row = position mod R) and the last real row's g, on the
    device; the last real position and token, and the first position, on the host."""

    def __init__(self, head, n_slots, ring_rows):
        d, bf16 = head.device, torch.bfloat16
        self.head, self.R = head, ring_rows
        self.ring_k = torch.zeros(n_slots, ring_rows, head.nkv, head.hd, dtype=bf16, device=d)
        self.ring_v = torch.zeros_like(self.ring_k)
        self.g = torch.zeros(n_slots, head.H, dtype=bf16, device=d)
        self.first_pos, self.last_pos, self.last_tok = {}, {}, {}

    def extend(self, slots, taps, tokens, positions):
        """Real rows of several slots, at most R rows per slot (a longer run would overwrite its own keys).
        slots, positions: [rows] int64; taps [rows, T*Ht] bf16; tokens [rows] int64 (all on the device)."""
        hd = self.head
        rows = taps.shape[0]
        t = taps.view(rows, len(hd.taps), hd.Ht)
        parts = [hd.rms(t[:, i], hd.norms[f"tap_norm.{i}"]) if tap["norm"] else t[:, i] for i, tap in enumerate(hd.taps)]
        g = hd.linears["fc"](torch.cat(parts, dim=-1))
        x = hd.layer_input(tokens, g)
        k = hd.linears["wk"](x).view(rows, hd.nkv, hd.hd)
        v = hd.linears["wv"](x).view(rows, hd.nkv, hd.hd)
        if hd.h["qk_norm"]:
            k = hd.rms(k, hd.norms["k_norm"])
        k = hd.rope(k, positions)
        self.ring_k[slots, positions % self.R] = k
        self.ring_v[slots, positions % self.R] = v
        last = {}
        for i, (s, p, t) in enumerate(zip(slots.tolist(), positions.tolist(), tokens.tolist())):
            self.first_pos.setdefault(s, p)  # rows of a slot ascend: the last one is the slot's state
            self.last_pos[s], self.last_tok[s] = p, t
            last[s] = i
        self.g[list(last)] = g[list(last.values())]

    def inputs(self, slot_ids):
        """The [4, B] host table a draft call uploads: slot, last position, first position, last token."""
        return torch.tensor([slot_ids, [self.last_pos[s] for s in slot_ids], [self.first_pos[s] for s in slot_ids],
                             [self.last_tok[s] for s in slot_ids]], dtype=torch.int64)


def draft_pass(head, slots, table, steps, trace=False):
    """`steps` chained draft steps for the slots of `table` ([4, B] int64 on the device). Only tensor ops
    with static shapes: the same function runs eagerly and under CUDA-graph capture. Returns target
    tokens [B, steps] int64 and confidences [B, steps] fp32; with trace also, per step, the top-2 margin of
    the logits that picked the token, the runner-up's target id, and the values a disagreement is judged
    by (`StepTrace`)."""
    slot, pos, first, tok = table[0], table[1], table[2], table[3]
    B = slot.shape[0]
    W, R, nkv, hd = head.W, slots.R, head.nkv, head.hd
    group = head.nh // nkv
    g = slots.g[slot]
    offs = torch.arange(-W, 1, device=slot.device)
    toks, confs, margins, seconds, traces = [], [], [], [], []
    for step in range(steps):
        x = head.layer_input(tok, g)
        q, k, v = head.qk(x, pos)
        slots.ring_k[slot, pos % R] = k
        slots.ring_v[slot, pos % R] = v
        kpos = pos[:, None] + offs[None, :]  # [B, W+1] key positions, ascending
        K = slots.ring_k[slot[:, None], kpos % R].float()  # [B, W+1, nkv, hd]
        V = slots.ring_v[slot[:, None], kpos % R].float()
        s = torch.einsum("bngd,btnd->bngt", q.view(B, nkv, group, hd).float(), K) * head.scale
        s = s.masked_fill((kpos < first[:, None])[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bngt,btnd->bngd", p, V).to(torch.bfloat16).reshape(B, head.nh * hd)
        h1 = head.linears["wo"].residual(o, g)
        post = head.rms(h1, head.norms["post_norm"])
        a = F.silu(head.linears["w_gate"](post).float()).to(torch.bfloat16)
        m = (a.float() * head.linears["w_up"](post).float()).to(torch.bfloat16)
        h2 = head.linears["w_down"].residual(m, h1)
        n = head.rms(h2, head.norms["final_norm"])
        if head.dense:
            logits = head.linears["lm_head"].acc(n)  # [B, Vd] fp32
            best, draft_id = logits.max(dim=-1)  # first maximum: ties to the lower id
            target = draft_id + head.d2t[draft_id]
            pick_logits, cand_targets = logits, None
        else:
            scores = head.linears["lr_b"].acc(head.linears["lr_a"](n))  # [B, Vd] fp32
            cand = torch.topk(scores, head.cand_k, dim=-1).indices  # [B, K]
            cand_targets = cand + head.d2t[cand]
            th = head.linears["target_head"]
            # (FP8 rows are gathered through a uint8 view: not every PyTorch indexes float8 tensors.)
            rows = (th.w[cand_targets] if th.q is None else
                    th.q.view(torch.uint8)[cand_targets].view(torch.float8_e4m3fn)).float()  # [B, K, H]
            exact = (rows * n.float()[:, None, :]).sum(-1)
            if th.q is not None:
                exact = exact * th.scale[cand_targets]
            best, pick = exact.max(dim=-1)
            target = cand_targets.gather(1, pick[:, None])[:, 0]
            pick_logits = exact
        conf = 1.0 / torch.exp(pick_logits - best[:, None]).sum(-1)
        toks.append(target)
        confs.append(conf)
        if trace:
            top2 = torch.topk(pick_logits, 2, dim=-1)
            margins.append(top2.values[:, 0] - top2.values[:, 1])
            second = top2.indices[:, 1]
            seconds.append(second + head.d2t[second] if head.dense else cand_targets.gather(1, second[:, None])[:, 0])
            traces.append(StepTrace(pick_logits.cpu(), None if head.dense else scores.cpu(),
                                    None if head.dense else cand_targets.cpu()))
        g, tok, pos = h2, target, pos + 1
    out = (torch.stack(toks, 1), torch.stack(confs, 1))
    if trace:
        out += (torch.stack(margins, 1), torch.stack(seconds, 1), traces)
    return out


class StepTrace:
    """What one traced step decided by, on the host: `logits` [B, Vd] (dense) or the exact candidate logits
    [B, K] (two_stage), and for two_stage the low-rank `scores` [B, Vd] and the candidates' target ids
    `cand_targets` [B, K]."""

    def __init__(self, logits, scores, cand_targets):
        self.logits, self.scores, self.cand_targets = logits, scores, cand_targets


def judge_disagreement(head, t2d, st, b, tfe_target, torch_target, margin):
    """Why PyTorch's pick differs from tfe's at one step, from PyTorch's own values there:
      logit     both tokens are among the logits PyTorch chose from, within `margin` of each other;
      boundary  two_stage only: the token one side could not choose sits within `margin` of the cand_k
                boundary of PyTorch's low-rank scores (tfe's token just below PyTorch's K-th score, or
                PyTorch's pick just above its (K+1)-th: tfe's candidate set then differs by that token);
      none      neither: a disagreement no near-tie explains.
    Returns (kind, gap): the gap that decided it (logit units)."""
    d_tfe = int(t2d[tfe_target]) if 0 <= tfe_target < len(t2d) else -1
    if head.dense:
        logits = st.logits[b]
        gap = float(logits.max() - logits[d_tfe]) if d_tfe >= 0 else float("inf")
        return ("logit" if gap < margin else "none"), gap
    cands = st.cand_targets[b].tolist()
    exact = st.logits[b]
    scores = st.scores[b]
    top = torch.topk(scores, min(head.cand_k + 1, scores.numel())).values
    kth, next_ = float(top[head.cand_k - 1]), float(top[-1])
    if tfe_target in cands:
        gap = float(exact.max() - exact[cands.index(tfe_target)])
        if gap < margin:
            return "logit", gap
        d_torch = int(t2d[torch_target])
        edge = float(scores[d_torch]) - next_
        return ("boundary" if edge < margin else "none"), min(gap, edge)
    edge = kth - float(scores[d_tfe]) if d_tfe >= 0 else float("inf")
    return ("boundary" if edge < margin else "none"), edge


# -------------------------------------------------------------------------------------------------- timing

class DraftCall:
    """One draft call as an engine makes it: the [4, B] table up, the pass (eager, or one graph replay),
    tokens and confidences down into pinned memory, synchronized."""

    def __init__(self, head, slots, host_table, steps, graph, pool=None):
        self.head, self.slots, self.steps = head, slots, steps
        cuda = head.device.type == "cuda"
        self.host = host_table.pin_memory() if cuda else host_table
        self.table = self.host.to(head.device)
        B = host_table.shape[1]
        self.tok_host = torch.empty(B, steps, dtype=torch.int64, pin_memory=cuda)
        self.conf_host = torch.empty(B, steps, dtype=torch.float32, pin_memory=cuda)
        self.graph = None
        if graph:
            # Warm-up on the stream that then captures (cuBLAS handles and workspaces, allocator blocks).
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    draft_pass(head, slots, self.table, steps)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, stream=side):
                self.out = draft_pass(head, slots, self.table, steps)
            torch.cuda.synchronize()

    def __call__(self):
        cuda = self.head.device.type == "cuda"
        self.table.copy_(self.host, non_blocking=True)
        if self.graph is not None:
            self.graph.replay()
            tok, conf = self.out
        else:
            tok, conf = draft_pass(self.head, self.slots, self.table, self.steps)
        self.tok_host.copy_(tok, non_blocking=True)
        self.conf_host.copy_(conf, non_blocking=True)
        if cuda:
            torch.cuda.synchronize()
        return self.tok_host, self.conf_host


def time_call(call, warmup, iters):
    for _ in range(warmup):
        call()
    us = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    n = len(us)
    return {"median": us[n // 2] if n % 2 else 0.5 * (us[n // 2 - 1] + us[n // 2]),
            "p10": us[int(0.1 * (n - 1) + 0.5)], "p90": us[int(0.9 * (n - 1) + 0.5)], "min": us[0], "n": n}


# ------------------------------------------------------------------------------------------------------ main

def run(args, out, errors):
    def part(name, fn):
        t0 = time.perf_counter()
        try:
            r = fn()
            print(f"torch_head: {name:<24} {1e3 * (time.perf_counter() - t0):9.1f} ms", file=sys.stderr)
            return r
        except Exception as e:
            print(f"torch_head: {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(limit=3, file=sys.stderr)
            errors[name] = f"{type(e).__name__}: {e}"
            return None

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # set_device wants an index
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        torch.cuda.set_device(device)
        out["device"] = torch.cuda.get_device_name(device)
        # The spec's sums are fp32: no TF32. With --matmul bf16 ("as a user writes it") PyTorch keeps its
        # default, which lets cuBLAS split K with bf16 partial sums (its fast path for few rows); the
        # exact-numerics modes turn that off.
        torch.set_float32_matmul_precision("highest")
        if args.matmul != "bf16":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    else:
        out["device"] = "cpu"
    out["torch"] = torch.__version__

    reader = SafetensorsReader(args.head, args.loader)
    header = json.loads(reader.metadata["tfe.header"])
    out["preset"] = header["name"]
    out["head_type"] = header["head_type"]
    out["reader"] = reader.how

    drafts = SafetensorsReader(args.drafts, args.loader) if args.drafts else None
    in_use = linears_in_use(header)
    tfe_fp8 = None  # the linears tfe ran in FP8 for the drafts
    if drafts is not None and "tfe.fp8_linears" in drafts.metadata:
        tfe_fp8 = [l for l in drafts.metadata["tfe.fp8_linears"].split(",") if l]
    if args.fp8 is None and tfe_fp8 is not None:
        fp8_linears = tfe_fp8
        out["fp8_mode"] = drafts.metadata.get("tfe.fp8", "?") + " (from the drafts file)"
    else:
        fp8_mode = args.fp8 or "auto"
        fp8_linears = [l for l in in_use if fp8_mode != "off" and l in header["fp8"]]
        out["fp8_mode"] = fp8_mode
        if tfe_fp8 is not None and sorted(tfe_fp8) != sorted(fp8_linears):
            errors["fp8"] = (f"--fp8 {fp8_mode} runs {fp8_linears or 'no linear'} in FP8, but tfe ran "
                             f"{tfe_fp8 or 'none'} for the drafts: the agreement compares different heads")
            print(f"torch_head: warning: {errors['fp8']}", file=sys.stderr)
    out["fp8_linears"] = fp8_linears
    out["dtype"] = "fp8" if fp8_linears else "bf16"

    mode, how = mm_mode(device, args.matmul)
    out["matmul"] = how
    if fp8_linears:
        out["fp8_how"] = ("x @ q.to(bfloat16).T * scale: the e4m3 weight widened to bf16 at every call, the row "
                          "scale applied to the fp32 sums (torch._scaled_mm needs FP8 on both sides)")
    t0 = time.perf_counter()
    head = Head(reader, device, fp8_linears, mode)
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["load_s"] = time.perf_counter() - t0
    print(f"torch_head: {header['name']} ({out['dtype']}) on {out['device']}, torch {torch.__version__}; "
          f"{how}", file=sys.stderr)
    if fp8_linears:
        print(f"torch_head: FP8 as a user runs it in PyTorch: {out['fp8_how']}", file=sys.stderr)

    max_steps = 8
    ring_rows = int(drafts.metadata.get("tfe.ring_rows", head.W + 1 + max_steps)) if drafts else head.W + 1 + max_steps
    if ring_rows < head.W + 1 + max(args.steps):
        raise ValueError(f"ring of {ring_rows} rows < window {head.W} + 1 + steps {max(args.steps)}")
    out["ring_rows"] = ring_rows

    # The prefix: the drafts file's real rows, else window + 1 random rows per slot.
    if drafts is not None:
        taps, tokens, positions = drafts.get("taps"), drafts.get("tokens").long(), drafts.get("positions").long()
        n_slots = taps.shape[0]
    else:
        n_slots = max(args.streams)
        gen = torch.Generator().manual_seed(args.seed)
        rows = head.W + 1
        taps = torch.randn(n_slots, rows, len(head.taps) * head.Ht, generator=gen).to(torch.bfloat16)
        tokens = torch.randint(0, header["vocab"], (n_slots, rows), generator=gen)
        positions = torch.arange(rows).expand(n_slots, rows).contiguous()
    if max(args.streams) > n_slots:
        raise ValueError(f"--streams {max(args.streams)} exceeds the {n_slots} slots of the prefix")
    slots = Slots(head, n_slots, ring_rows)
    N = taps.shape[1]
    out["prefix_rows"] = N

    def extend_all():
        for first in range(0, N, ring_rows):  # ring-sized pieces, all slots side by side
            n = min(ring_rows, N - first)
            sl = torch.arange(n_slots).repeat_interleave(n)
            slots.extend(sl.to(device), taps[:, first:first + n].reshape(n_slots * n, -1).to(device),
                         tokens[:, first:first + n].reshape(-1).to(device),
                         positions[:, first:first + n].reshape(-1).to(device))
        if device.type == "cuda":
            torch.cuda.synchronize()

    if part("prefix extend", extend_all) is None and "prefix extend" in errors:
        return

    # Agreement with tfe on the drafts file's set: all its slots, its steps.
    if drafts is not None:
        def agreement():
            want = drafts.get("draft_tokens").long()
            want_conf = drafts.get("confidences").float()
            S = want.shape[1]
            table = slots.inputs(list(range(n_slots))).to(device)
            tok, conf, margin, second, traces = draft_pass(head, slots, table, S, trace=True)
            tok, conf, margin, second = tok.cpu(), conf.cpu(), margin.cpu(), second.cpu()
            # target id -> draft id, to look a target token up in the draft-vocabulary logits and scores.
            d2t = head.d2t.cpu()
            t2d = torch.full((header["vocab"],), -1, dtype=torch.int64)
            t2d[torch.arange(len(d2t)) + d2t] = torch.arange(len(d2t))
            equal = tok == want
            first_diff = []
            for b in range(n_slots):
                bad = (~equal[b]).nonzero()
                if len(bad):
                    s = int(bad[0])
                    kind, gap = judge_disagreement(head, t2d, traces[s], b, int(want[b, s]), int(tok[b, s]),
                                                   args.near_tie)
                    first_diff.append({"slot": b, "step": s + 1, "tfe": int(want[b, s]), "torch": int(tok[b, s]),
                                       "kind": kind, "gap": gap,
                                       "torch_top2_margin": float(margin[b, s]),
                                       "tfe_token_is_torch_second": int(second[b, s]) == int(want[b, s])})
            prefix_equal = sum((d["step"] - 1) for d in first_diff) + S * (n_slots - len(first_diff))
            step1 = equal[:, 0]
            r = {"slots": n_slots, "steps": S, "tokens_equal_pct": 100.0 * equal.float().mean().item(),
                 "steps_before_first_disagreement_pct": 100.0 * prefix_equal / (n_slots * S),
                 "step1_equal_pct": 100.0 * step1.float().mean().item(),
                 "slots_identical": n_slots - len(first_diff),
                 "near_tie_margin": args.near_tie,
                 "first_disagreements": first_diff,
                 "first_disagreements_near_ties": sum(d["kind"] != "none" for d in first_diff),
                 "first_disagreements_by_kind": {k: sum(d["kind"] == k for d in first_diff)
                                                 for k in ("logit", "boundary", "none")},
                 "step1_confidence_max_abs_diff": float((conf[:, 0] - want_conf[:, 0]).abs()[step1].max())
                 if step1.any() else None,
                 "tfe_source": drafts.metadata.get("tfe.source", "tfe-plan reference (CPU)")}
            out["agreement"] = r
            print(f"torch_head: drafts equal to tfe's: {r['tokens_equal_pct']:.1f}% of {n_slots}x{S} "
                  f"({r['slots_identical']} of {n_slots} slots identical; step 1 {r['step1_equal_pct']:.1f}%); "
                  f"first disagreements: {len(first_diff)}, near ties (gap < {args.near_tie}): "
                  f"{r['first_disagreements_near_ties']} {r['first_disagreements_by_kind']}", file=sys.stderr)
            for d in first_diff:
                print(f"  slot {d['slot']} step {d['step']}: tfe {d['tfe']}, torch {d['torch']}: {d['kind']} "
                      f"(gap {d['gap']:.4g}); torch top-2 margin {d['torch_top2_margin']:.4g}, tfe's token is "
                      f"torch's runner-up: {d['tfe_token_is_torch_second']}", file=sys.stderr)
        part("agreement", agreement)

    # Timing.
    pool = torch.cuda.graph_pool_handle() if device.type == "cuda" and not args.no_graph else None
    timing = []
    for B in args.streams:
        for S in args.steps:
            row = {"streams": B, "steps": S}
            host = slots.inputs(list(range(B)))
            call = part(f"eager B={B} S={S}", lambda: DraftCall(head, slots, host, S, graph=False))
            if call is not None:
                t = part(f"time eager B={B} S={S}", lambda: time_call(call, args.warmup, args.iters))
                if t:
                    row["eager_call_us"], row["eager_us_per_step"] = t, t["median"] / S
            if device.type == "cuda" and not args.no_graph:
                call = part(f"capture B={B} S={S}", lambda: DraftCall(head, slots, host, S, graph=True, pool=pool))
                if call is not None:
                    t = part(f"time graph B={B} S={S}", lambda: time_call(call, args.warmup, args.iters))
                    if t:
                        row["graph_call_us"], row["graph_us_per_step"] = t, t["median"] / S
                    # The graph computes what the eager pass computes.
                    tok_g, _ = call()
                    tok_e, _ = DraftCall(head, slots, host, S, graph=False)()
                    row["graph_equals_eager"] = bool(torch.equal(tok_g, tok_e))
            timing.append(row)
    out["timing"] = timing

    print(f"\ntorch {header['name']} ({out['dtype']}) on {out['device']}")
    print(f"{'streams':>7} {'steps':>5} {'eager us':>10} {'us/step':>9} {'graph us':>10} {'us/step':>9}")
    for r in timing:
        def cell(key, div=1):
            return f"{r[key]['median'] / div:.1f}" if key in r else "-"
        print(f"{r['streams']:>7} {r['steps']:>5} {cell('eager_call_us'):>10} {cell('eager_call_us', r['steps']):>9} "
              f"{cell('graph_call_us'):>10} {cell('graph_call_us', r['steps']):>9}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", required=True, help=".tfe head file")
    ap.add_argument("--drafts", help="prefix inputs and tfe's drafts (tfe-bench --drafts-out, or tfe-plan reference)")
    ap.add_argument("--fp8", choices=["auto", "off"], default=None,
                    help="FP8 forms to use (default: the linears the drafts file says tfe used, else auto)")
    ap.add_argument("--streams", default="1,2,4,8,16", help="slots per draft call, e.g. 1,2,4 or 1..4")
    ap.add_argument("--steps", default="1,8", help="draft steps per call")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1, help="seed of the random prefix when there is no drafts file")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--no-graph", action="store_true", help="eager only")
    ap.add_argument("--loader", choices=["auto", "safetensors", "manual"], default="auto",
                    help="how the files are read: the safetensors package, or their JSON header and torch.frombuffer")
    ap.add_argument("--matmul", choices=["auto", "mm", "upcast", "bf16"], default="auto",
                    help="how linears get fp32 sums (auto: torch.mm out_dtype on CUDA, upcast on the CPU)")
    ap.add_argument("--near-tie", type=float, default=0.05,
                    help="a first disagreement is a near-tie when the two tokens' logits (or, for two_stage, the "
                         "excluded token's low-rank score and the cand_k boundary) are closer than this")
    ap.add_argument("--json", help="write the results as JSON")
    args = ap.parse_args()

    out = {"tool": "torch_head", "head": args.head}
    errors = {}
    status = 0
    try:
        if torch is None:
            raise RuntimeError(f"PyTorch is not installed: {TORCH_ERROR}")
        args.streams = parse_list(args.streams, 1, 1024, "--streams")
        args.steps = parse_list(args.steps, 1, 8, "--steps")
        if args.device is None:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        run(args, out, errors)
    except Exception as e:
        print(f"torch_head: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc(limit=4, file=sys.stderr)
        errors["run"] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    if errors:
        status = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return status


if __name__ == "__main__":
    sys.exit(main())
