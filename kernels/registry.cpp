#include "kernels/registry.h"

#include <algorithm>

#include "core/error.h"

namespace tfe {

std::string_view param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::ptr: return "ptr";
    case ParamKind::i64: return "i64";
    case ParamKind::f32: return "f32";
  }
  return "?";
}

namespace {
using P = ParamKind;

// Keep in step with the Params structs in kernels/*.cuh (checked by the compile test).
std::vector<KernelDef> make_defs() {
  return {
      // y[r] = rms(x[r]) with weights w; y may alias x. One block per row.
      {"rmsnorm", "rmsnorm.cuh", "tfe::kernels::rmsnorm", {"WIDTH", "THREADS"},
       {{"x", P::ptr}, {"x_stride", P::i64}, {"w", P::ptr}, {"y", P::ptr}, {"y_stride", P::i64},
        {"rows", P::i64}, {"eps", P::f32}}},
      // x[r] = concat(rms_in(embed[tokens[r]]), rms_hidden(g[r])): the layer input of width 2H.
      {"prepare_x", "prepare_x.cuh", "tfe::kernels::prepare_x", {"HIDDEN", "THREADS"},
       {{"embed", P::ptr}, {"input_norm", P::ptr}, {"hidden_norm", P::ptr}, {"tokens", P::ptr},
        {"g", P::ptr}, {"x", P::ptr}, {"rows", P::i64}, {"eps", P::f32}}},
      // dst[dst_index ? dst_index[r] : r] = src[src_index ? src_index[r] : r], WIDTH bf16 per row.
      {"copy_rows", "copy_rows.cuh", "tfe::kernels::copy_rows", {"WIDTH", "THREADS"},
       {{"src", P::ptr}, {"src_index", P::ptr}, {"dst", P::ptr}, {"dst_index", P::ptr}, {"rows", P::i64}}},
      // Few-row GEMV: y[r, j] = epilogue(sum_k w[j, k] x[r, k]) for r < rows <= ROWS (rows beyond ROWS
      // are covered by grid.y tiles). WEIGHT: kc::kWeight*; EPILOGUE: kc::kEpilogue*; COLS: output
      // columns per CTA, 16, or 32 without SwiGLU. kc::kEpilogueTop1 writes, in place of y's logits, one
      // 16-byte top1 partial per (row, CTA): y is [rows, ceil(N / COLS)] records. TILED: w in the tiled
      // weight layout (plan/weight_layout.h), else row-major.
      {"gemv", "gemv.cuh", "tfe::kernels::gemv", {"ROWS", "K", "N", "WEIGHT", "EPILOGUE", "COLS", "TILED"},
       {{"w", P::ptr}, {"scale", P::ptr}, {"x", P::ptr}, {"y", P::ptr}, {"residual", P::ptr}, {"rows", P::i64}}},
      // gemv over a narrow output (fewer than 64 tiles of 16 columns) with each column tile's K split over
      // a cluster of CSPLIT CTAs, joined through distributed shared memory; grid.x is gemv's times CSPLIT.
      {"gemv_cluster", "gemv.cuh", "tfe::kernels::gemv_cluster",
       {"ROWS", "K", "N", "WEIGHT", "EPILOGUE", "COLS", "TILED", "CSPLIT"},
       {{"w", P::ptr}, {"scale", P::ptr}, {"x", P::ptr}, {"y", P::ptr}, {"residual", P::ptr}, {"rows", P::i64}}},
      // The draft's wqkv GEMV (N = (HEADS + 2 KV_HEADS) x HEAD_DIM columns, [q | k | v]) with qk_rope_kv
      // as its epilogue, for heads without qk_norm: q rotated into q_out, k rotated and v as is into the
      // slot's ring row (pos[r] + pos_offset mod RING). ROWS, K, WEIGHT, COLS and TILED as for gemv.
      {"gemv_rope_kv", "gemv.cuh", "tfe::kernels::gemv_rope_kv",
       {"ROWS", "K", "WEIGHT", "COLS", "HEADS", "KV_HEADS", "HEAD_DIM", "RING", "TILED"},
       {{"w", P::ptr}, {"scale", P::ptr}, {"x", P::ptr}, {"inv_freq", P::ptr}, {"slot", P::ptr}, {"pos", P::ptr},
        {"pos_offset", P::i64}, {"q_out", P::ptr}, {"ring_k", P::ptr}, {"ring_v", P::ptr}, {"rows", P::i64}}},
      // qk_norm (if QK_NORM), RoPE at pos[r] + pos_offset, K/V written to the slot's ring row
      // (pos mod RING); q written to q_out when WRITE_Q. Input rows: [q | k | v] if WRITE_Q else [k | v].
      {"qk_rope_kv", "qk_rope_kv.cuh", "tfe::kernels::qk_rope_kv",
       {"HEADS", "KV_HEADS", "HEAD_DIM", "QK_NORM", "RING", "WRITE_Q"},
       {{"qkv", P::ptr}, {"q_norm", P::ptr}, {"k_norm", P::ptr}, {"inv_freq", P::ptr}, {"slot", P::ptr},
        {"pos", P::ptr}, {"pos_offset", P::i64}, {"q_out", P::ptr}, {"ring_k", P::ptr}, {"ring_v", P::ptr},
        {"rows", P::i64}, {"eps", P::f32}}},
      // One query row per slot against keys max(first_pos, p - WINDOW) .. p of the slot's ring; GQA.
      // first_pos[r] is the slot's first real position: a slot attached mid-sequence has no keys before it.
      // The window is cut into SPLIT <= 8 key chunks, a CTA each, one cluster per (kv head, row) that joins
      // its chunks' partials through distributed shared memory.
      {"ring_attention", "ring_attention.cuh", "tfe::kernels::ring_attention",
       {"HEADS", "KV_HEADS", "HEAD_DIM", "WINDOW", "RING", "SPLIT"},
       {{"q", P::ptr}, {"ring_k", P::ptr}, {"ring_v", P::ptr}, {"slot", P::ptr}, {"pos", P::ptr},
        {"first_pos", P::ptr}, {"pos_offset", P::i64}, {"o", P::ptr}, {"rows", P::i64}, {"scale", P::f32}}},
      // Vocabulary top-1 and its softmax confidence: one CTA per row joins the row's PARTS =
      // ceil(VOCAB / COLS) Top1Part records in `part`, which the lm_head gemv (EPILOGUE kc::kEpilogueTop1,
      // the same COLS) left, one per CTA and row; writes the target id (d2t) and confidence of `step` into
      // out_token/out_conf [rows, MAX_STEPS], and the target id into next_token[r].
      {"top1", "top1.cuh", "tfe::kernels::top1", {"VOCAB", "COLS", "MAX_STEPS"},
       {{"part", P::ptr}, {"d2t", P::ptr}, {"out_token", P::ptr}, {"out_conf", P::ptr}, {"next_token", P::ptr},
        {"step", P::i64}, {"rows", P::i64}}},
      // two_stage candidates: the CAND_K highest scores of a row (ties: lower id) as draft ids ascending,
      // into cand. One cluster of SPLIT <= 8 CTAs per row splits the row's scores; the CTAs agree on the
      // selection through distributed shared memory.
      {"topk", "topk.cuh", "tfe::kernels::topk", {"VOCAB", "CAND_K", "SPLIT"},
       {{"scores", P::ptr}, {"cand", P::ptr}, {"rows", P::i64}}},
      // two_stage: exact fp32 logits target_head[d2t(c)] . n of the candidates into exact, in candidate
      // order; the last CTA of a row to arrive (a ticket in `arrivals`) takes their argmax (ties: lower
      // target id) and softmax confidence, and writes like top1.
      {"rescore", "rescore.cuh", "tfe::kernels::rescore", {"HIDDEN", "CAND_K", "WEIGHT", "MAX_STEPS"},
       {{"target_head", P::ptr}, {"scale", P::ptr}, {"n", P::ptr}, {"cand", P::ptr}, {"d2t", P::ptr},
        {"exact", P::ptr}, {"arrivals", P::ptr}, {"out_token", P::ptr}, {"out_conf", P::ptr},
        {"next_token", P::ptr}, {"step", P::i64}, {"rows", P::i64}}},
      // The draft pass's first node: the call's tables (host_tables [rows <= 128, 4], a row's slot, pos,
      // first_pos and tok side by side) from host memory, where the host wrote them, into the four arena
      // tables. One CTA.
      {"load_tables", "load_tables.cuh", "tfe::kernels::load_tables", {},
       {{"host_tables", P::ptr}, {"slot", P::ptr}, {"pos", P::ptr}, {"first_pos", P::ptr}, {"tok", P::ptr},
        {"rows", P::i64}}},
      // The draft pass's last node: out_token / out_conf [rows, MAX_STEPS] copied into host memory
      // (host_token / host_conf), where the host reads them once host_done, set last, is 1. One CTA.
      {"store_outputs", "store_outputs.cuh", "tfe::kernels::store_outputs", {"MAX_STEPS"},
       {{"out_token", P::ptr}, {"out_conf", P::ptr}, {"host_token", P::ptr}, {"host_conf", P::ptr},
        {"host_done", P::ptr}, {"rows", P::i64}}},
  };
}
}  // namespace

const std::vector<KernelDef>& kernel_defs() {
  static const std::vector<KernelDef> defs = make_defs();
  return defs;
}

const KernelDef& kernel_def(std::string_view name) {
  for (const auto& d : kernel_defs())
    if (d.name == name) return d;
  fail("kernel registry: no kernel named `{}`", name);
}

int64_t KernelSpec::constant(std::string_view name) const {
  for (const auto& [k, v] : constants)
    if (k == name) return v;
  fail("kernel spec {}: no constant `{}`", kernel, name);
}

std::string KernelSpec::uri() const {
  std::string u = kernel;
  for (const auto& [k, v] : constants) {
    std::string lk = k;
    std::transform(lk.begin(), lk.end(), lk.begin(), [](unsigned char c) { return std::tolower(c); });
    u += fmt::format("__{}_{}", lk, v);
  }
  return u;
}

KernelSpec make_spec(std::string_view kernel, std::vector<std::pair<std::string, int64_t>> constants) {
  const auto& def = kernel_def(kernel);
  if (constants.size() != def.constants.size())
    fail("kernel spec {}: {} constants given, {} expected", kernel, constants.size(), def.constants.size());
  for (size_t i = 0; i < constants.size(); ++i)
    if (constants[i].first != def.constants[i])
      fail("kernel spec {}: constant {} is `{}`, expected `{}`", kernel, i, constants[i].first, def.constants[i]);
  return KernelSpec{std::string(kernel), std::move(constants)};
}

}  // namespace tfe
