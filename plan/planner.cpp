// make_plan: from a head header, its options and the tuning to the plan (plan/plan.h). Everything the
// runtime does is decided here, once, on the host; each decision that has an alternative is recorded as a
// Choice.
//
// Ordering within a draft step (one stream, so every node sees its predecessors' writes complete):
//   prepare_x reads (tok | next_token) and (g | h2)   -> x
//   wqkv x -> qkv; qk_rope_kv qkv -> q, ring K/V at pos + step - 1 (without qk_norm one node, gemv_rope_kv:
//   x -> q, ring K/V); attention q, ring -> o
//   wo o (+ residual g | h2) -> h1; post_norm h1 -> post; w_gate_up post -> m; w_down m (+ h1) -> h2
//   final_norm h2 -> n; vocabulary head n -> out_token/out_conf[:, step - 1] and next_token
// Buffer reuse across steps is safe because every read of a step-(j-1) value precedes the step-j write
// that replaces it: step j's prepare_x and wo read h2 before step j's w_down overwrites it, and step j's
// prepare_x reads next_token before step j's top1 / rescore overwrites it. Hence the graph of
// (B, s) is exactly the prefix of nodes with step <= s.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "plan/plan.h"
#include "kernels/weight_layout.h"
#include "head/numerics.h"

namespace tfe {

namespace {

constexpr int64_t kAlign = 256;
// Largest buffer or arena planned (1 PiB): keeps every byte count and offset exact in int64.
constexpr int64_t kMaxBytes = int64_t{1} << 50;
// Rows of the FP8 GEMV tile the extend uses in place of cuBLASLt.
constexpr int64_t kExtendGemvRows = 16;

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

int64_t checked_product(std::string_view what, const std::vector<int64_t>& dims, int64_t unit) {
  int64_t p = unit;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && p > kMaxBytes / d)) fail("plan: {} needs more than {} bytes", what, kMaxBytes);
    p *= d;
  }
  return p;
}

// Threads of a one-CTA-per-row kernel over `width` bf16: one 16-byte chunk per thread, 32..1024.
int64_t row_threads(int64_t width) {
  const int64_t chunks = (width + 7) / 8;
  return std::clamp<int64_t>(align_up(chunks, 32), 32, 1024);
}

Arg buf(std::string param, std::string buffer, int64_t byte_offset = 0) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::buffer;
  a.buffer = std::move(buffer);
  a.byte_offset = byte_offset;
  return a;
}
Arg i64(std::string param, int64_t v) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::i64;
  a.i = v;
  return a;
}
Arg f32(std::string param, float v) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::f32;
  a.f = v;
  return a;
}
Arg none(std::string param) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::null;
  return a;
}
Arg dyn_rows() {
  Arg a;
  a.param = "rows";
  a.kind = Arg::Kind::rows;
  return a;
}

// A matrix as the kernels read it: the bf16 or FP8 weight buffer (and its row scales).
struct Matrix {
  std::string name;  // weight buffer
  bool fp8 = false;
  int64_t n = 0, k = 0;
  bool tiled = false;  // Layout::tiled: only GEMVs read it
  int64_t weight_kind() const { return fp8 ? kc::kWeightFP8 : kc::kWeightBF16; }
  Arg w(int64_t first_row = 0) const { return buf("w", name, first_row * k * (fp8 ? 1 : 2)); }
  Arg scale(int64_t first_row = 0) const { return fp8 ? buf("scale", name + ".scale", first_row * 4) : none("scale"); }
};

class Planner {
 public:
  Planner(const HeadHeader& h, const PlanOptions& o, const Tuning& t, std::string sha) {
    validate(h);
    validate(o);
    validate(t);
    cand_k_ = plan_cand_k(h, o);
    p_.header = h;
    p_.options = o;
    p_.tuning = t;
    p_.head_sha256 = std::move(sha);
  }

  Plan run() {
    decide_ring();
    check_attention_fits();
    decide_fp8();
    lay_out_weights();
    lay_out_arena();
    lay_out_host();
    choose("draft tables and outputs",
           "host arena: s1.load_tables reads the tables, the last step's store_outputs writes the outputs and then "
           "host_done, which the host polls",
           "a draft call is then one graph launch and one wait, with no copy-engine transfer (BENCHMARKS.md \"A draft "
           "call without copies\")");
    for (int b : p_.options.buckets) p_.buckets.push_back(draft_bucket(b));
    const int dependent = dependent_streams();
    const bool above = dependent < p_.options.buckets.back() && p_.tuning.dependent_safe_nodes;
    std::string decision = dependent ? fmt::format("draft passes of buckets up to {} streams", dependent) : "";
    if (above)
      decision += fmt::format("{}every node but a GEMV after a grid of {} CTAs or more", dependent ? "; above, " : "",
                              kSmCount);
    if (decision.empty()) decision = "none";
    choose("dependent launch", decision,
           fmt::format("tuning {} = {}, dependent_safe_nodes = {}: a kernel launched early overlaps its "
                       "predecessor's end, except a GEMV whose grid would then land unevenly (BENCHMARKS.md "
                       "\"Dependent launch\")",
                       layer_fp8() ? "dependent_streams_fp8" : "dependent_streams", dependent,
                       p_.tuning.dependent_safe_nodes));
    plan_extend();
    finish();
    return std::move(p_);
  }

 private:
  const HeadHeader& h() const { return p_.header; }
  void choose(std::string subject, std::string decision, std::string reason) {
    p_.choices.push_back(Choice{std::move(subject), std::move(decision), std::move(reason)});
  }

  void decide_ring() {
    const auto& h = p_.header;
    p_.ring_rows = h.window + 1 + p_.options.max_steps;
    choose("ring_rows", std::to_string(p_.ring_rows),
           fmt::format("window + 1 + max_steps = {} + 1 + {}: the last step's W + 1 keys, and one row per draft "
                       "step so that no step overwrites a key a later step of the pass still reads",
                       h.window, p_.options.max_steps));
  }

  // ring_attention keeps a CTA's K/V ring, chunk scores, per-warp outputs and partial in shared memory, all
  // growing with the query heads a kv head (the group) and head_dim. A head whose attention cannot be
  // launched on the plan's arch is refused here, by its header fields, rather than at open on the device.
  void check_attention_fits() const {
    const auto& hh = h();
    if (hh.head_dim > kMaxAttentionHeadDim)
      fail("plan: head_dim = {} is above {}, the most ring_attention takes", hh.head_dim, kMaxAttentionHeadDim);
    const int64_t limit = max_smem_per_block(p_.options);
    for (int b : p_.options.buckets) {
      const int64_t split = attention_split(b), smem = attention_smem(split);
      if (smem > limit)
        fail(
            "plan: ring_attention needs {} bytes of shared memory a CTA for heads = {} over kv_heads = {} ({} a "
            "group), head_dim = {} and window = {} (SPLIT {} at {} streams); {} allows at most {}",
            smem, hh.heads, hh.kv_heads, hh.heads / hh.kv_heads, hh.head_dim, hh.window, split, b, p_.options.arch,
            limit);
    }
  }

  // FP8 or bf16 per linear in use, then per fused matrix (one dtype per matrix).
  void decide_fp8() {
    const auto& h = p_.header;
    const auto in_use = linears_in_use(h);
    if (p_.options.fp8 == Fp8Mode::require) {
      std::string missing;
      for (const auto& l : in_use)
        if (!h.has_fp8(l)) missing += (missing.empty() ? "" : ", ") + l;
      if (!missing.empty())
        fail("plan: fp8 = require, but the head has no FP8 form for {} (convert with FP8 forms, or use fp8 = auto)",
             missing);
    }
    std::map<std::string, bool> wants;
    for (const auto& l : in_use) wants[l] = p_.options.fp8 != Fp8Mode::off && h.has_fp8(l);
    auto group = [&](const std::string& fused, std::vector<std::string> parts) {
      std::string lacking;
      for (const auto& l : parts)
        if (!wants[l]) lacking += (lacking.empty() ? "" : ", ") + l;
      const bool all = lacking.empty();
      std::string joined;
      for (const auto& l : parts) joined += (joined.empty() ? "" : "|") + l;
      choose(fused, fmt::format("fuse {} ({})", joined, all ? "fp8" : "bf16"),
             all ? "one GEMV reads x once for all parts; every part has an FP8 form in use"
                 : fmt::format("one GEMV reads x once for all parts; one matrix has one dtype, and {} {} no FP8 "
                               "form in use, so the fused matrix is bf16",
                               lacking, parts.size() > 1 && lacking.find(',') != std::string::npos ? "have" : "has"));
      for (const auto& l : parts) {
        if (wants[l] && !all) wants[l] = false, fp8_dropped_.insert(l);
      }
      fused_fp8_[fused] = all;
    };
    group("wqkv", {"wq", "wk", "wv"});
    group("w_gate_up", {"w_gate", "w_up"});
    for (const auto& l : in_use) {
      std::string reason;
      if (p_.options.fp8 == Fp8Mode::off) {
        reason = "fp8 = off";
      } else if (fp8_dropped_.count(l)) {
        reason = "its FP8 form is left unused: the fused matrix it belongs to is bf16";
      } else if (h.has_fp8(l)) {
        reason = fmt::format("the head holds its FP8 form; fp8 = {}", fp8_mode_name(p_.options.fp8));
      } else {
        reason = "the head holds no FP8 form of it";
      }
      choose(l, wants[l] ? "fp8" : "bf16", reason);
      fp8_[l] = wants[l];
    }
    p_.fp8 = std::any_of(fp8_.begin(), fp8_.end(), [](const auto& kv) { return kv.second; });
  }

  Buffer& add(Arena& arena, std::string name, BufferRole role, DType dtype, std::vector<int64_t> shape,
              std::vector<std::string> from = {}) {
    Buffer b;
    b.bytes = checked_product(fmt::format("buffer `{}`", name), shape, dtype_size(dtype));
    b.name = std::move(name);
    b.role = role;
    b.dtype = dtype;
    b.shape = std::move(shape);
    b.alignment = kAlign;
    b.offset = align_up(arena.bytes, kAlign);
    b.from = std::move(from);
    if (b.offset > kMaxBytes - b.bytes) fail("plan: the arena holding `{}` exceeds {} bytes", b.name, kMaxBytes);
    arena.bytes = b.offset + b.bytes;
    arena.buffers.push_back(std::move(b));
    return arena.buffers.back();
  }

  // A weight matrix made of file linears concatenated along dim 0, in its chosen form.
  Matrix add_matrix(const std::string& name, const std::vector<std::string>& parts, bool fp8) {
    Matrix m{name, fp8, 0, linear_shape(h(), parts.front())[1]};
    std::vector<std::string> from, scales;
    for (const auto& l : parts) {
      m.n += linear_shape(h(), l)[0];
      from.push_back(fp8 ? l + ".fp8" : l);
      scales.push_back(l + ".scale");
    }
    m.tiled = tiled_form(m);
    add(p_.weights, name, BufferRole::weight, fp8 ? DType::F8_E4M3 : DType::BF16, {m.n, m.k}, from).layout =
        m.tiled ? Layout::tiled : Layout::rows;
    if (fp8) add(p_.weights, name + ".scale", BufferRole::weight, DType::F32, {m.n}, scales);
    matrices_[name] = m;
    return m;
  }

  // Whether matrix m is stored tiled (kernels/weight_layout.h): where every node that reads it is a GEMV, each
  // reading whole 16-row tiles, and its shape has whole tiles and K steps. The readers are known by name:
  // in bf16 the extend's fc and K/V GEMMs are cuBLASLt's (row-major): fc is read there alone, and a tiled
  // bf16 wqkv gets wkv, a row-major copy of its wk|wv rows, for the extend. target_head's rows are read one
  // by one by rescore. FP8's extend reads wqkv's wk|wv slice through the GEMV, from row heads x head_dim;
  // w_gate_up's up half starts at row n / 2.
  bool tiled_form(const Matrix& m) {
    const auto& hh = h();
    const int64_t row_bytes = m.k * (m.fp8 ? 1 : 2);
    std::string why;
    if (!p_.tuning.tiled_weights)
      why = "tuning tiled_weights = false";
    else if (m.name == "target_head")
      why = "rescore reads its candidate rows one by one";
    else if (!m.fp8 && (m.name == "fc" || m.name == "wkv"))
      why = "the extend's cuBLASLt GEMM reads it row-major";
    else if (!tileable(m.n, row_bytes))
      why = fmt::format("{} rows of {} bytes are not whole tiles of {} rows and {}-byte K steps", m.n, row_bytes,
                        kTileRows, kTileStepBytes);
    else if (m.fp8 && m.name == "wqkv" && (hh.heads * hh.head_dim) % kTileRows != 0)
      why = fmt::format("the extend's wk|wv slice starts at row {}, inside a tile", hh.heads * hh.head_dim);
    else if (m.name == "w_gate_up" && (m.n / 2) % kTileRows != 0)
      why = fmt::format("the up half starts at row {}, inside a tile", m.n / 2);
    (why.empty() ? tiled_ : rows_).push_back(why.empty() ? m.name : fmt::format("{} ({})", m.name, why));
    return why.empty();
  }

  void add_vector(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    add(p_.weights, name, BufferRole::weight, dtype, std::move(shape), {name});
  }

  void lay_out_weights() {
    const auto& hh = h();
    const int64_t H = hh.hidden;
    add_matrix("fc", {"fc"}, fp8_["fc"]);
    for (size_t i = 0; i < hh.taps.size(); ++i)
      if (hh.taps[i].norm) add_vector("tap_norm." + std::to_string(i), DType::BF16, {hh.target_hidden});
    add_vector("embed", DType::BF16, {hh.vocab, H});
    add_vector("input_norm", DType::BF16, {H});
    add_vector("hidden_norm", DType::BF16, {H});
    const Matrix wqkv = add_matrix("wqkv", {"wq", "wk", "wv"}, fused_fp8_["wqkv"]);
    if (!wqkv.fp8 && wqkv.tiled) add_matrix("wkv", {"wk", "wv"}, false);  // the extend's, row-major
    if (hh.qk_norm) {
      add_vector("q_norm", DType::BF16, {hh.head_dim});
      add_vector("k_norm", DType::BF16, {hh.head_dim});
    }
    add_matrix("wo", {"wo"}, fp8_["wo"]);
    add_vector("post_norm", DType::BF16, {H});
    add_matrix("w_gate_up", {"w_gate", "w_up"}, fused_fp8_["w_gate_up"]);
    add_matrix("w_down", {"w_down"}, fp8_["w_down"]);
    add_vector("final_norm", DType::BF16, {H});
    add_vector("d2t", DType::I32, {hh.draft_vocab});
    if (hh.head_type == HeadType::dense) {
      add_matrix("lm_head", {"lm_head"}, fp8_["lm_head"]);
    } else {
      add_matrix("lr_a", {"lr_a"}, fp8_["lr_a"]);
      add_matrix("lr_b", {"lr_b"}, fp8_["lr_b"]);
      add_matrix("target_head", {"target_head"}, fp8_["target_head"]);
    }
    add(p_.weights, "rope_inv_freq", BufferRole::weight, DType::F32, {hh.head_dim / 2}, {"computed:rope_inv_freq"});
  }

  void lay_out_arena() {
    const auto& hh = h();
    const auto& o = p_.options;
    const int64_t H = hh.hidden, slots = o.max_slots + 1, B = o.buckets.back(), E = o.extend_rows;
    const int64_t kv_width = hh.kv_heads * hh.head_dim, q_width = hh.heads * hh.head_dim;
    Arena& a = p_.arena;
    add(a, "ring_k", BufferRole::state, DType::BF16, {slots, p_.ring_rows, hh.kv_heads, hh.head_dim});
    add(a, "ring_v", BufferRole::state, DType::BF16, {slots, p_.ring_rows, hh.kv_heads, hh.head_dim});
    add(a, "slot_g", BufferRole::state, DType::BF16, {slots, H});
    // A slot's last real position, the first of its sequence, its last token and whether it holds one: what
    // a draft pass starts from, kept on the device by the extend pass (keep_state).
    add(a, "slot_state", BufferRole::state, DType::I32, {slots, kc::kSlotStateColumns});
    // An enqueued draft's slot ids, from the caller's stream (load_tables reads them).
    add(a, "draft_slots", BufferRole::input, DType::I32, {B});
    // The tables region: what an extend chunk uploads, in one copy. Rows from device memory upload the
    // addresses of their taps and token (row_taps_src, row_tok_src), and the chunk's first node
    // (gather_taps) fills `taps` and `row_tok` from them; host rows upload `taps` and `row_tok` themselves.
    p_.tables_offset = align_up(a.bytes, kAlign);
    for (auto t : {"row_slot", "row_pos", "row_tok"}) add(a, t, BufferRole::table, DType::I32, {E});
    for (auto t : {"row_taps_src", "row_tok_src"}) add(a, t, BufferRole::table, DType::I64, {E});
    for (auto t : {"last_row", "last_slot", "last_first"})
      add(a, t, BufferRole::table, DType::I32, {int64_t{o.max_slots}});
    add(a, "taps", BufferRole::table, DType::BF16, {E, static_cast<int64_t>(hh.taps.size()) * hh.target_hidden});
    p_.tables_bytes = a.bytes - p_.tables_offset;
    // Draft activations, for the largest bucket; each name is one value of the step. The draft's tables
    // first: the pass's first node (load_tables) fills them from the slot ids and slot_state.
    for (auto t : {"slot", "pos", "first_pos", "tok"}) add(a, t, BufferRole::activation, DType::I32, {B});
    add(a, "g", BufferRole::activation, DType::BF16, {B, H});
    add(a, "x", BufferRole::activation, DType::BF16, {B, 2 * H});
    if (!rope_in_wqkv()) add(a, "qkv", BufferRole::activation, DType::BF16, {B, q_width + 2 * kv_width});
    add(a, "q", BufferRole::activation, DType::BF16, {B, q_width});
    add(a, "o", BufferRole::activation, DType::BF16, {B, q_width});
    add(a, "h1", BufferRole::activation, DType::BF16, {B, H});
    add(a, "post", BufferRole::activation, DType::BF16, {B, H});
    add(a, "m", BufferRole::activation, DType::BF16, {B, hh.ffn});
    add(a, "h2", BufferRole::activation, DType::BF16, {B, H});
    add(a, "n", BufferRole::activation, DType::BF16, {B, H});
    if (hh.head_type == HeadType::dense) {
      // The lm_head gemv writes no logits: per row, one 16-byte record {max, lowest index at it (int32
      // bits), sum exp(l - max), 0} for each of its CTAs, which top1 joins. Sized for the most CTAs per row
      // over the buckets; a pass indexes the records by its own PARTS.
      int64_t parts = 0;
      for (int b : o.buckets) parts = std::max(parts, top1_parts(b));
      add(a, "top1_part", BufferRole::activation, DType::F32, {B, parts, kc::kTop1PartBytes / 4});
    } else {
      add(a, "u", BufferRole::activation, DType::BF16, {B, hh.lowrank});
      add(a, "scores", BufferRole::activation, DType::F32, {B, hh.draft_vocab});
      add(a, "cand", BufferRole::activation, DType::I32, {B, cand_k_});
      add(a, "exact", BufferRole::activation, DType::F32, {B, cand_k_});
      // rescore's per-row tickets: zero at open, and every pass returns them to zero.
      add(a, "rescore_arrivals", BufferRole::activation, DType::I32, {B});
    }
    add(a, "next_token", BufferRole::activation, DType::I32, {B});
    // Extend activations, for one chunk.
    add(a, "e_g", BufferRole::activation, DType::BF16, {E, H});
    add(a, "e_x", BufferRole::activation, DType::BF16, {E, 2 * H});
    add(a, "e_kv", BufferRole::activation, DType::BF16, {E, 2 * kv_width});
    add(a, "out_token", BufferRole::output, DType::I32, {B, int64_t{o.max_steps}});
    add(a, "out_conf", BufferRole::output, DType::F32, {B, int64_t{o.max_steps}});
  }

  // Mapped pinned host memory (Plan::host): a blocking draft's slot ids as the host writes them
  // (host_tables), the copy of its outputs that store_outputs writes for the host to read, the word
  // store_outputs sets last, which the host polls (host_done), and the record a kernel leaves when device
  // input the host never saw was bad (host_error).
  void lay_out_host() {
    const auto& o = p_.options;
    const int64_t B = o.buckets.back();
    add(p_.host, "host_tables", BufferRole::host, DType::I32, {B});
    add(p_.host, "host_token", BufferRole::host, DType::I32, {B, int64_t{o.max_steps}});
    add(p_.host, "host_conf", BufferRole::host, DType::F32, {B, int64_t{o.max_steps}});
    add(p_.host, "host_done", BufferRole::host, DType::I32, {1});
    add(p_.host, "host_error", BufferRole::host, DType::I64, {1});
  }

  // ring_attention key chunks per (kv head, row) at `rows` rows: at least 32 keys a CTA, and up to 8 CTAs
  // (the portable cluster size), so that one row's window covers kv_heads x SPLIT CTAs instead of kv_heads
  // walking it serially, and a cluster joins the chunks through distributed shared memory. A chunk must
  // pay for its CTA's share of the join: tfe-two-stage's 129 keys took up to 4 us a step longer at 1-8
  // streams at 17 keys a CTA (SPLIT 8) than at 26 (SPLIT 5), and 43 (SPLIT 3) was mixed (BENCHMARKS.md).
  // Where that grid would exceed one wave (kAttnWaveCtas) the chunks grow, one CTA a cluster fewer at a
  // time, while five CTAs still fit an SM's shared memory: a CTA streams its chunk through a ring of K/V
  // tiles, so a longer chunk costs only its bytes, but a second wave costs a whole CTA's chain of loads,
  // scores and join.
  // One wave: 5 CTAs an SM (the kernel's launch bounds) on 132 SMs is 660, less the SMs that clusters
  // leave idle at the edges of GPCs (at 4 an SM an H200 held 124 clusters of 4: 496 of 528 CTAs).
  static constexpr int64_t kAttnMinKeysPerCta = 32;
  static constexpr int64_t kAttnWaveCtas = 512;
  static constexpr int64_t kAttnSmemPerCta = 44 * 1024;  // 5 CTAs (and 1 KB each for the driver) in 228 KB
  int64_t attention_smem(int64_t split) const { return launch_shape(attention_spec(split), 1).smem; }
  KernelSpec attention_spec(int64_t split) const {
    const auto& hh = h();
    return make_spec("ring_attention", {{"HEADS", hh.heads},
                                        {"KV_HEADS", hh.kv_heads},
                                        {"HEAD_DIM", hh.head_dim},
                                        {"WINDOW", hh.window},
                                        {"RING", p_.ring_rows},
                                        {"SPLIT", split}});
  }
  // Whether the layer's four linears all run in FP8: their launches then overlap best up to another bucket
  // (Tuning::dependent_streams_fp8).
  bool layer_fp8() const {
    for (auto m : {"wqkv", "wo", "w_gate_up", "w_down"})
      if (!matrices_.at(m).fp8) return false;
    return true;
  }
  int dependent_streams() const { return layer_fp8() ? p_.tuning.dependent_streams_fp8 : p_.tuning.dependent_streams; }

  // With AttentionSplit::same_drafts every bucket takes the largest bucket's split.
  int64_t attention_split(int64_t rows) const {
    if (p_.options.attention_split == AttentionSplit::same_drafts) rows = p_.options.buckets.back();
    const int64_t keys = h().window + 1;
    int64_t split = std::min(max_cluster_ctas(p_.options), (keys + kAttnMinKeysPerCta - 1) / kAttnMinKeysPerCta);
    while (split > 1 && h().kv_heads * rows * split > kAttnWaveCtas && attention_smem(split - 1) <= kAttnSmemPerCta)
      --split;
    return split;
  }

  // The lm_head gemv's output columns per tile at `rows` rows (gemv() takes the same gemv_cols), and so the
  // top1 partials per row: one per gemv column tile.
  int64_t lm_head_cols(int64_t rows) const {
    const Matrix& m = matrices_.at("lm_head");
    return gemv_cols(rows, m.k, m.n, kc::kEpilogueTop1, m.weight_kind());
  }
  int64_t top1_parts(int64_t rows) const { return (h().draft_vocab + lm_head_cols(rows) - 1) / lm_head_cols(rows); }

  // topk's CTAs per row, one cluster: 8 keys a thread of 512 (a CTA per 4096 scores) up to the portable
  // cluster size 8, so a 32000-score row spreads over 8 SMs and every pass's histogram is short; larger
  // vocabularies give each thread more keys (registers up to 32: 131072 scores). Clusters need sm_90: one
  // CTA a row below it.
  int64_t topk_split() const {
    return std::clamp<int64_t>((h().draft_vocab + 4095) / 4096, 1, max_cluster_ctas(p_.options));
  }
  KernelSpec topk_spec() const {
    return make_spec("topk", {{"VOCAB", h().draft_vocab}, {"CAND_K", cand_k_}, {"SPLIT", topk_split()}});
  }

  // A kernel node: the args are checked against the kernel's parameters (a mismatch is a planner bug).
  Node kernel(std::string name, int step, const KernelSpec& spec, Node::Rows rows, int64_t launch_rows,
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

  // Output columns per gemv CTA. 32 halves the x traffic per weight byte, which above 8 rows costs as
  // much L2 and shared-memory traffic as the weights (twice as much in FP8). In bf16 it also halves the
  // CTAs, which slows every linear with fewer than about 4 CTAs per SM left, and a short K (lr_b, K = 512)
  // has CTAs too brief to gain (kernels/README.md, COLS): there 32 only where at least kGemvWideCtas
  // remain and K is at least kGemvWideMinK, which at the shapes of today's heads is the dense vocabulary
  // head (lm_head) alone. In FP8, 32 columns run a 3-stage ring of weights and x in dynamic shared memory
  // (kernels/gemv.cuh, DYNAMIC), which measured faster for every linear with K >= kGemvWideMinK whatever
  // its CTA count (bench_gemv, rows 16, us at COLS 16 -> 32: wqkv 19.8 -> 19.5, wo 9.5 -> 9.1, w_down
  // 27.2 -> 22.7). Neither applies to SwiGLU (its two weight tiles are gate and up) nor to a narrow output
  // (fewer than 64 tiles of 16 columns, kernels/gemv.cuh NARROW).
  static constexpr int64_t kGemvWideCtas = 512, kGemvWideMinK = 2048;
  static int64_t gemv_cols(int64_t tile_rows, int64_t k, int64_t n, int64_t epilogue, int64_t weight) {
    const bool narrow = (n + 15) / 16 < 64;
    if (tile_rows <= 8 || epilogue == kc::kEpilogueSwiGLU || narrow || k < kGemvWideMinK) return 16;
    return weight == kc::kWeightFP8 || (n + 31) / 32 >= kGemvWideCtas ? 32 : 16;
  }

  // A narrow output (fewer than 64 column tiles of 16, kernels/gemv.cuh NARROW) leaves most SMs idle, and
  // each tile's K streams at the rate of one CTA's loads in flight. gemv_cluster splits every tile's K over
  // a cluster: the fewest CTAs a tile (a power of two) that give the GEMV kGemvClusterCtas CTAs, within the
  // arch's cluster size and so that every warp of the cluster keeps a K step of its own. 1: a plain gemv.
  // FP8 weights only: tfe-two-stage's lr_a measured 0.5-2 us a step faster so in FP8 and 1-2 us slower in
  // bf16, where the plain gemv's weights (loaded before the wait for the predecessor) already stream
  // while the norm before it runs, and the cluster's join is then what is left (BENCHMARKS.md).
  static constexpr int64_t kGemvClusterCtas = 128;  // about an H100's or H200's SMs (132)
  int64_t gemv_cluster_split(const KernelSpec& g) const {
    if (!p_.tuning.gemv_cluster || g.constant("WEIGHT") != kc::kWeightFP8) return 1;
    const int64_t limit = std::min(max_cluster_ctas(p_.options), gemv_cluster_split_limit(g));
    const int64_t ctas = launch_shape(g, 1).grid[0];
    int64_t split = 1;
    while (split * 2 <= limit && ctas * split < kGemvClusterCtas) split *= 2;
    return split;
  }

  // A GEMV node over matrix m (rows first_row.. of it, n_out of them) for a fixed or dynamic row count.
  Node gemv(std::string name, int step, const Matrix& m, int64_t tile_rows, int64_t epilogue, std::string x,
            std::string y, Arg residual, Node::Rows rows, int64_t launch_rows, int64_t first_row = 0,
            int64_t n_out = 0) {
    const int64_t n = n_out ? n_out : (epilogue == kc::kEpilogueSwiGLU ? m.n / 2 : m.n);
    auto spec = make_spec("gemv", {{"ROWS", tile_rows},
                                   {"K", m.k},
                                   {"N", n},
                                   {"WEIGHT", m.weight_kind()},
                                   {"EPILOGUE", epilogue},
                                   {"COLS", gemv_cols(tile_rows, m.k, n, epilogue, m.weight_kind())},
                                   {"TILED", m.tiled}});
    if (const int64_t split = gemv_cluster_split(spec); split > 1) {
      auto constants = spec.constants;
      constants.emplace_back("CSPLIT", split);
      spec = make_spec("gemv_cluster", std::move(constants));
    }
    return kernel(std::move(name), step, spec, rows, launch_rows,
                  {m.w(first_row), m.scale(first_row), buf("x", std::move(x)), buf("y", std::move(y)),
                   std::move(residual), rows == Node::Rows::fixed ? i64("rows", launch_rows) : dyn_rows()});
  }

  // An FP8 GEMV right after a GEMV (w_down after w_gate_up, lr_b after lr_a) is launched plainly, not
  // dependent: launched early, its CTAs land where the predecessor's last wave leaves room, unevenly, and
  // FP8's one-wave w_down measured 3 us slower so (bf16's w_down, 2 us faster dependent, keeps it).
  bool fp8_gemv_after_gemv(const Node& before, const Node& n) const {
    return is_gemv(before) && is_gemv(n) && specs_.at(n.spec).constant("WEIGHT") == kc::kWeightFP8;
  }
  // Above dependent_streams (Tuning::dependent_safe_nodes): a GEMV after a grid of at least one CTA an SM
  // is launched plainly, for the same reason as above, in bf16 too: at 8-16 streams its one or two waves are
  // what the step's time follows. After a smaller grid (a norm's, attention's at one CTA a row) the SMs it
  // leaves free take the GEMV's first CTAs evenly; small kernels have one short wave and gain the overlap.
  static constexpr int64_t kSmCount = 132;  // an H100 SXM's or H200's SMs
  bool gemv_after_full_grid(const Node& before, const Node& n) const {
    const auto& g = before.launch.grid;
    return is_gemv(n) && before.kind == Node::Kind::kernel && g[0] * g[1] * g[2] >= kSmCount;
  }
  static bool is_gemv(const KernelSpec& spec) {
    return spec.kernel == "gemv" || spec.kernel == "gemv_cluster" || spec.kernel == "gemv_rope_kv";
  }
  bool is_gemv(const Node& n) const { return n.kind == Node::Kind::kernel && is_gemv(specs_.at(n.spec)); }

  // The draft's RoPE in the wqkv GEMV's epilogue (gemv_rope_kv): a head without qk_norm, whose rotate-half
  // pairs the GEMV's 16-column tiles can hold 8 at a time. qk_norm needs a head's whole sum of squares,
  // which spans HEAD_DIM / 16 tiles (CTAs), before any element is rotated.
  bool rope_in_wqkv() const { return p_.tuning.rope_in_wqkv && !h().qk_norm && h().head_dim % 16 == 0; }
  Node wqkv_rope_kv(std::string name, int step, int64_t rows) {
    const Matrix& m = matrices_.at("wqkv");
    const auto& hh = h();
    auto spec = make_spec("gemv_rope_kv", {{"ROWS", rows},
                                           {"K", m.k},
                                           {"WEIGHT", m.weight_kind()},
                                           {"COLS", gemv_cols(rows, m.k, m.n, kc::kEpilogueBF16, m.weight_kind())},
                                           {"HEADS", hh.heads},
                                           {"KV_HEADS", hh.kv_heads},
                                           {"HEAD_DIM", hh.head_dim},
                                           {"RING", p_.ring_rows},
                                           {"TILED", m.tiled}});
    return kernel(std::move(name), step, spec, Node::Rows::fixed, rows,
                  {m.w(), m.scale(), buf("x", "x"), buf("inv_freq", "rope_inv_freq"), buf("slot", "slot"),
                   buf("pos", "pos"), i64("pos_offset", step - 1), buf("q_out", "q"), buf("ring_k", "ring_k"),
                   buf("ring_v", "ring_v"), i64("rows", rows)});
  }

  KernelSpec rmsnorm_spec(int64_t width) const {
    return make_spec("rmsnorm", {{"WIDTH", width}, {"THREADS", row_threads(width)}});
  }

  KernelSpec qk_rope_spec(bool write_q) const {
    return make_spec("qk_rope_kv", {{"HEADS", h().heads},
                                    {"KV_HEADS", h().kv_heads},
                                    {"HEAD_DIM", h().head_dim},
                                    {"QK_NORM", h().qk_norm ? 1 : 0},
                                    {"RING", p_.ring_rows},
                                    {"WRITE_Q", write_q ? 1 : 0}});
  }
  Arg norm_arg(const char* param, const char* buffer) const { return h().qk_norm ? buf(param, buffer) : none(param); }

  Bucket draft_bucket(int streams) {
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
    nodes.push_back(kernel("s1.load_tables", 1, make_spec("load_tables", {}), fixed, B,
                           {buf("ids", "host_tables"), buf("slot_state", "slot_state"), buf("slot", "slot"),
                            buf("pos", "pos"), buf("first_pos", "first_pos"), buf("tok", "tok"),
                            buf("error", "host_error"), i64("rows", B), i64("max_slots", p_.options.max_slots)}));
    nodes.push_back(
        kernel("s1.gather_g", 1, make_spec("copy_rows", {{"WIDTH", H}, {"THREADS", row_threads(H)}}), fixed, B,
               {buf("src", "slot_g"), buf("src_index", "slot"), buf("dst", "g"), none("dst_index"), i64("rows", B)}));
    for (int s = 1; s <= p_.options.max_steps; ++s) {
      const std::string pre = fmt::format("s{}.", s);
      const std::string g = s == 1 ? "g" : "h2";  // this step's hidden input (and wo's residual)
      nodes.push_back(kernel(
          pre + "prepare_x", s, make_spec("prepare_x", {{"HIDDEN", H}, {"THREADS", row_threads(H)}}), fixed, B,
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
      nodes.push_back(kernel(pre + "attention", s, attention_spec(attention_split(B)), fixed, B,
                             {buf("q", "q"), buf("ring_k", "ring_k"), buf("ring_v", "ring_v"), buf("slot", "slot"),
                              buf("pos", "pos"), buf("first_pos", "first_pos"), i64("pos_offset", s - 1), buf("o", "o"),
                              i64("rows", B), f32("scale", scale)}));
      nodes.push_back(gemv(pre + "wo", s, wo, B, kc::kEpilogueResidual, "o", "h1", buf("residual", g), fixed, B));
      nodes.push_back(kernel(pre + "post_norm", s, rmsnorm_spec(H), fixed, B,
                             {buf("x", "h1"), i64("x_stride", H), buf("w", "post_norm"), buf("y", "post"),
                              i64("y_stride", H), i64("rows", B), f32("eps", eps)}));
      nodes.push_back(gemv(pre + "w_gate_up", s, wgu, B, kc::kEpilogueSwiGLU, "post", "m", none("residual"), fixed, B));
      nodes.push_back(
          gemv(pre + "w_down", s, wd, B, kc::kEpilogueResidual, "m", "h2", buf("residual", "h1"), fixed, B));
      nodes.push_back(kernel(pre + "final_norm", s, rmsnorm_spec(H), fixed, B,
                             {buf("x", "h2"), i64("x_stride", H), buf("w", "final_norm"), buf("y", "n"),
                              i64("y_stride", H), i64("rows", B), f32("eps", eps)}));
      const int64_t ms = p_.options.max_steps;
      if (hh.head_type == HeadType::dense) {
        nodes.push_back(gemv(pre + "lm_head", s, matrices_.at("lm_head"), B, kc::kEpilogueTop1, "n", "top1_part",
                             none("residual"), fixed, B));
        // top1 joins the records of the gemv just planned: its COLS fixes their count and order (validate
        // checks that `top1_part` holds them).
        const int64_t cols = specs_.at(nodes.back().spec).constant("COLS");
        nodes.push_back(
            kernel(pre + "top1", s, make_spec("top1", {{"VOCAB", hh.draft_vocab}, {"COLS", cols}, {"MAX_STEPS", ms}}),
                   fixed, B,
                   {buf("part", "top1_part"), buf("d2t", "d2t"), buf("out_token", "out_token"),
                    buf("out_conf", "out_conf"), buf("next_token", "next_token"), i64("step", s), i64("rows", B)}));
      } else {
        const Matrix& th = matrices_.at("target_head");
        nodes.push_back(
            gemv(pre + "lr_a", s, matrices_.at("lr_a"), B, kc::kEpilogueBF16, "n", "u", none("residual"), fixed, B));
        nodes.push_back(gemv(pre + "lr_b", s, matrices_.at("lr_b"), B, kc::kEpilogueF32, "u", "scores",
                             none("residual"), fixed, B));
        nodes.push_back(kernel(pre + "topk", s, topk_spec(), fixed, B,
                               {buf("scores", "scores"), buf("cand", "cand"), i64("rows", B)}));
        nodes.push_back(kernel(
            pre + "rescore", s,
            make_spec("rescore", {{"HIDDEN", H}, {"CAND_K", cand_k_}, {"WEIGHT", th.weight_kind()}, {"MAX_STEPS", ms}}),
            fixed, B,
            {buf("target_head", th.name), th.fp8 ? buf("scale", th.name + ".scale") : none("scale"), buf("n", "n"),
             buf("cand", "cand"), buf("d2t", "d2t"), buf("exact", "exact"), buf("arrivals", "rescore_arrivals"),
             buf("out_token", "out_token"), buf("out_conf", "out_conf"), buf("next_token", "next_token"),
             i64("step", s), i64("rows", B)}));
      }
      // The pass's outputs into host memory, once: only a pass whose last step is s runs this node.
      nodes.push_back(
          kernel(pre + "store_outputs", s, make_spec("store_outputs", {{"MAX_STEPS", ms}}), fixed, B,
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
  Node extend_linear(std::string name, const Matrix& m, int64_t first_row, int64_t n_out, std::string x, std::string y,
                     const std::string& subject) {
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
    choose(subject, fmt::format("gemv fp8 ROWS={} tiled over rows", kExtendGemvRows),
           "cuBLASLt has no e4m3 x bf16 form");
    return gemv(std::move(name), 0, m, kExtendGemvRows, kc::kEpilogueBF16, std::move(x), std::move(y), none("residual"),
                Node::Rows::chunk_rows, E, first_row, n_out);
  }

  void plan_extend() {
    const auto& hh = h();
    const int64_t H = hh.hidden, Ht = hh.target_hidden, T = static_cast<int64_t>(hh.taps.size());
    const int64_t E = p_.options.extend_rows;
    const float eps = hh.rms_eps;
    const auto chunk = Node::Rows::chunk_rows;
    auto& nodes = p_.extend;
    // Rows from device memory only: their taps and tokens into the tables, as host rows arrive.
    nodes.push_back(kernel("extend.gather_taps", 0,
                           make_spec("gather_taps", {{"WIDTH", T * Ht}, {"THREADS", row_threads(T * Ht)}}), chunk, E,
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
    nodes.push_back(kernel("extend.prepare_x", 0, make_spec("prepare_x", {{"HIDDEN", H}, {"THREADS", row_threads(H)}}),
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
    nodes.push_back(kernel("extend.keep_g", 0, make_spec("copy_rows", {{"WIDTH", H}, {"THREADS", row_threads(H)}}),
                           Node::Rows::chunk_slots, p_.options.max_slots,
                           {buf("src", "e_g"), buf("src_index", "last_row"), buf("dst", "slot_g"),
                            buf("dst_index", "last_slot"), dyn_rows()}));
    // ... and its position, first position and token: the next draft pass starts from them.
    nodes.push_back(
        kernel("extend.keep_state", 0, make_spec("keep_state", {}), Node::Rows::chunk_slots, p_.options.max_slots,
               {buf("last_row", "last_row"), buf("last_slot", "last_slot"), buf("last_first", "last_first"),
                buf("row_pos", "row_pos"), buf("row_tok", "row_tok"), buf("slot_state", "slot_state"), dyn_rows()}));
  }

  void finish() {
    const auto& hh = h();
    const std::string B = fmt::format("{}", p_.options.buckets.back());
    const std::string draft_reason =
        fmt::format("at most {} rows a step: memory-bound, a GEMV streams each weight byte once", B);
    for (auto l : {"wqkv", "wo", "w_gate_up", "w_down"}) choose(fmt::format("{} draft", l), "gemv", draft_reason);
    if (rope_in_wqkv()) {
      choose("rope draft", "in the wqkv gemv's epilogue (gemv_rope_kv)",
             "no qk_norm and head_dim a multiple of 16: the gemv's column tiles hold whole rotate-half pairs, so its "
             "epilogue writes q and the ring's K and V, with no qkv buffer or qk_rope_kv node (BENCHMARKS.md \"Tiled "
             "weights and GEMV choices\")");
    } else {
      std::string reason = "tuning rope_in_wqkv = false";
      if (p_.tuning.rope_in_wqkv && hh.qk_norm)
        reason =
            "qk_norm needs a head's whole sum of squares, which spans several of the gemv's column tiles, "
            "before any element is rotated";
      else if (p_.tuning.rope_in_wqkv)
        reason = fmt::format(
            "head_dim = {} is not a multiple of 16: a gemv column tile of 16 does not hold whole "
            "rotate-half pairs",
            hh.head_dim);
      choose("rope draft", "qk_rope_kv node after the wqkv gemv", reason);
    }
    // One line per run of buckets with the same split, e.g. "ring_attention split 8 (streams 1..8), 4 (16)".
    std::vector<std::pair<int64_t, std::vector<int>>> splits;
    for (int b : p_.options.buckets) {
      const int64_t s = attention_split(b);
      if (splits.empty() || splits.back().first != s) splits.push_back({s, {}});
      splits.back().second.push_back(b);
    }
    std::string decision = "ring_attention split", keys;
    for (size_t i = 0; i < splits.size(); ++i) {
      const auto& [s, bs] = splits[i];
      const std::string streams =
          bs.size() == 1 ? fmt::format("{}", bs.front()) : fmt::format("{}..{}", bs.front(), bs.back());
      decision += fmt::format("{} {}", i ? "," : "", s);
      if (splits.size() > 1) decision += fmt::format(" (streams {})", streams);
      keys += fmt::format("{}{}{}", i ? ", " : "up to ", (hh.window + s) / s,
                          splits.size() > 1 ? fmt::format(" keys a CTA at streams {}", streams) : " keys a CTA");
    }
    const bool same = p_.options.attention_split == AttentionSplit::same_drafts;
    choose("attention draft", decision,
           fmt::format("{} of a {}-key window: {}{} (BENCHMARKS.md \"Attention split\")", keys, hh.window + 1,
                       splits.size() == 1 && splits.front().first == 1
                           ? fmt::format("one CTA a (kv head, row), since a chunk takes at least {} keys and "
                                         "clusters need sm_90",
                                         kAttnMinKeysPerCta)
                           : fmt::format("each (kv head, row) one cluster of SPLIT CTAs, fewer where kv_heads x "
                                         "streams x SPLIT would exceed one wave of {} CTAs",
                                         kAttnWaveCtas),
                       same ? "; attention_split same_drafts: the largest bucket's split in every bucket, so a slot "
                              "drafts the same tokens in every bucket"
                       : splits.size() > 1
                           ? "; attention_split per_bucket: the split orders the fp32 sums, so a slot's drafts may "
                             "differ between buckets at a near-tie"
                           : ""));
    if (hh.head_type == HeadType::dense) {
      const int64_t b0 = p_.options.buckets.front(), b1 = p_.options.buckets.back();
      choose("lm_head draft", "gemv top1 partials + top1 join",
             fmt::format("the gemv's epilogue writes one (max, lowest index, sum exp) partial a row per column tile, "
                         "{} at bucket {} .. {} at bucket {}, which top1 joins in order, so the logits never reach "
                         "memory (BENCHMARKS.md \"Tiled weights and GEMV choices\")",
                         top1_parts(b0), b0, top1_parts(b1), b1));
    } else {
      choose("lr_a draft", "gemv", draft_reason);
      choose("lr_b draft", "gemv f32 scores + topk",
             fmt::format("one cluster of {} CTAs a row selects the best {} of {} scores, agreeing on each radix "
                         "pass through distributed shared memory",
                         topk_split(), cand_k_, hh.draft_vocab));
      choose("target_head draft", "rescore",
             fmt::format("only the {} candidate rows of target_head are read a row, a warp each, and the last CTA "
                         "to arrive joins",
                         cand_k_));
    }
    std::vector<std::string> wide;
    for (const auto& [uri, spec] : specs_) {
      if (!is_gemv(spec)) continue;
      const KernelSpec g = gemv_equivalent(spec);
      if (g.constant("COLS") == 32)
        wide.push_back(fmt::format("K {} N {} ROWS {}", g.constant("K"), g.constant("N"), g.constant("ROWS")));
    }
    choose("gemv columns per CTA", wide.empty() ? "16" : fmt::format("32 at {}; 16 elsewhere", fmt::join(wide, ", ")),
           fmt::format("32 above 8 rows where K >= {} and the output is not narrow, in bf16 only where {} CTAs "
                       "remain, halving x's traffic per weight byte (BENCHMARKS.md \"Tiled weights and GEMV "
                       "choices\")",
                       kGemvWideMinK, kGemvWideCtas));
    // Shapes whose CTAs run several column tiles (a short K), each once whatever its ROWS and COLS.
    std::set<std::string> multi;
    for (const auto& [uri, spec] : specs_) {
      if (!is_gemv(spec) || gemv_tiles_per_cta(spec) == 1) continue;
      const KernelSpec g = gemv_equivalent(spec);
      multi.insert(fmt::format("{} at K {} N {} {}", gemv_tiles_per_cta(g), g.constant("K"), g.constant("N"),
                               g.constant("WEIGHT") == kc::kWeightFP8 ? "fp8" : "bf16"));
    }
    choose("gemv column tiles per CTA", multi.empty() ? "1" : fmt::format("{}; 1 elsewhere", fmt::join(multi, ", ")),
           "a tile's K is split over 8 warps (16 for a narrow output), over fewer where a warp would get under 4 "
           "K steps, the spare warps taking more tiles so that a short K's loads still pipeline (BENCHMARKS.md "
           "\"Tiled weights and GEMV choices\")");
    std::set<std::string> clustered;
    for (const auto& [uri, spec] : specs_)
      if (spec.kernel == "gemv_cluster")
        clustered.insert(fmt::format("{} at K {} N {} {}", spec.constant("CSPLIT"), spec.constant("K"),
                                     spec.constant("N"), spec.constant("WEIGHT") == kc::kWeightFP8 ? "fp8" : "bf16"));
    std::string unclustered = "no FP8 output narrow enough";
    if (!p_.tuning.gemv_cluster)
      unclustered = "tuning gemv_cluster = false";
    else if (max_cluster_ctas(p_.options) == 1)
      unclustered = fmt::format("{} has no clusters", p_.options.arch);
    choose("gemv cluster split", clustered.empty() ? "1" : fmt::format("{}; 1 elsewhere", fmt::join(clustered, ", ")),
           clustered.empty() ? unclustered
                             : fmt::format("a narrow FP8 output's few column tiles leave most SMs idle, so each "
                                           "tile's K is split over a cluster, up to {} CTAs in all, joined in rank "
                                           "order (BENCHMARKS.md \"Tiled weights and GEMV choices\")",
                                           kGemvClusterCtas));
    choose("weight layout", tiled_.empty() ? "rows" : fmt::format("tiled: {}", fmt::join(tiled_, ", ")),
           fmt::format("a tiled matrix's warp loads read 512 consecutive bytes (BENCHMARKS.md \"Tiled weights and "
                       "GEMV choices\"); row-major: {}",
                       rows_.empty() ? "none" : fmt::format("{}", fmt::join(rows_, ", "))));
    for (auto& [uri, spec] : specs_) p_.specs.push_back(spec);  // std::map: sorted by uri
    if (gemms_ == 0) {
      p_.cublaslt_workspace = 0;
      choose("cublaslt_workspace", "0", "no node uses cuBLASLt");
    }
    p_.device_bytes = p_.weights.bytes + p_.arena.bytes + p_.cublaslt_workspace;
  }

  Plan p_;
  std::map<std::string, bool> fp8_;        // per linear in use
  std::map<std::string, bool> fused_fp8_;  // wqkv, w_gate_up
  std::set<std::string> fp8_dropped_;
  std::map<std::string, Matrix> matrices_;
  std::vector<std::string> tiled_, rows_;  // the weight layout choice: matrices tiled, and row-major with why
  std::map<std::string, KernelSpec> specs_;
  int64_t cand_k_ = 0;  // two_stage: the candidates rescored (PlanOptions::cand_k, else the header's)
  int gemms_ = 0;
};

}  // namespace

Plan make_plan(const HeadHeader& header, const PlanOptions& options, const Tuning& tuning, std::string head_sha256) {
  Plan p = Planner(header, options, tuning, std::move(head_sha256)).run();
  validate(p);
  return p;
}

}  // namespace tfe
