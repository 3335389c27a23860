#include <tfe/header.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "head/header_fields.h"

namespace tfe {

std::string_view head_type_name(HeadType t) { return t == HeadType::dense ? "dense" : "two_stage"; }

bool HeadHeader::has_fp8(std::string_view linear) const {
  return std::find(fp8.begin(), fp8.end(), linear) != fp8.end();
}

bool is_linear(std::string_view name) {
  return std::find(std::begin(kLinears), std::end(kLinears), name) != std::end(kLinears);
}

std::vector<std::string> linears_in_use(const HeadHeader& h) {
  std::vector<std::string> out = {"fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
  if (h.head_type == HeadType::dense) {
    out.push_back("lm_head");
  } else {
    out.insert(out.end(), {"lr_a", "lr_b", "target_head"});
  }
  return out;
}

namespace {

// Largest single dimension accepted; keeps every product of two dims far from int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;

void check_dim(std::string_view field, int64_t v) {
  if (v < 1 || v > kMaxDim) fail("head header: {} = {} is outside 1..{}", field, v, kMaxDim);
}

}  // namespace

IntegerRange header_integer_range(std::string_view key) {
  for (const char* dim : {"target_hidden", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "draft_vocab"})
    if (key == dim) return {1, kMaxDim};
  if (key == "lowrank") return {0, kMaxDim};  // 0: a dense head
  if (key == "window") return {1, kMaxWindow};
  if (key == "cand_k") return {0, kMaxCandK};  // 0: a dense head
  if (key == "original_max_positions") return {1, std::numeric_limits<int>::max()};
  fail("head header: `{}` is not an integer field", key);
}

void validate(const HeadHeader& h) {
  if (h.format_version != kHeadFormatVersion)
    fail("head header: format_version = {} is not supported (this build reads {})", h.format_version,
         kHeadFormatVersion);
  if (h.taps.empty() || h.taps.size() > static_cast<size_t>(kMaxTaps))
    fail("head header: taps has {} entries; 1..{} are allowed", h.taps.size(), kMaxTaps);
  for (size_t i = 0; i < h.taps.size(); ++i)
    if (h.taps[i].layer < -1) fail("head header: taps[{}].layer = {} must be >= 0 or `final`", i, h.taps[i].layer);
  check_dim("target_hidden", h.target_hidden);
  check_dim("hidden", h.hidden);
  check_dim("heads", h.heads);
  check_dim("kv_heads", h.kv_heads);
  check_dim("head_dim", h.head_dim);
  check_dim("ffn", h.ffn);
  check_dim("vocab", h.vocab);
  check_dim("draft_vocab", h.draft_vocab);
  if (h.head_dim % 2 != 0) fail("head header: head_dim = {} must be even (RoPE rotates pairs)", h.head_dim);
  if (h.heads % h.kv_heads != 0) fail("head header: heads = {} is not divisible by kv_heads = {}", h.heads, h.kv_heads);
  if (h.draft_vocab > h.vocab) fail("head header: draft_vocab = {} exceeds vocab = {}", h.draft_vocab, h.vocab);
  if (h.window < 1 || h.window > kMaxWindow) fail("head header: window = {} is outside 1..{}", h.window, kMaxWindow);
  if (!(std::isfinite(h.rms_eps) && h.rms_eps > 0.0f))
    fail("head header: rms_eps = {} must be finite and > 0", h.rms_eps);
  if (!(std::isfinite(h.rope.theta) && h.rope.theta > 1.0f))
    fail("head header: rope.theta = {} must be finite and > 1", h.rope.theta);
  if (h.rope.llama3) {
    if (!(std::isfinite(h.rope.factor) && h.rope.factor >= 1.0f))
      fail("head header: rope.factor = {} must be finite and >= 1", h.rope.factor);
    if (!(h.rope.low_freq_factor > 0.0f && h.rope.high_freq_factor > h.rope.low_freq_factor &&
          std::isfinite(h.rope.high_freq_factor)))
      fail("head header: rope.low_freq_factor = {} and high_freq_factor = {} must satisfy 0 < low < high",
           h.rope.low_freq_factor, h.rope.high_freq_factor);
    if (h.rope.original_max_positions < 1)
      fail("head header: rope.original_max_positions = {} must be >= 1", h.rope.original_max_positions);
  }
  if (h.head_type == HeadType::two_stage) {
    if (h.cand_k < 1 || h.cand_k > kMaxCandK) fail("head header: cand_k = {} is outside 1..{}", h.cand_k, kMaxCandK);
    if (h.cand_k > h.draft_vocab) fail("head header: cand_k = {} exceeds draft_vocab = {}", h.cand_k, h.draft_vocab);
    check_dim("lowrank", h.lowrank);
  } else {
    if (h.cand_k != 0) fail("head header: cand_k = {} is set but head_type is dense (must be 0)", h.cand_k);
    if (h.lowrank != 0) fail("head header: lowrank = {} is set but head_type is dense (must be 0)", h.lowrank);
  }
  std::set<std::string> seen;
  const auto in_use = linears_in_use(h);
  for (const auto& name : h.fp8) {
    if (!is_linear(name)) fail("head header: fp8 names `{}`, which is not a linear", name);
    if (std::find(in_use.begin(), in_use.end(), name) == in_use.end())
      fail("head header: fp8 names `{}`, which a {} head does not have", name, head_type_name(h.head_type));
    if (!seen.insert(name).second) fail("head header: fp8 names `{}` twice", name);
  }
}

std::vector<int64_t> linear_shape(const HeadHeader& h, std::string_view l) {
  const int64_t H = h.hidden, hd = h.head_dim;
  if (l == "fc") return {H, static_cast<int64_t>(h.taps.size()) * h.target_hidden};
  if (l == "wq") return {h.heads * hd, 2 * H};
  if (l == "wk" || l == "wv") return {h.kv_heads * hd, 2 * H};
  if (l == "wo") return {H, h.heads * hd};
  if (l == "w_gate" || l == "w_up") return {h.ffn, H};
  if (l == "w_down") return {H, h.ffn};
  if (l == "lm_head") return {h.draft_vocab, H};
  if (l == "lr_a") return {h.lowrank, H};
  if (l == "lr_b") return {h.draft_vocab, h.lowrank};
  if (l == "target_head") return {h.vocab, H};
  fail("linear_shape: `{}` is not a linear", l);
}

std::vector<TensorSpec> expected_tensors(const HeadHeader& h) {
  std::vector<TensorSpec> t;
  const int64_t H = h.hidden;
  t.push_back({"fc", DType::BF16, linear_shape(h, "fc")});
  for (size_t i = 0; i < h.taps.size(); ++i)
    if (h.taps[i].norm) t.push_back({"tap_norm." + std::to_string(i), DType::BF16, {h.target_hidden}});
  t.push_back({"embed", DType::BF16, {h.vocab, H}});
  t.push_back({"input_norm", DType::BF16, {H}});
  t.push_back({"hidden_norm", DType::BF16, {H}});
  for (auto l : {"wq", "wk", "wv", "wo"}) t.push_back({l, DType::BF16, linear_shape(h, l)});
  if (h.qk_norm) {
    t.push_back({"q_norm", DType::BF16, {h.head_dim}});
    t.push_back({"k_norm", DType::BF16, {h.head_dim}});
  }
  t.push_back({"post_norm", DType::BF16, {H}});
  for (auto l : {"w_gate", "w_up", "w_down"}) t.push_back({l, DType::BF16, linear_shape(h, l)});
  t.push_back({"final_norm", DType::BF16, {H}});
  t.push_back({"d2t", DType::I32, {h.draft_vocab}});
  if (h.head_type == HeadType::dense) {
    t.push_back({"lm_head", DType::BF16, linear_shape(h, "lm_head")});
  } else {
    for (auto l : {"lr_a", "lr_b", "target_head"}) t.push_back({l, DType::BF16, linear_shape(h, l)});
  }
  for (auto l : kLinears) {
    if (!h.has_fp8(l)) continue;
    auto shape = linear_shape(h, l);
    t.push_back({std::string(l) + ".fp8", DType::F8_E4M3, shape});
    t.push_back({std::string(l) + ".scale", DType::F32, {shape[0]}});
  }
  return t;
}

StepBytes step_bytes(const HeadHeader& h, int rows, bool fp8) {
  StepBytes b;
  auto linear_bytes = [&](std::string_view l) {
    auto s = linear_shape(h, l);
    const bool q = fp8 && h.has_fp8(l);
    return s[0] * s[1] * (q ? 1 : 2) + (q ? s[0] * 4 : 0);
  };
  for (auto l : {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}) b.weights += linear_bytes(l);
  // Norm weights: input, hidden, post, final (+ q/k norms).
  b.weights += 4 * h.hidden * 2 + (h.qk_norm ? 2 * h.head_dim * 2 : 0);
  if (h.head_type == HeadType::dense) {
    b.weights += linear_bytes("lm_head");
  } else {
    b.weights += linear_bytes("lr_a") + linear_bytes("lr_b");
    // Only the cand_k candidate rows of target_head are read, per row.
    const bool q = fp8 && h.has_fp8("target_head");
    b.weights += static_cast<int64_t>(rows) * h.cand_k * (h.hidden * (q ? 1 : 2) + (q ? 4 : 0));
  }
  // K and V of the window, per row (slot): (W + 1) keys x nkv x hd, bf16, both K and V.
  b.kv = static_cast<int64_t>(rows) * (h.window + 1) * h.kv_heads * h.head_dim * 2 * 2;
  // Per row: the embedding row read, and the step's activations are small; count the embedding row.
  b.activations = static_cast<int64_t>(rows) * h.hidden * 2;
  return b;
}

}  // namespace tfe
