// Launch shapes of the kernels in kernels/*.cuh. Each case mirrors its kernel's grid mapping; the
// constexpr shape helpers below repeat the ones in the kernel sources (which cannot include host headers),
// and the kernel comments point back here.
#include <algorithm>
#include <initializer_list>
#include <limits>

#include "kernels/registry.h"
#include "core/error.h"

namespace tfe {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The product of non-negative factors, saturating at INT64_MAX: a reach past any buffer then fails the
// size check it feeds instead of wrapping around.
int64_t product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return std::numeric_limits<int64_t>::max();
  return p;
}
int64_t saturating_add(int64_t a, int64_t b) {
  int64_t s;
  return __builtin_add_overflow(a, b, &s) ? std::numeric_limits<int64_t>::max() : s;
}

// gemv (kernels/gemv.cuh, GemvShape): a column tile is COLS output columns (for SwiGLU: 16 gate rows and
// the 16 matching up rows) and KSPLIT warps that split K in steps of 4 lanes x one 16-byte weight chunk: 8,
// or 16 for a narrow output (fewer than 64 tiles of 16 columns); fewer (a power of two) where K gives a
// warp under 4 steps, and then a CTA's 8 warps run 8 / KSPLIT tiles (gemv_tiles).
int64_t gemv_steps(const KernelSpec& spec) {
  return ceil_div(spec.constant("K"), spec.constant("WEIGHT") == kc::kWeightFP8 ? 64 : 32);
}
bool gemv_narrow(const KernelSpec& spec) { return ceil_div(spec.constant("N"), 16) < 64; }
int64_t gemv_ksplit(const KernelSpec& spec) {
  const int64_t steps = gemv_steps(spec);
  if (gemv_narrow(spec)) return std::min<int64_t>(16, steps);
  int64_t split = 1;
  while (split * 2 <= std::max<int64_t>(1, steps / 4) && split < 8) split *= 2;
  return split;
}
int64_t gemv_tiles(const KernelSpec& spec) { return gemv_narrow(spec) ? 1 : 8 / gemv_ksplit(spec); }
int64_t gemv_warps(const KernelSpec& spec) { return gemv_ksplit(spec) * gemv_tiles(spec); }

// gemv's dynamic shared memory (GemvShape::DYNAMIC, RING_BYTES): a ring-loop shape at two weight tiles
// (SwiGLU or COLS 32), in bf16 or in FP8 above 8 input rows (two n tiles), keeps its ring there, 3 stages
// of the CTA's warps' weight and x chunks (16 bytes a lane each) within 96 KB; 0 for every other shape.
int64_t gemv_dynamic_smem(const KernelSpec& spec) {
  const int64_t k = spec.constant("K");
  const bool fp8 = spec.constant("WEIGHT") == kc::kWeightFP8;
  const int64_t mt = spec.constant("EPILOGUE") == kc::kEpilogueSwiGLU ? 2 : spec.constant("COLS") / 16;
  const int64_t nt = ceil_div(spec.constant("ROWS"), 8);
  const bool ring = (k * (fp8 ? 1 : 2)) % 16 == 0 && k % 8 == 0 && !gemv_narrow(spec);
  if (!ring || mt != 2 || (fp8 && nt != 2)) return 0;
  constexpr int64_t kBudget = 96 * 1024, kSlotBytes = 512;
  const int64_t warps = gemv_warps(spec);
  const int64_t x_slots = nt * (fp8 ? 2 : 1);  // 16-byte x chunks per lane and step (FP8: 16 k)
  const bool x_ring = kBudget / (warps * (2 * mt + x_slots) * kSlotBytes) >= 2;
  const int64_t slots = 2 * mt + (x_ring ? x_slots : 0);
  const int64_t stages = std::min<int64_t>(3, kBudget / (warps * slots * kSlotBytes));
  return warps * stages * slots * kSlotBytes;
}

// ring_attention (kernels/ring_attention.cuh, AttnShape): a CTA per (key chunk, kv head, row), the SPLIT
// chunks of a (kv head, row) one cluster (the kernel declares its cluster dims); dynamic shared memory holds
// the ring of K/V tiles (reused for the per-warp partial outputs), the chunk's scores and the chunk's
// partial for the join.
constexpr int64_t kAttnThreads = 128;
constexpr int64_t kAttnRingBytes = 32 * 1024;
int64_t attention_smem(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window, int64_t split) {
  const int64_t group = heads / kv_heads;
  const int64_t chunk = ceil_div(window + 1, split);
  const int64_t warps = kAttnThreads / 32;
  const int64_t elems = head_dim % 8 == 0 ? 8 : 2, loads = head_dim / elems;  // E, KC
  int64_t lanes = 1;                                                          // LPK
  while (lanes < std::min<int64_t>(32, loads)) lanes *= 2;
  const int64_t per_lane = ceil_div(loads, lanes), passes = ceil_div(chunk, kAttnThreads / lanes);
  const int64_t tile_passes = std::min<int64_t>(passes, group * elems > 32 ? 4 : 8);
  const int64_t tiles = ceil_div(passes, tile_passes), tile_slots = tile_passes * per_lane * kAttnThreads;
  const int64_t stages = std::min(2 * tiles, std::max<int64_t>(2, kAttnRingBytes / (tile_slots * 16)));
  const int64_t ring_floats = std::max(stages * tile_slots * 4, warps * group * head_dim);
  return 4 * (ring_floats + group * chunk + group * (head_dim + 2));
}

// qk_rope_kv (kernels/qk_rope_kv.cuh): a warp per head.
constexpr int64_t kRopeHeadsPerCta = 4;
// load_tables: 128 threads, a row each (kernels/load_tables.cuh).
constexpr int64_t kLoadTablesMaxRows = 128;

// topk (kernels/topk.cuh, kTopkThreads) and rescore (kernels/rescore.cuh, kRescoreWarps).
constexpr int64_t kTopkThreads = 512;
constexpr int64_t kRescoreWarps = 4;

}  // namespace

KernelSpec gemv_equivalent(const KernelSpec& spec) {
  if (spec.kernel == "gemv") return spec;
  if (spec.kernel == "gemv_cluster") {
    auto constants = spec.constants;
    constants.pop_back();  // CSPLIT, the registry's last
    return make_spec("gemv", std::move(constants));
  }
  if (spec.kernel != "gemv_rope_kv") fail("gemv_equivalent: {} is not a gemv", spec.uri());
  // Constants are at most 2^24 (validate), so N stays exact.
  const int64_t n = (spec.constant("HEADS") + 2 * spec.constant("KV_HEADS")) * spec.constant("HEAD_DIM");
  return make_spec("gemv", {{"ROWS", spec.constant("ROWS")},
                            {"K", spec.constant("K")},
                            {"N", n},
                            {"WEIGHT", spec.constant("WEIGHT")},
                            {"EPILOGUE", kc::kEpilogueBF16},
                            {"COLS", spec.constant("COLS")},
                            {"TILED", spec.constant("TILED")}});
}

int64_t gemv_tiles_per_cta(const KernelSpec& spec) { return gemv_tiles(gemv_equivalent(spec)); }

int64_t gemv_cluster_split_limit(const KernelSpec& spec) {
  const KernelSpec g = gemv_equivalent(spec);
  if (!gemv_narrow(g)) return 1;
  return std::max<int64_t>(1, gemv_steps(g) / gemv_ksplit(g));
}

LaunchShape launch_shape(const KernelSpec& spec, int64_t rows) {
  if (rows < 1) fail("launch_shape {}: rows is {}, must be at least 1", spec.uri(), rows);
  LaunchShape s;
  const std::string& k = spec.kernel;
  if (k == "prepare_x") {
    // Two CTAs per row: the embedding's norm and the hidden row's norm.
    s.grid[0] = 2;
    s.grid[1] = rows;
    s.block = spec.constant("THREADS");
    s.rows_axis = 1;
  } else if (k == "load_tables") {
    // One CTA of 128 threads, a row a thread (kernels/load_tables.cuh).
    if (rows > kLoadTablesMaxRows)
      fail("launch_shape {}: rows is {}; load_tables copies at most {} rows a table", spec.uri(), rows,
           kLoadTablesMaxRows);
    s.block = 128;
  } else if (k == "store_outputs") {
    // One CTA of 128 threads, striding over rows x MAX_STEPS entries (kernels/store_outputs.cuh).
    s.block = 128;
  } else if (k == "rmsnorm" || k == "copy_rows") {
    // One CTA per row.
    s.grid[0] = rows;
    s.block = spec.constant("THREADS");
    s.rows_axis = 0;
  } else if (k == "gemv" || k == "gemv_rope_kv" || k == "gemv_cluster") {
    // gemv_rope_kv: its GEMV's shape, epilogue aside; gemv_cluster: gemv's, CSPLIT CTAs a column tile.
    const KernelSpec g = gemv_equivalent(spec);
    const int64_t row_tile = g.constant("ROWS"), cols = g.constant("COLS");
    if (cols != 16 && (cols != 32 || g.constant("EPILOGUE") == kc::kEpilogueSwiGLU))
      fail("launch_shape {}: COLS is {}; gemv takes 16, or 32 with an epilogue other than SwiGLU", spec.uri(), cols);
    s.grid[0] = ceil_div(ceil_div(g.constant("N"), cols), gemv_tiles(g));
    if (k == "gemv_cluster") s.grid[0] = product({s.grid[0], spec.constant("CSPLIT")});
    s.grid[1] = ceil_div(rows, row_tile);
    s.block = 32 * gemv_warps(g);
    s.smem = gemv_dynamic_smem(g);
    s.rows_axis = 1;
    s.rows_per_block = row_tile;
  } else if (k == "qk_rope_kv") {
    // A warp per head, kRopeHeadsPerCta heads (q, then k, then v) a CTA, a row per grid.y.
    const int64_t in_heads = (spec.constant("WRITE_Q") ? spec.constant("HEADS") : 0) + 2 * spec.constant("KV_HEADS");
    s.grid[0] = ceil_div(in_heads, kRopeHeadsPerCta);
    s.grid[1] = rows;
    s.block = 32 * kRopeHeadsPerCta;
    s.rows_axis = 1;
  } else if (k == "ring_attention") {
    // One CTA per (key chunk, kv head, row): the query heads of one GQA group against a SPLIT-th of the
    // window; grid.x is a multiple of the cluster size SPLIT.
    s.grid[0] = spec.constant("KV_HEADS") * spec.constant("SPLIT");
    s.grid[1] = rows;
    s.block = kAttnThreads;
    s.smem = attention_smem(spec.constant("HEADS"), spec.constant("KV_HEADS"), spec.constant("HEAD_DIM"),
                            spec.constant("WINDOW"), spec.constant("SPLIT"));
    s.rows_axis = 1;
  } else if (k == "top1") {
    // A CTA per row joins the row's ceil(VOCAB / COLS) partials (kernels/top1.cuh, 256 threads).
    s.grid[0] = rows;
    s.block = 256;
    s.rows_axis = 0;
  } else if (k == "topk") {
    // A cluster of SPLIT CTAs per row.
    s.grid[0] = spec.constant("SPLIT");
    s.grid[1] = rows;
    s.block = kTopkThreads;
    s.rows_axis = 1;
  } else if (k == "rescore") {
    // A warp per candidate, kRescoreWarps candidates per CTA; the last CTA of a row joins.
    s.grid[0] = ceil_div(spec.constant("CAND_K"), kRescoreWarps);
    s.grid[1] = rows;
    s.block = 32 * kRescoreWarps;
    s.rows_axis = 1;
  } else {
    fail("launch_shape: no launch shape for kernel `{}`", k);
  }
  return s;
}

int64_t param_alignment(const KernelSpec& spec, std::string_view param) {
  // load_tables reads a host_tables row as one int4 (kernels/load_tables.cuh).
  if (spec.kernel == "load_tables" && param == "host_tables") return kc::kHostTableColumns * 4;
  return 1;
}

int64_t param_reach(const KernelSpec& spec, std::string_view param, const Reach& r) {
  const std::string& k = spec.kernel;
  const auto c = [&](std::string_view name) { return spec.constant(name); };
  const int64_t R = r.rows;
  constexpr int64_t kBf16 = 2, kF32 = 4, kI32 = 4;
  auto unknown = [&]() -> int64_t { fail("param_reach: kernel {} has no pointer parameter `{}`", k, param); };
  if (k == "rmsnorm") {
    const int64_t w = c("WIDTH");
    if (param == "w") return product({w, kBf16});
    if (param == "x" || param == "y") {
      if (R < 1) return 0;
      const int64_t last = product({R - 1, r.i64(param == "x" ? "x_stride" : "y_stride")});
      return product({saturating_add(last, w), kBf16});
    }
    return unknown();
  }
  if (k == "prepare_x") {
    const int64_t h = c("HIDDEN");
    if (param == "embed") return product({r.vocab, h, kBf16});
    if (param == "input_norm" || param == "hidden_norm") return product({h, kBf16});
    if (param == "tokens") return product({R, kI32});
    if (param == "g") return product({R, h, kBf16});
    if (param == "x") return product({R, 2, h, kBf16});
    return unknown();
  }
  if (k == "copy_rows") {
    const int64_t w = c("WIDTH");
    if (param == "src_index" || param == "dst_index") return r.index_rows(param) ? product({R, kI32}) : 0;
    if (param == "src" || param == "dst") {
      const int64_t ids = r.index_rows(param == "src" ? "src_index" : "dst_index");
      return product({ids ? ids : R, w, kBf16});
    }
    return unknown();
  }
  if (k == "gemv") {
    const int64_t n = c("N"), kk = c("K"), epi = c("EPILOGUE");
    const bool fp8 = c("WEIGHT") == kc::kWeightFP8;
    const int64_t wrows = product({epi == kc::kEpilogueSwiGLU ? 2 : 1, n});
    if (param == "w") return product({wrows, kk, fp8 ? 1 : kBf16});
    if (param == "scale") return fp8 ? product({wrows, kF32}) : 0;
    if (param == "x") return product({R, kk, kBf16});
    if (param == "residual") return epi == kc::kEpilogueResidual ? product({R, n, kBf16}) : 0;
    if (param == "y") {
      if (epi == kc::kEpilogueF32) return product({R, n, kF32});
      if (epi == kc::kEpilogueTop1) return product({R, ceil_div(n, c("COLS")), kc::kTop1PartBytes});  // one a tile
      return product({R, n, kBf16});
    }
    return unknown();
  }
  if (k == "gemv_cluster") return param_reach(gemv_equivalent(spec), param, r);  // what its gemv reaches
  if (k == "gemv_rope_kv") {
    const int64_t heads = c("HEADS"), kvh = c("KV_HEADS"), hd = c("HEAD_DIM");
    // Its GEMV reads what the wqkv gemv reads.
    if (param == "w" || param == "scale" || param == "x") return param_reach(gemv_equivalent(spec), param, r);
    if (param == "inv_freq") return product({hd / 2, kF32});
    if (param == "slot" || param == "pos") return product({R, kI32});
    if (param == "q_out") return product({R, heads, hd, kBf16});
    if (param == "ring_k" || param == "ring_v") return product({r.slots, c("RING"), kvh, hd, kBf16});
    return unknown();
  }
  if (k == "qk_rope_kv" || k == "ring_attention") {
    const int64_t heads = c("HEADS"), kvh = c("KV_HEADS"), hd = c("HEAD_DIM");
    if (param == "ring_k" || param == "ring_v") return product({r.slots, c("RING"), kvh, hd, kBf16});
    if (param == "slot" || param == "pos" || param == "first_pos") return product({R, kI32});
    if (k == "qk_rope_kv") {
      const bool write_q = c("WRITE_Q") != 0;
      if (param == "qkv") return product({R, (write_q ? heads : 0) + 2 * kvh, hd, kBf16});
      if (param == "q_norm" || param == "k_norm") return c("QK_NORM") ? product({hd, kBf16}) : 0;
      if (param == "inv_freq") return product({hd / 2, kF32});
      if (param == "q_out") return write_q ? product({R, heads, hd, kBf16}) : 0;
      return unknown();
    }
    if (param == "q" || param == "o") return product({R, heads, hd, kBf16});
    return unknown();
  }
  if (k == "load_tables") {
    if (param == "host_tables") return product({R, kc::kHostTableColumns, kI32});  // a row's four entries
    return product({R, kI32});  // the others: each one [rows] int32 table
  }
  if (k == "store_outputs") {
    if (param == "host_done") return kI32;     // one word
    return product({R, c("MAX_STEPS"), kI32});  // the others: each a [rows, MAX_STEPS] table
  }
  if (k == "top1" || k == "rescore") {
    const int64_t steps = c("MAX_STEPS");
    if (param == "out_token" || param == "out_conf") return product({R, steps, kI32});
    if (param == "next_token") return product({R, kI32});
    if (param == "d2t") return product({r.draft_vocab, kI32});
    if (k == "top1") {
      if (param == "part") return product({R, ceil_div(c("VOCAB"), c("COLS")), kc::kTop1PartBytes});
      return unknown();
    }
    const int64_t h = c("HIDDEN"), cand_k = c("CAND_K");
    const bool fp8 = c("WEIGHT") == kc::kWeightFP8;
    if (param == "target_head") return product({r.vocab, h, fp8 ? 1 : kBf16});
    if (param == "scale") return fp8 ? product({r.vocab, kF32}) : 0;
    if (param == "n") return product({R, h, kBf16});
    if (param == "cand" || param == "exact") return product({R, cand_k, kI32});
    if (param == "arrivals") return product({R, kI32});
    return unknown();
  }
  if (k == "topk") {
    if (param == "scores") return product({R, c("VOCAB"), kF32});
    if (param == "cand") return product({R, c("CAND_K"), kI32});
    return unknown();
  }
  fail("param_reach: no reach for kernel `{}`", k);
}

}  // namespace tfe
