// The planner (make_plan, plan/plan.h): from a head header, its options and the tuning to the plan.
// Everything the runtime does is decided here, once, on the host; each decision that has an alternative is
// recorded as a Choice.
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
//
// One class, Planner, in four files: plan/planner.cpp (the order of the work, the ring, FP8),
// plan/planner_layout.cpp (weights and arenas), plan/planner_buckets.cpp (kernel shapes, the draft passes,
// the extend) and plan/planner_finish.cpp (launches, dependent launch, specs, the choices the passes imply).
// Internal to plan/.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/plan.h"

namespace tfe::planning {

namespace kd = kernel_desc;

inline constexpr int64_t kAlign = 256;
// Largest buffer or arena planned (1 PiB): keeps every byte count and offset exact in int64.
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;
// Rows of the FP8 GEMV tile the extend uses in place of cuBLASLt.
inline constexpr int64_t kExtendGemvRows = 16;

inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

inline int64_t checked_product(std::string_view what, const std::vector<int64_t>& dims, int64_t unit) {
  int64_t p = unit;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && p > kMaxBytes / d)) fail("plan: {} needs more than {} bytes", what, kMaxBytes);
    p *= d;
  }
  return p;
}

// Threads of a one-CTA-per-row kernel over `width` bf16: one 16-byte chunk per thread, 32..1024.
inline int64_t row_threads(int64_t width) {
  const int64_t chunks = (width + 7) / 8;
  return std::clamp<int64_t>(align_up(chunks, 32), 32, 1024);
}

inline Arg buf(std::string param, std::string buffer, int64_t byte_offset = 0) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::buffer;
  a.buffer = std::move(buffer);
  a.byte_offset = byte_offset;
  return a;
}
inline Arg i64(std::string param, int64_t v) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::i64;
  a.i = v;
  return a;
}
inline Arg f32(std::string param, float v) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::f32;
  a.f = v;
  return a;
}
inline Arg none(std::string param) {
  Arg a;
  a.param = std::move(param);
  a.kind = Arg::Kind::null;
  return a;
}
inline Arg dyn_rows() {
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
  Planner(const HeadHeader& h, const PlanOptions& o, const Tuning& t, std::string sha);
  Plan run();

 private:
  // plan/planner.cpp: the ring, the attention check and the FP8 choice.
  const HeadHeader& h() const { return p_.header; }
  void choose(std::string subject, std::string decision, std::string reason);
  void decide_ring();
  void check_attention_fits() const;
  void decide_fp8();

  // plan/planner_layout.cpp: the weights, the device arena and the host arena.
  Buffer& add(Arena& arena, std::string name, BufferRole role, DType dtype, std::vector<int64_t> shape,
              std::vector<std::string> from = {});
  Matrix add_matrix(const std::string& name, const std::vector<std::string>& parts, bool fp8);
  bool tiled_form(const Matrix& m);
  void add_vector(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void lay_out_weights();
  void lay_out_arena();
  void lay_out_host();

  // plan/planner_buckets.cpp: the kernels' shapes, the draft passes and the extend.

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
  KernelSpec attention_spec(int64_t split) const;
  bool layer_fp8() const;
  int dependent_streams() const { return layer_fp8() ? p_.tuning.dependent_streams_fp8 : p_.tuning.dependent_streams; }
  int64_t attention_split(int64_t rows) const;
  int64_t lm_head_cols(int64_t rows) const;
  int64_t top1_parts(int64_t rows) const { return (h().draft_vocab + lm_head_cols(rows) - 1) / lm_head_cols(rows); }
  int64_t topk_split() const;
  KernelSpec topk_spec() const;
  Node kernel(std::string name, int step, const KernelSpec& spec, Node::Rows rows, int64_t launch_rows,
              std::vector<Arg> args);

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
  static int64_t gemv_cols(int64_t tile_rows, int64_t k, int64_t n, int64_t epilogue, int64_t weight);

  // A narrow output (fewer than 64 column tiles of 16, kernels/gemv.cuh NARROW) leaves most SMs idle, and
  // each tile's K streams at the rate of one CTA's loads in flight. gemv_cluster splits every tile's K over
  // a cluster: the fewest CTAs a tile (a power of two) that give the GEMV kGemvClusterCtas CTAs, within the
  // arch's cluster size and so that every warp of the cluster keeps a K step of its own. 1: a plain gemv.
  // FP8 weights only: tfe-two-stage's lr_a measured 0.5-2 us a step faster so in FP8 and 1-2 us slower in
  // bf16, where the plain gemv's weights (loaded before the wait for the predecessor) already stream
  // while the norm before it runs, and the cluster's join is then what is left (BENCHMARKS.md).
  static constexpr int64_t kGemvClusterCtas = 128;  // about an H100's or H200's SMs (132)
  int64_t gemv_cluster_split(const KernelSpec& g) const;
  Node gemv(std::string name, int step, const Matrix& m, int64_t tile_rows, int64_t epilogue, std::string x,
            std::string y, Arg residual, Node::Rows rows, int64_t launch_rows, int64_t first_row = 0,
            int64_t n_out = 0);
  bool fp8_gemv_after_gemv(const Node& before, const Node& n) const;

  // Above dependent_streams (Tuning::dependent_safe_nodes): a GEMV after a grid of at least one CTA an SM
  // is launched plainly, for the same reason as above, in bf16 too: at 8-16 streams its one or two waves are
  // what the step's time follows. After a smaller grid (a norm's, attention's at one CTA a row) the SMs it
  // leaves free take the GEMV's first CTAs evenly; small kernels have one short wave and gain the overlap.
  static constexpr int64_t kSmCount = 132;  // an H100 SXM's or H200's SMs
  bool gemv_after_full_grid(const Node& before, const Node& n) const;
  static bool is_gemv(const KernelSpec& spec);
  bool is_gemv(const Node& n) const { return n.kind == Node::Kind::kernel && is_gemv(specs_.at(n.spec)); }

  // The draft's RoPE in the wqkv GEMV's epilogue (gemv_rope_kv): a head without qk_norm, whose rotate-half
  // pairs the GEMV's 16-column tiles can hold 8 at a time. qk_norm needs a head's whole sum of squares,
  // which spans HEAD_DIM / 16 tiles (CTAs), before any element is rotated.
  bool rope_in_wqkv() const { return p_.tuning.rope_in_wqkv && !h().qk_norm && h().head_dim % 16 == 0; }
  Node wqkv_rope_kv(std::string name, int step, int64_t rows);
  KernelSpec rmsnorm_spec(int64_t width) const;
  KernelSpec qk_rope_spec(bool write_q) const;
  Arg norm_arg(const char* param, const char* buffer) const { return h().qk_norm ? buf(param, buffer) : none(param); }
  Bucket draft_bucket(int streams);
  Node extend_linear(std::string name, const Matrix& m, int64_t first_row, int64_t n_out, std::string x, std::string y,
                     const std::string& subject);
  void plan_extend();

  // plan/planner_finish.cpp: the nodes' launches and dependent launch, the specs, and the choices the
  // passes imply.
  void finish();

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

}  // namespace tfe::planning
