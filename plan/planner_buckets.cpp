// The planner's passes (plan/planner.h): each kernel's shape, the draft pass of each streams bucket, and
// the extend.
#include <algorithm>

#include "plan/planner.h"
#include "core/extend_check.h"
#include "head/numerics.h"

namespace tfe::planning {

static_assert(kMaxFirstRank == kc::kMaxFirstRank, "ranked keeps kc::kMaxFirstRank + 1 logits a thread");

KernelSpec Planner::attention_spec(int64_t split) const {
  const auto& hh = h();
  return kd::RingAttentionConstants{.HEADS = hh.heads,
                                    .KV_HEADS = hh.kv_heads,
                                    .HEAD_DIM = hh.head_dim,
                                    .WINDOW = hh.window,
                                    .RING = p_.ring_rows,
                                    .SPLIT = split}
      .spec();
}

// Whether the layer's four linears all run in FP8: their launches then overlap best up to another bucket
// (Tuning::dependent_streams_fp8).
bool Planner::layer_fp8() const {
  for (auto m : {"wqkv", "wo", "w_gate_up", "w_down"})
    if (!matrices_.at(m).fp8) return false;
  return true;
}

// With AttentionSplit::same_drafts every bucket takes the largest bucket's split.
int64_t Planner::attention_split(int64_t rows) const {
  if (p_.options.attention_split == AttentionSplit::same_drafts) rows = p_.options.buckets.back();
  const int64_t keys = h().window + 1;
  int64_t split = std::min(max_cluster_ctas(p_.options), (keys + kAttnMinKeysPerCta - 1) / kAttnMinKeysPerCta);
  while (split > 1 && h().kv_heads * rows * split > kAttnWaveCtas && attention_smem(split - 1) <= kAttnSmemPerCta)
    --split;
  return split;
}

// The lm_head gemv's output columns per tile at `rows` rows (gemv() takes the same gemv_cols), and so the
// top1 partials per row: one per gemv column tile.
int64_t Planner::lm_head_cols(int64_t rows) const {
  const Matrix& m = matrices_.at("lm_head");
  return gemv_cols(rows, m.k, m.n, kc::kEpilogueTop1, m.weight_kind());
}

// topk's CTAs per row, one cluster: 8 keys a thread of 512 (a CTA per 4096 scores) up to the portable
// cluster size 8, so a 32000-score row spreads over 8 SMs and every pass's histogram is short; larger
// vocabularies give each thread more keys (registers up to 32: 131072 scores). Clusters need sm_90: one
// CTA a row below it.
int64_t Planner::topk_split() const {
  return std::clamp<int64_t>((h().draft_vocab + 4095) / 4096, 1, max_cluster_ctas(p_.options));
}

KernelSpec Planner::topk_spec() const {
  return kd::TopkConstants{.VOCAB = h().draft_vocab, .CAND_K = cand_k_, .SPLIT = topk_split()}.spec();
}

// A kernel node: the args are checked against the kernel's parameters (a mismatch is a planner bug).
Node Planner::kernel(std::string name, int step, const KernelSpec& spec, Node::Rows rows, int64_t launch_rows,
                     std::vector<Arg> args) {
  const KernelDef& def = kernel_def(spec.kernel);
  if (args.size() != def.params.size())
    fail("planner bug: node {} gives {} args, kernel {} takes {}", name, args.size(), spec.kernel, def.params.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& p = def.params[i];
    const auto k = args[i].kind;
    const bool fits = p.kind == ParamKind::ptr   ? (k == Arg::Kind::buffer || k == Arg::Kind::null)
                      : p.kind == ParamKind::i64 ? (k == Arg::Kind::i64 || k == Arg::Kind::rows)
                                                 : k == Arg::Kind::f32;
    if (args[i].param != p.name || !fits)
      fail("planner bug: node {} arg {} binds `{}`, kernel {} expects `{}` ({})", name, i, args[i].param, spec.kernel,
           p.name, param_kind_name(p.kind));
  }
  Node n;
  n.name = std::move(name);
  n.step = step;
  n.kind = Node::Kind::kernel;
  n.spec = spec.uri();
  n.launch = launch_shape(spec, launch_rows);
  n.args = std::move(args);
  n.rows = rows;
  specs_.emplace(n.spec, spec);
  return n;
}

int64_t Planner::gemv_cols(int64_t tile_rows, int64_t k, int64_t n, int64_t epilogue, int64_t weight) {
  const bool narrow = (n + 15) / 16 < 64;
  if (tile_rows <= 8 || epilogue == kc::kEpilogueSwiGLU || narrow || k < kGemvWideMinK) return 16;
  return weight == kc::kWeightFP8 || (n + 31) / 32 >= kGemvWideCtas ? 32 : 16;
}

int64_t Planner::gemv_cluster_split(const KernelSpec& g) const {
  if (!p_.tuning.gemv_cluster || g.constant("WEIGHT") != kc::kWeightFP8) return 1;
  const int64_t limit = std::min(max_cluster_ctas(p_.options), gemv_cluster_split_limit(g));
  const int64_t ctas = launch_shape(g, 1).grid[0];
  int64_t split = 1;
  while (split * 2 <= limit && ctas * split < kGemvClusterCtas) split *= 2;
  return split;
}

// A GEMV node over matrix m (rows first_row.. of it, n_out of them) for a fixed or dynamic row count.
Node Planner::gemv(std::string name, int step, const Matrix& m, int64_t tile_rows, int64_t epilogue, std::string x,
                   std::string y, Arg residual, Node::Rows rows, int64_t launch_rows, int64_t first_row,
                   int64_t n_out) {
  const int64_t n = n_out ? n_out : (epilogue == kc::kEpilogueSwiGLU ? m.n / 2 : m.n);
  const kd::GemvConstants g{.ROWS = tile_rows,
                            .K = m.k,
                            .N = n,
                            .WEIGHT = m.weight_kind(),
                            .EPILOGUE = epilogue,
                            .COLS = gemv_cols(tile_rows, m.k, n, epilogue, m.weight_kind()),
                            .TILED = m.tiled};
  auto spec = g.spec();
  if (const int64_t split = gemv_cluster_split(spec); split > 1)
    spec = kd::GemvClusterConstants{.ROWS = g.ROWS,
                                    .K = g.K,
                                    .N = g.N,
                                    .WEIGHT = g.WEIGHT,
                                    .EPILOGUE = g.EPILOGUE,
                                    .COLS = g.COLS,
                                    .TILED = g.TILED,
                                    .CSPLIT = split}
               .spec();
  return kernel(std::move(name), step, spec, rows, launch_rows,
                {m.w(first_row), m.scale(first_row), buf("x", std::move(x)), buf("y", std::move(y)),
                 std::move(residual), rows == Node::Rows::fixed ? i64("rows", launch_rows) : dyn_rows()});
}

// An FP8 GEMV right after a GEMV (w_down after w_gate_up, lr_b after lr_a) is launched plainly, not
// dependent: launched early, its CTAs land where the predecessor's last wave leaves room, unevenly, and
// FP8's one-wave w_down measured 3 us slower so (bf16's w_down, 2 us faster dependent, keeps it).
bool Planner::fp8_gemv_after_gemv(const Node& before, const Node& n) const {
  return is_gemv(before) && is_gemv(n) && specs_.at(n.spec).constant("WEIGHT") == kc::kWeightFP8;
}

bool Planner::gemv_after_full_grid(const Node& before, const Node& n) const {
  const auto& g = before.launch.grid;
  return is_gemv(n) && before.kind == Node::Kind::kernel && g[0] * g[1] * g[2] >= kSmCount;
}

bool Planner::is_gemv(const KernelSpec& spec) {
  return spec.kernel == "gemv" || spec.kernel == "gemv_cluster" || spec.kernel == "gemv_rope_kv";
}

Node Planner::wqkv_rope_kv(std::string name, int step, int64_t rows) {
  const Matrix& m = matrices_.at("wqkv");
  const auto& hh = h();
  auto spec = kd::GemvRopeKvConstants{.ROWS = rows,
                                      .K = m.k,
                                      .WEIGHT = m.weight_kind(),
                                      .COLS = gemv_cols(rows, m.k, m.n, kc::kEpilogueBF16, m.weight_kind()),
                                      .HEADS = hh.heads,
                                      .KV_HEADS = hh.kv_heads,
                                      .HEAD_DIM = hh.head_dim,
                                      .RING = p_.ring_rows,
                                      .TILED = m.tiled}
                  .spec();
  return kernel(std::move(name), step, spec, Node::Rows::fixed, rows,
                {m.w(), m.scale(), buf("x", "x"), buf("inv_freq", "rope_inv_freq"), buf("slot", "slot"),
                 buf("pos", "pos"), i64("pos_offset", step - 1), buf("q_out", "q"), buf("ring_k", "ring_k"),
                 buf("ring_v", "ring_v"), i64("rows", rows)});
}

KernelSpec Planner::rmsnorm_spec(int64_t width) const {
  return kd::RmsnormConstants{.WIDTH = width, .THREADS = row_threads(width)}.spec();
}

KernelSpec Planner::qk_rope_spec(bool write_q) const {
  return kd::QkRopeKvConstants{.HEADS = h().heads,
                               .KV_HEADS = h().kv_heads,
                               .HEAD_DIM = h().head_dim,
                               .QK_NORM = h().qk_norm ? 1 : 0,
                               .RING = p_.ring_rows,
                               .WRITE_Q = write_q ? 1 : 0}
      .spec();
}

Bucket Planner::draft_bucket(int streams) {
  const auto& hh = h();
  const int64_t B = streams, H = hh.hidden;
  const float eps = hh.rms_eps;
  const float scale = attention_scale(hh.head_dim);
  const auto fixed = Node::Rows::fixed;
  const Matrix &wqkv = matrices_.at("wqkv"), &wo = matrices_.at("wo"), &wgu = matrices_.at("w_gate_up"),
               &wd = matrices_.at("w_down");
  Bucket bucket;
  bucket.streams = streams;
  auto& nodes = bucket.nodes;
  const bool ranks = p_.options.first_ranks;
  nodes.push_back(
      kernel("s1.load_tables", 1, kd::LoadTablesConstants{.RANKS = ranks ? 1 : 0}.spec(), fixed, B,
             {buf("ids", "host_tables"), ranks ? buf("ranks", "host_ranks") : none("ranks"),
              buf("slot_state", "slot_state"), buf("slot", "slot"), buf("pos", "pos"), buf("first_pos", "first_pos"),
              buf("tok", "tok"), ranks ? buf("rank", "rank") : none("rank"), buf("error", "host_error"), i64("rows", B),
              i64("max_slots", p_.options.max_slots), i64("max_rank", ranks ? max_first_rank(hh) : 0)}));
  nodes.push_back(
      kernel("s1.gather_g", 1, kd::CopyRowsConstants{.WIDTH = H, .THREADS = row_threads(H)}.spec(), fixed, B,
             {buf("src", "slot_g"), buf("src_index", "slot"), buf("dst", "g"), none("dst_index"), i64("rows", B)}));
  for (int s = 1; s <= p_.options.max_steps; ++s) {
    const std::string pre = fmt::format("s{}.", s);
    const std::string g = s == 1 ? "g" : "h2";  // this step's hidden input (and wo's residual)
    nodes.push_back(kernel(
        pre + "prepare_x", s, kd::PrepareXConstants{.HIDDEN = H, .THREADS = row_threads(H)}.spec(), fixed, B,
        {buf("embed", "embed"), buf("input_norm", "input_norm"), buf("hidden_norm", "hidden_norm"),
         buf("tokens", s == 1 ? "tok" : "next_token"), buf("g", g), buf("x", "x"), i64("rows", B), f32("eps", eps)}));
    if (rope_in_wqkv()) {
      nodes.push_back(wqkv_rope_kv(pre + "wqkv", s, B));
    } else {
      nodes.push_back(gemv(pre + "wqkv", s, wqkv, B, kc::kEpilogueBF16, "x", "qkv", none("residual"), fixed, B));
      nodes.push_back(kernel(
          pre + "qk_rope_kv", s, qk_rope_spec(true), fixed, B,
          {buf("qkv", "qkv"), norm_arg("q_norm", "q_norm"), norm_arg("k_norm", "k_norm"),
           buf("inv_freq", "rope_inv_freq"), buf("slot", "slot"), buf("pos", "pos"), i64("pos_offset", s - 1),
           buf("q_out", "q"), buf("ring_k", "ring_k"), buf("ring_v", "ring_v"), i64("rows", B), f32("eps", eps)}));
    }
    nodes.push_back(kernel(
        pre + "attention", s, attention_spec(attention_split(B)), fixed, B,
        {buf("q", "q"), buf("ring_k", "ring_k"), buf("ring_v", "ring_v"), buf("slot", "slot"), buf("pos", "pos"),
         buf("first_pos", "first_pos"), i64("pos_offset", s - 1), buf("o", "o"), i64("rows", B), f32("scale", scale)}));
    nodes.push_back(gemv(pre + "wo", s, wo, B, kc::kEpilogueResidual, "o", "h1", buf("residual", g), fixed, B));
    nodes.push_back(kernel(pre + "post_norm", s, rmsnorm_spec(H), fixed, B,
                           {buf("x", "h1"), i64("x_stride", H), buf("w", "post_norm"), buf("y", "post"),
                            i64("y_stride", H), i64("rows", B), f32("eps", eps)}));
    nodes.push_back(gemv(pre + "w_gate_up", s, wgu, B, kc::kEpilogueSwiGLU, "post", "m", none("residual"), fixed, B));
    nodes.push_back(gemv(pre + "w_down", s, wd, B, kc::kEpilogueResidual, "m", "h2", buf("residual", "h1"), fixed, B));
    nodes.push_back(kernel(pre + "final_norm", s, rmsnorm_spec(H), fixed, B,
                           {buf("x", "h2"), i64("x_stride", H), buf("w", "final_norm"), buf("y", "n"),
                            i64("y_stride", H), i64("rows", B), f32("eps", eps)}));
    const int64_t ms = p_.options.max_steps;
    if (hh.head_type == HeadType::dense && s == 1 && ranks) {
      // The branches' step: every logit, then the row's rank of them.
      nodes.push_back(gemv(pre + "lm_head", s, matrices_.at("lm_head"), B, kc::kEpilogueF32, "n", "logits",
                           none("residual"), fixed, B));
      nodes.push_back(
          kernel(pre + "ranked", s, kd::RankedConstants{.VOCAB = hh.draft_vocab, .MAX_STEPS = ms}.spec(), fixed, B,
                 {buf("logits", "logits"), buf("rank", "rank"), buf("d2t", "d2t"), buf("out_token", "out_token"),
                  buf("out_conf", "out_conf"), buf("next_token", "next_token"), i64("step", s), i64("rows", B)}));
    } else if (hh.head_type == HeadType::dense) {
      nodes.push_back(gemv(pre + "lm_head", s, matrices_.at("lm_head"), B, kc::kEpilogueTop1, "n", "top1_part",
                           none("residual"), fixed, B));
      // top1 joins the records of the gemv just planned: its COLS fixes their count and order (validate
      // checks that `top1_part` holds them).
      const int64_t cols = specs_.at(nodes.back().spec).constant("COLS");
      nodes.push_back(kernel(
          pre + "top1", s, kd::Top1Constants{.VOCAB = hh.draft_vocab, .COLS = cols, .MAX_STEPS = ms}.spec(), fixed, B,
          {buf("part", "top1_part"), buf("d2t", "d2t"), buf("out_token", "out_token"), buf("out_conf", "out_conf"),
           buf("next_token", "next_token"), i64("step", s), i64("rows", B)}));
    } else {
      const Matrix& th = matrices_.at("target_head");
      nodes.push_back(
          gemv(pre + "lr_a", s, matrices_.at("lr_a"), B, kc::kEpilogueBF16, "n", "u", none("residual"), fixed, B));
      nodes.push_back(
          gemv(pre + "lr_b", s, matrices_.at("lr_b"), B, kc::kEpilogueF32, "u", "scores", none("residual"), fixed, B));
      nodes.push_back(kernel(pre + "topk", s, topk_spec(), fixed, B,
                             {buf("scores", "scores"), buf("cand", "cand"), i64("rows", B)}));
      nodes.push_back(kernel(
          pre + "rescore", s,
          kd::RescoreConstants{.HIDDEN = H, .CAND_K = cand_k_, .WEIGHT = th.weight_kind(), .MAX_STEPS = ms}.spec(),
          fixed, B,
          {buf("target_head", th.name), th.fp8 ? buf("scale", th.name + ".scale") : none("scale"), buf("n", "n"),
           buf("cand", "cand"), buf("d2t", "d2t"), buf("exact", "exact"), buf("arrivals", "rescore_arrivals"),
           buf("out_token", "out_token"), buf("out_conf", "out_conf"), buf("next_token", "next_token"), i64("step", s),
           i64("rows", B)}));
    }
    // The pass's outputs into host memory, once: only a pass whose last step is s runs this node.
    nodes.push_back(kernel(pre + "store_outputs", s, kd::StoreOutputsConstants{.MAX_STEPS = ms}.spec(), fixed, B,
                           {buf("out_token", "out_token"), buf("out_conf", "out_conf"), buf("host_token", "host_token"),
                            buf("host_conf", "host_conf"), buf("host_done", "host_done"), i64("rows", B)}));
    nodes.back().last_step_only = true;
  }
  if (streams <= dependent_streams())
    for (size_t i = 0; i < nodes.size(); ++i)
      nodes[i].dependent = i == 0 || !fp8_gemv_after_gemv(nodes[i - 1], nodes[i]);
  else if (p_.tuning.dependent_safe_nodes)
    for (size_t i = 0; i < nodes.size(); ++i)
      nodes[i].dependent = i == 0 || !gemv_after_full_grid(nodes[i - 1], nodes[i]);
  return bucket;
}

// A linear of the extend: cuBLASLt for bf16 (a chunk is up to extend_rows rows: compute-bound, the
// tensor-core GEMM's ground), the FP8 GEMV tiled over rows otherwise.
Node Planner::extend_linear(std::string name, const Matrix& m, int64_t first_row, int64_t n_out, std::string x,
                            std::string y, const std::string& subject) {
  const int64_t E = p_.options.extend_rows;
  if (!m.fp8) {
    choose(subject, "cublaslt gemm", fmt::format("up to {} rows a chunk: compute-bound, a tensor-core GEMM", E));
    Node n;
    n.name = std::move(name);
    n.kind = Node::Kind::gemm;
    n.rows = Node::Rows::chunk_rows;
    n.gemm = Gemm{m.name, first_row * m.k * 2, std::move(x), std::move(y), n_out, m.k};
    ++gemms_;
    return n;
  }
  choose(subject, fmt::format("gemv fp8 ROWS={} tiled over rows", kExtendGemvRows), "cuBLASLt has no e4m3 x bf16 form");
  return gemv(std::move(name), 0, m, kExtendGemvRows, kc::kEpilogueBF16, std::move(x), std::move(y), none("residual"),
              Node::Rows::chunk_rows, E, first_row, n_out);
}

void Planner::plan_extend() {
  const auto& hh = h();
  const int64_t H = hh.hidden, Ht = hh.target_hidden, T = static_cast<int64_t>(hh.taps.size());
  const int64_t E = p_.options.extend_rows;
  const float eps = hh.rms_eps;
  const auto chunk = Node::Rows::chunk_rows;
  auto& nodes = p_.extend;
  // Rows from device memory only: their taps and tokens into the tables, as host rows arrive.
  nodes.push_back(kernel("extend.gather_taps", 0,
                         kd::GatherTapsConstants{.WIDTH = T * Ht, .THREADS = row_threads(T * Ht)}.spec(), chunk, E,
                         {buf("row_taps_src", "row_taps_src"), buf("row_tok_src", "row_tok_src"), buf("taps", "taps"),
                          buf("row_tok", "row_tok"), buf("row_slot", "row_slot"), buf("error", "host_error"),
                          dyn_rows(), i64("vocab", hh.vocab)}));
  // Tap norms in place on the uploaded taps: tap i is the column slice [i*Ht, (i+1)*Ht) of each row.
  for (int64_t i = 0; i < T; ++i) {
    if (!hh.taps[static_cast<size_t>(i)].norm) continue;
    nodes.push_back(
        kernel(fmt::format("extend.tap_norm.{}", i), 0, rmsnorm_spec(Ht), chunk, E,
               {buf("x", "taps", i * Ht * 2), i64("x_stride", T * Ht), buf("w", fmt::format("tap_norm.{}", i)),
                buf("y", "taps", i * Ht * 2), i64("y_stride", T * Ht), dyn_rows(), f32("eps", eps)}));
  }
  nodes.push_back(extend_linear("extend.fc", matrices_.at("fc"), 0, H, "taps", "e_g", "fc extend"));
  nodes.push_back(kernel("extend.prepare_x", 0, kd::PrepareXConstants{.HIDDEN = H, .THREADS = row_threads(H)}.spec(),
                         chunk, E,
                         {buf("embed", "embed"), buf("input_norm", "input_norm"), buf("hidden_norm", "hidden_norm"),
                          buf("tokens", "row_tok"), buf("g", "e_g"), buf("x", "e_x"), dyn_rows(), f32("eps", eps)}));
  // Real rows need only K and V: the wk|wv rows of wqkv, contiguous after wq's, or their row-major copy
  // wkv beside a tiled bf16 wqkv.
  const int64_t q_rows = hh.heads * hh.head_dim, kv_rows = 2 * hh.kv_heads * hh.head_dim;
  const bool copy = matrices_.count("wkv") != 0;
  nodes.push_back(extend_linear("extend.kv", matrices_.at(copy ? "wkv" : "wqkv"), copy ? 0 : q_rows, kv_rows, "e_x",
                                "e_kv", "wk|wv extend"));
  nodes.push_back(
      kernel("extend.qk_rope_kv", 0, qk_rope_spec(false), chunk, E,
             {buf("qkv", "e_kv"), norm_arg("q_norm", "q_norm"), norm_arg("k_norm", "k_norm"),
              buf("inv_freq", "rope_inv_freq"), buf("slot", "row_slot"), buf("pos", "row_pos"), i64("pos_offset", 0),
              none("q_out"), buf("ring_k", "ring_k"), buf("ring_v", "ring_v"), dyn_rows(), f32("eps", eps)}));
  // Each touched slot keeps its last real row's g: the next pass's step 1 starts from it.
  nodes.push_back(kernel("extend.keep_g", 0, kd::CopyRowsConstants{.WIDTH = H, .THREADS = row_threads(H)}.spec(),
                         Node::Rows::chunk_slots, p_.options.max_slots,
                         {buf("src", "e_g"), buf("src_index", "last_row"), buf("dst", "slot_g"),
                          buf("dst_index", "last_slot"), dyn_rows()}));
  // ... and its position, first position and token: the next draft pass starts from them.
  nodes.push_back(
      kernel("extend.keep_state", 0, kd::KeepStateConstants{}.spec(), Node::Rows::chunk_slots, p_.options.max_slots,
             {buf("last_row", "last_row"), buf("last_slot", "last_slot"), buf("last_first", "last_first"),
              buf("row_pos", "row_pos"), buf("row_tok", "row_tok"), buf("slot_state", "slot_state"), dyn_rows()}));
}

}  // namespace tfe::planning
