// gemv, gemv_cluster and gemv_rope_kv (kernels/gemv.cuh): a GEMV's shape, which the kernels (GemvShape)
// and their launch shapes both compute here, then, for the host only, the three kernels' descriptions
// (kernels/kernel_def.h) and the shape helpers the planner uses.
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

// How a GEMV's K and columns split over warps and CTAs. A column tile is COLS output columns and KSPLIT
// warps that split K in steps of 4 lanes x one 16-byte weight chunk; a CTA runs TILES column tiles. It
// depends on K, N and the weight kind alone, not on the rows or COLS, so that a column's sum is the same at
// every row count and at COLS 16 and 32.
struct GemvSplit {
  bool fp8 = false;
  long long wbytes = 0;  // bytes of a weight
  long long e = 0;       // k elements in one lane's 16-byte weight chunk
  long long step = 0;    // k covered by one warp step (4 lanes per weight row)
  long long steps = 0;
  bool narrow = false;
  long long ksplit = 0;  // warps a column tile's K is split over
  long long tiles = 0;   // column tiles a CTA
  long long warps = 0;
};

TFE_HOST_DEVICE constexpr GemvSplit gemv_split(long long K, long long N, long long WEIGHT) {
  GemvSplit s;
  s.fp8 = WEIGHT == kWeightFP8;
  s.wbytes = s.fp8 ? 1 : 2;
  s.e = s.fp8 ? 16 : 8;
  s.step = 4 * s.e;
  s.steps = ceil_div(K, s.step);
  // A narrow output (fewer than 64 tiles of 16 columns, e.g. two_stage's lr_a: 512 columns, 32 CTAs) leaves
  // most SMs idle, and each CTA's K then streams at the rate of its own loads in flight. There a CTA takes
  // 16 warps, twice the loads in flight (at 1024 threads the registers would not hold two weight tiles).
  s.narrow = ceil_div(N, 16) < 64;
  // A tile's warps each take at least 4 K steps where K allows: with fewer, a CTA is over before its loads
  // pipeline, and a short K (two_stage's lr_b: 512, 1 FP8 step a warp at KSPLIT 8) ran 2000 one-load CTAs in
  // four waves at a third of the copy rate. There KSPLIT drops (a power of two) and the CTA's 8 warps take
  // 8 / KSPLIT tiles instead, so the grid shrinks by as much.
  s.ksplit = s.narrow ? min_ll(16, s.steps) : min_ll(8, pow2_at_most(max_ll(1, s.steps / 4)));
  s.tiles = s.narrow ? 1 : 8 / s.ksplit;
  s.warps = s.ksplit * s.tiles;
  return s;
}

// The ring loop's shared memory. A ring slot is one 16-byte chunk per lane (a warp's 512 bytes); the rings
// of the CTA's warps share `budget` bytes. x goes through the ring too (its L2 latency then hides behind
// the weights') wherever two stages of weights and x fit; else x is loaded into registers one step ahead.
// Depth, measured (kernels/README.md, gemv performance): 3 steps at one weight tile, 2 at two (where more
// stages do not fit in 48 KB, or measured slower).
// Two weight tiles (SwiGLU or COLS 32) in bf16, or in FP8 above 8 input rows: a step's weights and x take
// 2.5-4 KB a warp, so 48 KB of static shared memory would hold 2 stages (one in flight) of the weights and
// x, or in FP8 of the weights alone. There the ring lives in dynamic shared memory (`dynamic`; `bytes` is
// then the launch's): 3 stages of weights and x in at most 96 KB, so that two CTAs (gemv.cuh MIN_CTAS)
// still fit an SM's 227 KB. Measured (bench_gemv, us): FP8 rows 16, w_down at COLS 32 31.3 -> 22.7,
// gate/up 48.0 -> 45.2, lm_head 48.2 -> 45.0; bf16 gate/up rows 1 / 16 64.0 / 71.4 -> 62.9 / 67.7 (the
// direct-load loop before), lm_head COLS 32 rows 16 72.3 -> 71.4. The same at one weight tile (FP8 rows
// 16: 72 KB for 3 stages, 3 CTAs an SM) measured slower (wqkv 19.8 -> 22.7 us), and so did FP8 SwiGLU at
// 1-8 rows (gate/up 34.9 -> 36.1 at one row, 2 CTAs an SM against the static ring's 4), so those keep the
// static ring.
struct GemvRing {
  long long mt = 0;       // 16-row weight tiles
  long long nt = 0;       // 8-row input tiles
  long long xchunks = 0;  // 16-byte x chunks per k0
  bool w_vec = false, x_vec = false;
  // The ring serves every shape with 16-byte chunks that never straddle a row's end. A narrow output
  // loads directly: more steps in flight per warp than the stages that fit in 48 KB beside 16 warps.
  bool ring = false;
  bool dynamic = false;
  long long budget = 0, w_slots = 0;
  bool x_ring = false;
  long long slots = 0, stages = 0, bytes = 0;
};

TFE_HOST_DEVICE constexpr GemvRing gemv_ring(long long K, long long N, long long WEIGHT, long long EPILOGUE,
                                             long long ROWS, long long COLS) {
  const GemvSplit s = gemv_split(K, N, WEIGHT);
  GemvRing g;
  g.mt = EPILOGUE == kEpilogueSwiGLU ? 2 : COLS / 16;
  g.nt = ceil_div(ROWS, 8);
  g.xchunks = s.e / 8;
  g.w_vec = (K * s.wbytes) % 16 == 0;
  g.x_vec = K % 8 == 0;
  g.ring = g.w_vec && g.x_vec && !s.narrow;
  g.dynamic = g.ring && g.mt == 2 && (g.nt == 2 || !s.fp8);
  g.budget = (g.dynamic ? 96 : 48) * 1024;
  g.w_slots = 2 * g.mt;
  g.x_ring = g.budget / (s.warps * (g.w_slots + g.nt * g.xchunks) * 512) >= 2;
  g.slots = g.w_slots + (g.x_ring ? g.nt * g.xchunks : 0);
  g.stages = min_ll(g.mt == 1 || g.dynamic ? 3 : 2, g.budget / (s.warps * g.slots * 512));
  g.bytes = s.warps * g.stages * g.slots * 512;
  return g;
}

// gemv_rope_kv's GEMV: the columns of wqkv, [q | k | v] heads.
TFE_HOST_DEVICE constexpr long long gemv_rope_kv_columns(long long HEADS, long long KV_HEADS, long long HEAD_DIM) {
  return (HEADS + 2 * KV_HEADS) * HEAD_DIM;
}

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include <algorithm>

#include "core/error.h"
#include "kernels/kernel_def.h"

namespace tfe {

namespace kernel_desc {

// The specialization constants of gemv, gemv_cluster and gemv_rope_kv, in their configs' order.
TFE_KERNEL_CONSTANTS(GemvConstants, "gemv", ROWS, K, N, WEIGHT, EPILOGUE, COLS, TILED);
TFE_KERNEL_CONSTANTS(GemvClusterConstants, "gemv_cluster", ROWS, K, N, WEIGHT, EPILOGUE, COLS, TILED, CSPLIT);
TFE_KERNEL_CONSTANTS(GemvRopeKvConstants, "gemv_rope_kv", ROWS, K, WEIGHT, COLS, HEADS, KV_HEADS, HEAD_DIM, RING,
                     TILED);

}  // namespace kernel_desc

// A gemv, gemv_cluster or gemv_rope_kv spec as the gemv spec of its GEMV (gemv_cluster: without CSPLIT;
// gemv_rope_kv: N = (HEADS + 2 KV_HEADS) x HEAD_DIM, EPILOGUE bf16): its block, tiles and columns are that
// spec's (gemv_cluster's grid.x is CSPLIT times its).
inline KernelSpec gemv_equivalent(const KernelSpec& spec) {
  using namespace kernel_desc;
  if (spec.kernel == "gemv") return spec;
  if (spec.kernel == "gemv_cluster") {
    const auto c = GemvClusterConstants::of(spec);
    return GemvConstants{.ROWS = c.ROWS,
                         .K = c.K,
                         .N = c.N,
                         .WEIGHT = c.WEIGHT,
                         .EPILOGUE = c.EPILOGUE,
                         .COLS = c.COLS,
                         .TILED = c.TILED}
        .spec();
  }
  if (spec.kernel != "gemv_rope_kv") fail("gemv_equivalent: {} is not a gemv", spec.uri());
  const auto c = GemvRopeKvConstants::of(spec);
  // Constants are at most 2^24 (validate), so N stays exact.
  return GemvConstants{.ROWS = c.ROWS,
                       .K = c.K,
                       .N = kernels::gemv_rope_kv_columns(c.HEADS, c.KV_HEADS, c.HEAD_DIM),
                       .WEIGHT = c.WEIGHT,
                       .EPILOGUE = kc::kEpilogueBF16,
                       .COLS = c.COLS,
                       .TILED = c.TILED}
      .spec();
}

// The split of a gemv spec (of another gemv kernel: of its gemv_equivalent).
inline kernels::GemvSplit gemv_split_of(const KernelSpec& gemv) {
  return kernels::gemv_split(gemv.constant("K"), gemv.constant("N"), gemv.constant("WEIGHT"));
}

// gemv, gemv_cluster, gemv_rope_kv: the column tiles one CTA runs (GemvSplit::tiles): 1, or more where K is
// too short to give each of a tile's warps 4 steps.
inline int64_t gemv_tiles_per_cta(const KernelSpec& spec) { return gemv_split_of(gemv_equivalent(spec)).tiles; }

// The most CTAs a column tile of this GEMV's shape may split its K over as gemv_cluster: every warp of the
// cluster at least one K step, for a narrow output (GemvSplit::narrow); 1 where the shape is not narrow.
inline int64_t gemv_cluster_split_limit(const KernelSpec& spec) {
  const kernels::GemvSplit s = gemv_split_of(gemv_equivalent(spec));
  if (!s.narrow) return 1;
  return std::max<int64_t>(1, s.steps / s.ksplit);
}

namespace kernel_desc {

// grid (ceil(ceil(N / COLS) / TILES) [x CSPLIT], ceil(rows / ROWS)), 32 x WARPS threads, the ring's
// dynamic shared memory where it has one.
inline LaunchShape gemv_launch(const KernelSpec& spec, int64_t rows) {
  const KernelSpec g = gemv_equivalent(spec);
  const int64_t row_tile = g.constant("ROWS"), cols = g.constant("COLS");
  if (cols != 16 && (cols != 32 || g.constant("EPILOGUE") == kc::kEpilogueSwiGLU))
    fail("launch_shape {}: COLS is {}; gemv takes 16, or 32 with an epilogue other than SwiGLU", spec.uri(), cols);
  const kernels::GemvSplit split = gemv_split_of(g);
  const kernels::GemvRing ring = kernels::gemv_ring(g.constant("K"), g.constant("N"), g.constant("WEIGHT"),
                                                    g.constant("EPILOGUE"), row_tile, cols);
  LaunchShape s;
  s.grid[0] = kernels::ceil_div(kernels::ceil_div(g.constant("N"), cols), split.tiles);
  if (spec.kernel == "gemv_cluster") s.grid[0] = product({s.grid[0], spec.constant("CSPLIT")});
  s.grid[1] = kernels::ceil_div(rows, row_tile);
  s.block = 32 * split.warps;
  s.smem = ring.dynamic ? ring.bytes : 0;
  s.rows_axis = 1;
  s.rows_per_block = row_tile;
  return s;
}

// Few-row GEMV: y[r, j] = epilogue(sum_k w[j, k] x[r, k]) for r < rows <= ROWS (rows beyond ROWS are
// covered by grid.y tiles). WEIGHT: kc::kWeight*; EPILOGUE: kc::kEpilogue*; COLS: output columns per CTA,
// 16, or 32 without SwiGLU. kc::kEpilogueTop1 writes, in place of y's logits, one 16-byte top1 partial per
// (row, CTA): y is [rows, ceil(N / COLS)] records. TILED: w in the tiled weight layout
// (kernels/weight_layout.h), else row-major.
inline KernelDef gemv() {
  const auto w_rows = [](const KernelSpec& s) {
    return product({s.constant("EPILOGUE") == kc::kEpilogueSwiGLU ? 2 : 1, s.constant("N")});
  };
  const auto fp8 = [](const KernelSpec& s) { return s.constant("WEIGHT") == kc::kWeightFP8; };
  // y: logits in fp32, top1 records (four 4-byte words, fp32 and an id's bits), else bf16.
  const DTypeFn y_dtype = [](const KernelSpec& s) {
    const int64_t epi = s.constant("EPILOGUE");
    return epi == kc::kEpilogueF32 || epi == kc::kEpilogueTop1 ? DType::F32 : DType::BF16;
  };
  return {
      .name = "gemv",
      .source = "gemv.cuh",
      .function = "tfe::kernels::gemv",
      .constants = GemvConstants::names(),
      .params = {weights(in(
                     "w", [=](const KernelSpec& s) { return fp8(s) ? DType::F8_E4M3 : DType::BF16; },
                     [=](const KernelSpec& s, const Reach&) {
                       return product({w_rows(s), s.constant("K"), fp8(s) ? 1 : kBf16});
                     })),
                 weights(in("scale", DType::F32,
                            [=](const KernelSpec& s, const Reach&) {
                              return fp8(s) ? product({w_rows(s), kF32}) : 0;
                            })),
                 in("x", DType::BF16,
                    [](const KernelSpec& s, const Reach& r) {
                      return product({r.rows, s.constant("K"), kBf16});
                    }),
                 out("y", y_dtype,
                     [](const KernelSpec& s, const Reach& r) {
                       const int64_t n = s.constant("N"), epi = s.constant("EPILOGUE");
                       if (epi == kc::kEpilogueF32) return product({r.rows, n, kF32});
                       if (epi == kc::kEpilogueTop1)  // one record a column tile
                         return product({r.rows, kernels::ceil_div(n, s.constant("COLS")), kc::kTop1PartBytes});
                       return product({r.rows, n, kBf16});
                     }),
                 in("residual", DType::BF16,
                    [](const KernelSpec& s, const Reach& r) {
                      const bool residual = s.constant("EPILOGUE") == kc::kEpilogueResidual;
                      return residual ? product({r.rows, s.constant("N"), kBf16}) : 0;
                    }),
                 i64("rows")},
      .launch = gemv_launch,
  };
}

// A parameter of gemv's, reaching what it reaches in the spec's GEMV (gemv_equivalent).
inline KernelParam as_gemv_param(const KernelParam& p) {
  KernelParam q = p;
  if (q.reach)
    q.reach = [reach = p.reach](const KernelSpec& s, const Reach& r) { return reach(gemv_equivalent(s), r); };
  if (q.dtype) q.dtype = [dtype = p.dtype](const KernelSpec& s) { return dtype(gemv_equivalent(s)); };
  return q;
}

// gemv over a narrow output (fewer than 64 tiles of 16 columns) with each column tile's K split over a
// cluster of CSPLIT CTAs, joined through distributed shared memory; grid.x is gemv's times CSPLIT. Its
// parameters are gemv's.
inline KernelDef gemv_cluster() {
  KernelDef d = gemv();
  d.name = "gemv_cluster";
  d.function = "tfe::kernels::gemv_cluster";
  d.constants = GemvClusterConstants::names();
  for (auto& p : d.params) p = as_gemv_param(p);
  return d;
}

// The draft's wqkv GEMV (N = (HEADS + 2 KV_HEADS) x HEAD_DIM columns, [q | k | v]) with qk_rope_kv as its
// epilogue, for heads without qk_norm: q rotated into q_out, k rotated and v as is into the slot's ring row
// (pos[r] + pos_offset mod RING). ROWS, K, WEIGHT, COLS and TILED as for gemv.
inline KernelDef gemv_rope_kv() {
  // w, scale and x: its GEMV's.
  const KernelDef g = gemv();
  const auto gemv_param = [&g](std::string_view name) {
    for (const auto& p : g.params)
      if (p.name == name) return as_gemv_param(p);
    fail("gemv_rope_kv: gemv has no parameter `{}`", name);
  };
  const ReachFn inv_freq = [](const KernelSpec& s, const Reach&) {
    return product({s.constant("HEAD_DIM") / 2, kF32});
  };
  const ReachFn rows_i32 = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn ring = [](const KernelSpec& s, const Reach& r) {
    return product({r.slots, s.constant("RING"), s.constant("KV_HEADS"), s.constant("HEAD_DIM"), kBf16});
  };
  return {
      .name = "gemv_rope_kv",
      .source = "gemv.cuh",
      .function = "tfe::kernels::gemv_rope_kv",
      .constants = GemvRopeKvConstants::names(),
      .params = {gemv_param("w"), gemv_param("scale"), gemv_param("x"), weights(in("inv_freq", DType::F32, inv_freq)),
                 in("slot", DType::I32, rows_i32), in("pos", DType::I32, rows_i32), i64("pos_offset"),
                 out("q_out", DType::BF16,
                     [](const KernelSpec& s, const Reach& r) {
                       return product({r.rows, s.constant("HEADS"), s.constant("HEAD_DIM"), kBf16});
                     }),
                 state(out("ring_k", DType::BF16, ring)), state(out("ring_v", DType::BF16, ring)), i64("rows")},
      .launch = gemv_launch,  // its GEMV's
  };
}

}  // namespace kernel_desc
}  // namespace tfe
#endif
