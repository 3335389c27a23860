// Few-row GEMV on the tensor cores: y[r, j] = epilogue(sum_k w[j, k] x[r, k]) for up to ROWS input rows
// per CTA (grid.y tiles larger row counts).
//
// Mapping (GemvShape, from gemv.h as the launch shape): a column tile is COLS (16 or 32) output columns
// j0..j0+COLS-1 and KSPLIT warps; its warp kw takes the K steps kw, kw + KSPLIT, ... A CTA runs TILES
// tiles side by side (one, unless K is too short to give each warp 4 steps). Each step is one mma.sync
// m16n8k16 tile row per 16 weight rows: lane (g = lane / 4, t = lane % 4) loads one 16-byte chunk of
// weight rows j0+g and j0+g+8 (and j0+16+g, j0+24+g at COLS 32) at k0 = step * 4E + t * E, and the
// 16-byte chunk of x at the same k0 for input row g (+8 per n tile). A dot product is invariant under a
// permutation of k shared by both operands, so the contiguous chunks are fed to the mma as if they were
// its k columns. Each weight byte is read once
// (streaming, no L1 allocation); each x chunk serves 16 weight rows (32 for SwiGLU and at COLS 32). The
// KSPLIT partial tiles are summed in warp order through shared memory, so the result does not depend on
// scheduling. A column's sum is the same at COLS 16 and 32: the second 16 columns only share x's loads,
// which at 16 rows and in FP8 cost as much L2 traffic as the weights themselves.
//
// SwiGLU: w holds 2N rows (gate 0..N-1, up N..2N-1); the warp runs a second tile on rows N+j0.., whose
// accumulators land in the same lanes as the gate's, and writes y = bf16(bf16(silu(bf16(gate))) * bf16(up)).
// FP8 (e4m3 rows with an f32 scale per weight row): chunks widen exactly to bf16; y = scale_j * acc. Where
// registers allow (Widen::bits), a chunk widens by bit placement alone to w * 2^-120 and x is scaled by
// 2^64, so the mma's sums are the unscaled ones times 2^-56, bit for bit (both factors are powers of two);
// the writer multiplies them back before the epilogue (fp8x4_widen).
// Top1 (the dense vocabulary head): instead of its COLS fp32 logits, a column tile writes per input row one
// 16-byte Top1Part of them (max, lowest column at it, sum exp(l - max); write_top1_parts), and top1 joins a row's
// ceil(N / COLS) records. The logits never go to memory, and the pass over them that top1 used to make (a
// load, two block reductions, a fence and a ticket per chunk of them) is folded into shuffles of the
// registers that already hold them.
//
// Main loop: a rolling pipeline per warp. Each lane copies its chunks of step i + STAGES - 1 (weights
// through L2 only, cp.async.cg: they stream once; x through L1, cp.async.ca) into a ring of STAGES steps
// in shared memory (static, or dynamic where the ring is larger than 48 KB: see DYNAMIC), one commit group
// per step, while it computes step i. x rides in the ring so that its L2 latency hides behind the
// weights'; where two stages of both do not fit, x is loaded into registers one step ahead. A lane reads back only the
// chunks its own copies wrote, so cp.async.wait_group alone orders the ring, with no barrier, and the slot layout
// [stage][chunk][lane] makes every 16-byte shared access of a warp 4 wavefronts. Rows that are not 16-byte aligned at
// run time go through the same ring with plain loads. Shapes whose chunks straddle a row's end, and narrow outputs (see
// RING), use the direct-load loop instead: UNROLL steps of loads into registers, then their mmas. Both loops run the
// same per-step arithmetic in the same per-warp step order, so they give the same bits.
//
// Dependent launch: the ring's first weight stages, or the direct-load loop's first batch of weights, are
// issued before the wait for the predecessor (the weights are constant during a pass), x after it; the
// successor may launch once every CTA has read its weights. Without the launch attribute both points are
// no-ops and the order is the plain one.
#pragma once
#include "common.cuh"
#include "gemv.h"
#include "rope.cuh"

namespace tfe {
namespace kernels {

struct GemvParams {
  const void* w;         // [N or 2N (SwiGLU), K]: bf16, or e4m3 when WEIGHT is kWeightFP8
  const float* scale;    // FP8: [N or 2N] per weight row; unused for bf16
  const bf16* x;         // [rows, K]
  void* y;               // [rows, N]: f32 for kEpilogueF32, else bf16, may alias residual; for kEpilogueTop1
                         // [rows, ceil(N / COLS)] Top1Part records
  const bf16* residual;  // [rows, N] for kEpilogueResidual, else unused
  long long rows;
};
static_assert(sizeof(GemvParams) == 8 * 6, "one 8-byte slot per registry parameter");

template <long long K, long long N, long long WEIGHT, long long EPILOGUE, long long ROWS, long long COLS>
struct GemvShape {
  static_assert(COLS == 16 || (COLS == 32 && EPILOGUE != kEpilogueSwiGLU),
                "gemv: COLS is 16, or 32 without SwiGLU (whose two tiles are gate and up)");
  // How K and the columns split over warps and CTAs, and the ring (gemv.h, which the launch shape reads too).
  static constexpr GemvSplit SPLIT_SHAPE = gemv_split(K, N, WEIGHT);
  static constexpr GemvRing RING_SHAPE = gemv_ring(K, N, WEIGHT, EPILOGUE, ROWS, COLS);
  static constexpr bool FP8 = SPLIT_SHAPE.fp8;
  static constexpr int WBYTES = static_cast<int>(SPLIT_SHAPE.wbytes);
  static constexpr int E = static_cast<int>(SPLIT_SHAPE.e);  // k elements in one lane's 16-byte weight chunk
  static constexpr long long STEP = SPLIT_SHAPE.step;        // k covered by one warp step (4 lanes per weight row)
  static constexpr long long STEPS = SPLIT_SHAPE.steps;
  static constexpr int MT = static_cast<int>(RING_SHAPE.mt);  // 16-row weight tiles
  static constexpr int NT = static_cast<int>(RING_SHAPE.nt);  // 8-row input tiles
  static constexpr bool NARROW = SPLIT_SHAPE.narrow;
  static constexpr int KSPLIT = static_cast<int>(SPLIT_SHAPE.ksplit);
  static constexpr int TILES = static_cast<int>(SPLIT_SHAPE.tiles);  // column tiles a CTA
  static constexpr int WARPS = static_cast<int>(SPLIT_SHAPE.warps);
  static constexpr int XCHUNKS = static_cast<int>(RING_SHAPE.xchunks);  // 16-byte x chunks per k0
  static constexpr int MMAS = E / 4;                                    // k16 mmas per chunk
  static constexpr bool W_VEC = RING_SHAPE.w_vec;
  static constexpr bool X_VEC = RING_SHAPE.x_vec;
  static constexpr bool RING = RING_SHAPE.ring;
  static constexpr bool DYNAMIC = RING_SHAPE.dynamic;
  static constexpr long long BUDGET = RING_SHAPE.budget;
  static constexpr int W_SLOTS = static_cast<int>(RING_SHAPE.w_slots);
  static constexpr bool X_RING = RING_SHAPE.x_ring;
  static constexpr int SLOTS = static_cast<int>(RING_SHAPE.slots);
  static constexpr int STAGES = static_cast<int>(RING_SHAPE.stages);
  static constexpr long long RING_BYTES = RING_SHAPE.bytes;
  static_assert(!RING || STAGES >= 2, "the ring holds the step being computed and at least one in flight");
  // Steps per batch of the direct-load loop, measured: 4 for bf16 at one n tile; 2 for FP8 and for two n
  // tiles, where deeper unrolling costs occupancy and measured slower. A narrow output's few CTAs (one per
  // SM) have the registers for twice that at one weight tile, and lr_a (K 4096, 32 CTAs) measured 0.5-0.6 us
  // faster with it. (The batch depth changes no sum: each warp's steps run in the same order.)
  static constexpr int DEEP = NARROW && MT == 1 ? 2 : 1;
  static constexpr int UNROLL = DEEP * ((FP8 || NT > 1) ? 2 : 4);
  // CTAs per SM the registers must allow (__launch_bounds__; a narrow output has fewer CTAs than SMs). Left
  // to itself, ptxas cut the ring loop to 40-64 registers with a few bytes of spills; these bounds leave it
  // what it needs without a spill.
  static constexpr int MIN_CTAS = NARROW ? 1 : !RING || DYNAMIC || (MT == 2 && NT == 2) ? 2 : NT == 1 ? 4 : 3;
};

// The 16 bytes at byte offset `at` of a row of `len` bytes: a 16-byte load when allowed, else bytewise
// with zeros past the row's end (the K tail).
template <bool VEC, int ELEM, bool STREAM>
__device__ __forceinline__ uint4 load_chunk(const unsigned char* row, long long at, long long len, bool vec_ok) {
  if (VEC && vec_ok && at + 16 <= len) {
    const uint4* ptr = reinterpret_cast<const uint4*>(row + at);
    if constexpr (STREAM) {
      uint4 v;
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(ptr));
      return v;
    } else {
      return *ptr;
    }
  }
  unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int b = 0; b < 16; b += ELEM) {
    if (at + b < len) {
      const unsigned v = ELEM == 2 ? static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(row + at + b))
                                   : static_cast<unsigned>(row[at + b]);
      w[b / 4] |= v << (8 * (b % 4));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Where the 16 bytes at byte `at` of weight row r lie, as a row part plus an `at` part (the planner's
// weight layouts, kernels/weight_layout.h, which tiles the matrices at upload). Row-major: r * ROW_BYTES + at.
// Tiled (TILED = 1): each 16-row tile holds its rows interleaved one 64-byte K step at a time, so that a
// warp's 16-byte chunks of one step (lane g * 4 + t: row g or g + 8, bytes 16 t of the step) are 512
// consecutive bytes and a tile's steps follow one another: a step is a 1 KB block, rows r % 16 < 8 in its
// first half, row r % 8 at 64 (r % 8) within the half. Measured (bench_gemv, rows 1, COLS 16, five
// linears): bf16 202.2 -> 178.0 us, FP8 112.4 -> 108.2: a warp's request then covers four whole 128-byte
// lines instead of eight half lines of eight rows.
template <bool TILED, long long ROW_BYTES>
__device__ __forceinline__ long long weight_row_offset(long long r) {
  if constexpr (TILED) return (r >> 4) * 16 * ROW_BYTES + ((r >> 3) & 1) * 512 + (r & 7) * 64;
  return r * ROW_BYTES;
}
template <bool TILED>
__device__ __forceinline__ long long weight_at_offset(long long at) {
  if constexpr (TILED) return (at >> 6) * 1024 + (at & 63);
  return at;
}

// Four e4m3 (a 32-bit word, low byte first) -> two bf16x2 words (bytes 0, 1 and bytes 2, 3), each value
// the weight times 2^-120, exactly, by bit placement: three integer instructions a word where
// fp8x2_to_bf16x2 takes four (a packed cvt, two f16 -> f32, a byte permute). e4m3 is s eeee mmm (bias 7);
// placed at bf16 bits 15 and 10..4 it reads as s 0000eeee mmm0000 (bias 127): a normal (e > 0) is
// 2^(e-127) (1 + m/8) = w 2^-120, a subnormal (e = 0) is 2^-126 (m/8) = w 2^-120 as well, and zeros keep
// their sign. The prmt copies each byte's sign over the byte above it (selector nibbles 8-15), so one
// shift left by 4 brings the sign to bit 15 and e, m to bits 10..4 of each half; the mask drops the
// sign's other copies and what the low half shifted into the high one. The mma then takes bf16 inputs as
// small as 2^-129 (subnormal), and x is scaled by 2^64 (gemv_step) so that the products, w x 2^-56, stay
// in fp32's normal range wherever w x is at least 2^-70. e4m3's NaN codes (s 1111 111) would become the
// finite +-1.875 x 2^-112 here (fp8x2_to_bf16x2 keeps them NaN): quantize_fp8 never writes one, and the
// head writer, `--verify` and the runtime's upload refuse a tensor holding one (check_e4m3_finite).
__device__ __forceinline__ void fp8x4_widen(unsigned u, unsigned& lo, unsigned& hi) {
  unsigned b01, b23;
  asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(b01) : "r"(u));
  asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(b23) : "r"(u));
  lo = (b01 << 4) & 0x87F087F0u;
  hi = (b23 << 4) & 0x87F087F0u;
}

// How FP8 chunks widen: by the f16 path (exact values), or by bit placement (values times 2^-120, x times
// 2^64; the sums times 2^-56). Bit placement needs one register more (x's scale), and where a shape's
// registers are at its cap it would spill: there the f16 path stays.
enum class Widen { f16, bits };
template <typename S, Widen W>
constexpr float kAccUnscale = S::FP8&& W == Widen::bits ? 0x1p56f : 1.0f;

// One lane's weight chunk as bf16x2 words, low k first: 4 words (bf16) or 8 words (e4m3 widened).
template <bool FP8, Widen W>
__device__ __forceinline__ void widen(const uint4 c, unsigned (&out)[FP8 ? 8 : 4]) {
  if constexpr (FP8) {
    const unsigned in[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (W == Widen::bits) {
        fp8x4_widen(in[i], out[2 * i], out[2 * i + 1]);
      } else {
        out[2 * i] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] & 0xffffu));
        out[2 * i + 1] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] >> 16));
      }
    }
  } else {
    out[0] = c.x;
    out[1] = c.y;
    out[2] = c.z;
    out[3] = c.w;
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// One step of one warp: the MT x NT tiles over the step's k, in the one order both main loops use.
template <typename S, Widen W>
__device__ __forceinline__ void gemv_step(float (&acc)[S::MT][S::NT][4], const uint4 (&wc)[S::MT][2],
                                          const uint4 (&xc)[S::NT][S::XCHUNKS]) {
  constexpr int P = S::E / 2;  // bf16x2 words per widened chunk
  unsigned b[S::NT][P];
#pragma unroll
  for (int n = 0; n < S::NT; ++n)
#pragma unroll
    for (int c = 0; c < S::XCHUNKS; ++c) {
      b[n][4 * c] = xc[n][c].x;
      b[n][4 * c + 1] = xc[n][c].y;
      b[n][4 * c + 2] = xc[n][c].z;
      b[n][4 * c + 3] = xc[n][c].w;
    }
  if constexpr (S::FP8 && W == Widen::bits) {
    // x times 2^64 (0x5F80 is bf16 2^64): exact for every finite x below 2^64, a subnormal x made normal.
#pragma unroll
    for (int n = 0; n < S::NT; ++n)
#pragma unroll
      for (int q = 0; q < P; ++q) asm("mul.rn.bf16x2 %0, %0, %1;" : "+r"(b[n][q]) : "r"(0x5F805F80u));
  }
#pragma unroll
  for (int m = 0; m < S::MT; ++m) {
    unsigned a_lo[P], a_hi[P];  // rows g and g+8
    widen<S::FP8, W>(wc[m][0], a_lo);
    widen<S::FP8, W>(wc[m][1], a_hi);
#pragma unroll
    for (int q = 0; q < S::MMAS; ++q)
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
        mma_bf16(acc[m][n], a_lo[2 * q], a_hi[2 * q], a_lo[2 * q + 1], a_hi[2 * q + 1], b[n][2 * q], b[n][2 * q + 1]);
  }
}

// kEpilogueTop1, in a tile's first warp once the K split is joined: per input row, one Top1Part of the
// tile's columns (record `tile` of the row's PARTS = ceil(N / COLS)) instead of its COLS logits, which top1
// then joins. The logits are the ones kEpilogueF32 would store (FP8: acc times the row scale), so the max
// and its index are exact; only sum exp(l - max) has an order of its own. Lane (g, t) holds, of input row
// n * 8 + 2t + b, columns j0 + 16m + g + 8h (accumulator 2h + b of tile (m, n)): its own MT x 2 are folded
// in registers in column order, then the 8 lanes of one t (lane bits 2-4) by xor 4, 8, 16 butterflies. Both
// orders are fixed, and both lanes of a butterfly step combine the same two values (compare, or add, which
// commutes), so every lane ends with the same bits whatever the scheduling. Columns past N (the tail tile)
// are left out; rows past nrows are computed (the shuffles need every lane) but not stored.
template <typename S, long long N, long long COLS>
__device__ __forceinline__ void write_top1_parts(const float (&acc)[S::MT][S::NT][4], const float* scale, Top1Part* out,
                                                 long long tile, long long row0, long long nrows, int g, int t) {
  static_assert(S::MT == COLS / 16, "one weight tile per 16 columns (not SwiGLU)");
  constexpr long long PARTS = ceil_div(N, COLS);
  const long long j0 = tile * COLS;
  bool in[S::MT][2];
  float sc[S::MT][2];
#pragma unroll
  for (int m = 0; m < S::MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long j = j0 + 16 * m + g + 8 * h;
      in[m][h] = j < N;
      sc[m][h] = S::FP8 && in[m][h] ? scale[j] : 1.0f;
    }
  const auto logit = [&](int m, int n, int i) { return S::FP8 ? acc[m][n][i] * sc[m][i >> 1] : acc[m][n][i]; };
  Top1Part* row_out = out + row0 * PARTS + tile;
#pragma unroll
  for (int n = 0; n < S::NT; ++n)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      ArgMax best{neg_inf(), 0x7fffffff};
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float v = logit(m, n, 2 * h + b);
          const int j = static_cast<int>(j0) + 16 * m + g + 8 * h;
          if (in[m][h] && better(v, j, best.v, best.i)) best = ArgMax{v, j};
        }
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best.v, o);
        const int i = __shfl_xor_sync(0xffffffffu, best.i, o);
        if (better(v, i, best.v, best.i)) best = ArgMax{v, i};
      }
      float sum = 0.0f;
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (in[m][h]) sum += expf(logit(m, n, 2 * h + b) - best.v);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const long long r = n * 8 + 2 * t + b;
      if (g == 0 && r < nrows) row_out[r * PARTS] = Top1Part{best.v, best.i, sum, 0.0f};
    }
}

// Output column of lane row h (0: g, 1: g + 8) of 16-row weight tile m in column tile `tile`; SwiGLU's
// second weight tile (the up rows) holds the same columns as its first. PAIR > 0 (gemv_rope_kv, PAIR =
// HEAD_DIM / 2): 16-column sub-tile u = tile * MT + m holds, of head u / (PAIR / 8), the columns i and
// i + PAIR for i = 8 (u % (PAIR / 8)) + g, so that each lane's two rows are one rotate-half pair.
template <long long EPI, long long COLS, long long PAIR>
__device__ __forceinline__ long long gemv_column(long long tile, int m, int g, int h) {
  if constexpr (PAIR > 0) {
    constexpr long long SUBTILES_PER_HEAD = PAIR / 8;
    const long long u = tile * (COLS / 16) + m;
    return u / SUBTILES_PER_HEAD * 2 * PAIR + u % SUBTILES_PER_HEAD * 8 + g + PAIR * h;
  } else {
    return tile * COLS + (EPI == kEpilogueSwiGLU ? 0 : 16 * m) + g + 8 * h;
  }
}

// One CTA of a GEMV: the K loop, the join of the K split, and then, in each column tile's writer warp
// (kw 0), epilogue(acc, tile, row0, nrows, g, t) with the tile's sums: accumulator i of tile (m, n) is
// column gemv_column(tile, m, g, i / 2) of input row row0 + n * 8 + 2t + (i % 2), this lane's (g = lane /
// 4, t = lane % 4); rows past nrows are not the input's. kEpilogueTop1 is written here, into `out`, with
// the FP8 row scales `scale`.
// CSPLIT > 1 (gemv_cluster): a column tile's K is split further over the CSPLIT CTAs of a cluster; CTA
// rank c's warp w runs K split c * KSPLIT + w, and rank 0's writer adds the other ranks' joined tiles in
// rank order through distributed shared memory before its epilogue.
template <long long K, long long N, long long WEIGHT, long long EPI, long long ROWS, long long COLS, long long PAIR,
          long long CSPLIT, bool TILED, typename Epilogue>
__device__ __forceinline__ void gemv_run(const void* w_ptr, const float* scale, const bf16* x_ptr, void* out,
                                         long long rows, Epilogue&& epilogue) {
  using S = GemvShape<K, N, WEIGHT, EPI, ROWS, COLS>;
  // Widen::bits needs a register more than the f16 path (x's scale). Two weight tiles (COLS 32, SwiGLU) at
  // one input tile are at their cap of 64 registers and spill with it, except on tiled weights with a plain
  // epilogue (nvcc -Xptxas -v, scripts/check_kernels.sh): those keep the f16 path, the same sums.
  constexpr bool AT_CAP =
      S::FP8 && S::NT == 1 && S::MT == 2 && (!TILED || EPI == kEpilogueSwiGLU || EPI == kEpilogueTop1);
  constexpr Widen W = AT_CAP ? Widen::f16 : Widen::bits;
  constexpr long long W_ROW_BYTES = K * S::WBYTES, X_ROW_BYTES = K * 2;
  // The cluster split serves narrow outputs, which run the direct-load loop at one tile a CTA.
  static_assert(CSPLIT == 1 || (S::NARROW && S::TILES == 1), "gemv: a cluster split needs a narrow output");
  // A tiled matrix is whole tiles of 16 rows and 64-byte steps; every chunk is then inside its row.
  static_assert(!TILED || (W_ROW_BYTES % 64 == 0 && N % 16 == 0),
                "gemv: tiled weights need K steps of 64 bytes "
                "and whole 16-row tiles");
  constexpr long long KSTRIDE = S::KSPLIT * CSPLIT;  // K splits of a column tile, over its cluster
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // Warp `warp` runs K split kw of the CTA's column tile `warp / KSPLIT`; tiles past N (the last CTA's)
  // load nothing and write nothing, but join and wait with the rest. At one tile a CTA the tile stays a
  // function of blockIdx alone, so its weight-row pointers stay in uniform registers. Under a cluster
  // split, kw counts the cluster's warps (rank-major) and the join below uses the CTA's own warp index.
  const int rank = CSPLIT > 1 ? static_cast<int>(blockIdx.x % CSPLIT) : 0;
  const int kw = S::TILES == 1 ? warp + rank * S::KSPLIT : warp % S::KSPLIT;
  const long long tile = S::TILES == 1 ? static_cast<long long>(blockIdx.x / CSPLIT)
                                       : static_cast<long long>(blockIdx.x) * S::TILES + warp / S::KSPLIT;
  const long long j0 = tile * COLS;
  const long long row0 = static_cast<long long>(blockIdx.y) * ROWS;
  const long long nrows = min_ll(ROWS, rows - row0);
  if (nrows <= 0) return;

  const unsigned char* w = static_cast<const unsigned char*>(w_ptr);
  const unsigned char* x = reinterpret_cast<const unsigned char*>(x_ptr + row0 * K);
  const bool w_vec = (reinterpret_cast<unsigned long long>(w) & 15) == 0;
  const bool x_vec = (reinterpret_cast<unsigned long long>(x) & 15) == 0;

  // Output column and weight row of tile m's lane rows h = 0, 1: SwiGLU's second tile is the up half (rows
  // N..2N-1) of the same columns.
  const auto column = [&](int m, int h) {
    if constexpr (PAIR > 0) return gemv_column<EPI, COLS, PAIR>(tile, m, g, h);
    return j0 + (EPI == kEpilogueSwiGLU ? 0 : 16 * m) + g + 8 * h;  // gemv_column's, from j0 computed once
  };
  const auto weight_row = [&](int m, int h) { return (EPI == kEpilogueSwiGLU ? m * N : 0) + column(m, h); };
  // This lane's two weight rows per tile and its input row per n tile; null when out of range.
  const unsigned char* wrow[S::MT][2];
#pragma unroll
  for (int m = 0; m < S::MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wrow[m][h] = column(m, h) < N ? w + weight_row_offset<TILED, W_ROW_BYTES>(weight_row(m, h)) : nullptr;
  const unsigned char* xrow[S::NT];
#pragma unroll
  for (int n = 0; n < S::NT; ++n) {
    const long long r = n * 8 + g;
    xrow[n] = r < nrows ? x + r * X_ROW_BYTES : nullptr;
  }

  float acc[S::MT][S::NT][4];
#pragma unroll
  for (int m = 0; m < S::MT; ++m)
#pragma unroll
    for (int n = 0; n < S::NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;

  // The direct-load loop: UNROLL steps of loads, then their mmas. The first batch's weights are loaded
  // before the wait for the predecessor (weights are constant during a pass), its x after it, as the ring
  // loop's prologue does; a warp with no K step waits after the loop.
  auto direct_loop = [&] {
    bool waited = false;
    for (long long s0 = kw; s0 < S::STEPS; s0 += KSTRIDE * S::UNROLL) {
      uint4 wc[S::UNROLL][S::MT][2];
      uint4 xc[S::UNROLL][S::NT][S::XCHUNKS];
#pragma unroll
      for (int u = 0; u < S::UNROLL; ++u) {
        const long long s = s0 + u * KSTRIDE;
        const long long k0 = s * S::STEP + t * S::E;
        const bool live = s < S::STEPS;
#pragma unroll
        for (int m = 0; m < S::MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wc[u][m][h] = live && wrow[m][h]
                              ? load_chunk<S::W_VEC, S::WBYTES, true>(
                                    wrow[m][h] + (weight_at_offset<TILED>(k0 * S::WBYTES) - k0 * S::WBYTES),
                                    k0 * S::WBYTES, W_ROW_BYTES, w_vec)
                              : make_uint4(0u, 0u, 0u, 0u);
      }
      if (!waited) {
        wait_for_predecessors();
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < S::UNROLL; ++u) {
        const long long s = s0 + u * KSTRIDE;
        const long long k0 = s * S::STEP + t * S::E;
        const bool live = s < S::STEPS;
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int c = 0; c < S::XCHUNKS; ++c)
            xc[u][n][c] = live && xrow[n]
                              ? load_chunk<S::X_VEC, 2, false>(xrow[n], (k0 + 8 * c) * 2, X_ROW_BYTES, x_vec)
                              : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < S::UNROLL; ++u) {
        if (s0 + u * KSTRIDE >= S::STEPS) break;
        gemv_step<S, W>(acc, wc[u], xc[u]);
      }
    }
    if (!waited) wait_for_predecessors();
  };

  // Join the K split in warp order: a tile's first warp (kw 0) adds its warps kw 1, 2, ... in turn.
  // `part(v)` is where warp v of the CTA leaves its tiles when its kw > 0, ACC floats per lane,
  // lane-minor.
  constexpr int ACC = S::MT * S::NT * 4;
  auto join = [&](auto part) {
    if constexpr (S::KSPLIT > 1) {
      int kl = kw;  // the warp's K split within the CTA
      if constexpr (CSPLIT > 1) kl = warp;
      if (kl > 0) {
        float* mine = part(warp);
#pragma unroll
        for (int m = 0; m < S::MT; ++m)
#pragma unroll
          for (int n = 0; n < S::NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) mine[((m * S::NT + n) * 4 + i) * 32 + lane] = acc[m][n][i];
      }
      __syncthreads();
      if (kl > 0) return false;
      for (int v = 1; v < S::KSPLIT; ++v) {
        const float* theirs = part(warp + v);
#pragma unroll
        for (int m = 0; m < S::MT; ++m)
#pragma unroll
          for (int n = 0; n < S::NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][n][i] += theirs[((m * S::NT + n) * 4 + i) * 32 + lane];
      }
    }
    return true;
  };

  bool writer;
  if constexpr (S::RING) {
    // ring[warp][stage][chunk][lane]: each lane's chunks of one step, lane-minor so that a warp's 16-byte
    // accesses to one chunk cover 512 consecutive bytes. After the loop a warp's own ring holds its
    // partial tiles for the join (ACC x 128 bytes, less than two stages).
    __shared__ uint4 static_ring[S::DYNAMIC ? 1 : S::RING_BYTES / 16];
    extern __shared__ uint4 dynamic_ring[];
    uint4(&ring)[S::WARPS][S::STAGES][S::SLOTS][32] =
        *reinterpret_cast<uint4(*)[S::WARPS][S::STAGES][S::SLOTS][32]>(S::DYNAMIC ? dynamic_ring : static_ring);
    static_assert(ACC * 32 * 4 <= S::STAGES * S::SLOTS * 32 * 16, "a warp's partial tiles fit its ring");
    const int nsteps = static_cast<int>((S::STEPS - kw + S::KSPLIT - 1) / S::KSPLIT);  // >= 1: kw < STEPS
    const unsigned ring_lane = static_cast<unsigned>(__cvta_generic_to_shared(&ring[warp][0][0][lane]));
    constexpr unsigned STAGE_BYTES = S::SLOTS * 32 * 16, SLOT_BYTES = 32 * 16;

    // Step i of this warp (k step kw + i * KSPLIT) into ring stage `stage`: cp.async when the rows are
    // 16-byte aligned, else plain loads stored into the ring one chunk at a time (a rare path, kept from
    // adding to the registers of the common one).
    // `weights` / `xs`: which of the step's chunks to copy (the prologue copies the weights of its first
    // stages before the wait for the predecessor, their x after it).
    const bool async_fill = w_vec && (x_vec || !S::X_RING);
    auto fill = [&](int i, int stage, bool weights = true, bool xs = true) {
      const long long k0 = (kw + static_cast<long long>(i) * S::KSPLIT) * S::STEP + t * S::E;
      const unsigned dst = ring_lane + stage * STAGE_BYTES;
      if (async_fill) {
        const long long at = k0 * S::WBYTES;
        const unsigned bytes = at < W_ROW_BYTES ? 16u : 0u;
        if (weights) {
#pragma unroll
          for (int m = 0; m < S::MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              copy_async_16<false>(dst + (2 * m + h) * SLOT_BYTES,
                                   wrow[m][h] && bytes ? wrow[m][h] + weight_at_offset<TILED>(at) : w,
                                   wrow[m][h] ? bytes : 0u);
        }
        if (S::X_RING && xs) {
#pragma unroll
          for (int n = 0; n < S::NT; ++n)
#pragma unroll
            for (int c = 0; c < S::XCHUNKS; ++c) {
              const long long xat = (k0 + 8 * c) * 2;
              const bool in = xrow[n] && xat < X_ROW_BYTES;
              copy_async_16<true>(dst + (S::W_SLOTS + n * S::XCHUNKS + c) * SLOT_BYTES, in ? xrow[n] + xat : x,
                                  in ? 16u : 0u);
            }
        }
      } else {
#pragma unroll 1
        for (int slot = 0; slot < S::SLOTS; ++slot) {
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (slot < S::W_SLOTS) {
            const int m = slot >> 1, h = slot & 1;
            if (column(m, h) < N)
              v = load_chunk<S::W_VEC, S::WBYTES, true>(w + weight_row_offset<TILED, W_ROW_BYTES>(weight_row(m, h)) +
                                                            (weight_at_offset<TILED>(k0 * S::WBYTES) - k0 * S::WBYTES),
                                                        k0 * S::WBYTES, W_ROW_BYTES, w_vec);
          } else {
            const int n = (slot - S::W_SLOTS) / S::XCHUNKS, c = (slot - S::W_SLOTS) % S::XCHUNKS;
            const long long r = n * 8 + g;
            if (r < nrows)
              v = load_chunk<S::X_VEC, 2, false>(x + r * X_ROW_BYTES, (k0 + 8 * c) * 2, X_ROW_BYTES, x_vec);
          }
          ring[warp][stage][slot][lane] = v;
        }
      }
    };
    // This lane's x chunks of step i; zeros past the row's end or past the input rows.
    auto load_x = [&](int i, uint4(&xc)[S::NT][S::XCHUNKS]) {
      const long long k0 = (kw + static_cast<long long>(i) * S::KSPLIT) * S::STEP + t * S::E;
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int c = 0; c < S::XCHUNKS; ++c)
          xc[n][c] = xrow[n] ? load_chunk<S::X_VEC, 2, false>(xrow[n], (k0 + 8 * c) * 2, X_ROW_BYTES, x_vec)
                             : make_uint4(0u, 0u, 0u, 0u);
    };

    // Prologue: the first STAGES - 1 steps. Their weights (one commit group) go before the wait for the
    // predecessor, so that under programmatic launch they stream while it finishes; their x (a group per
    // step) after it. Step i's chunks are then complete once all but the latest STAGES - 2 groups are,
    // the same count as in the loop.
    if (async_fill) {
#pragma unroll
      for (int i = 0; i < S::STAGES - 1; ++i)
        if (i < nsteps) fill(i, i, true, false);
    }
    copy_async_commit();
    wait_for_predecessors();
#pragma unroll
    for (int i = 0; i < S::STAGES - 1; ++i) {
      if (i < nsteps) fill(i, i, !async_fill, true);
      copy_async_commit();  // empty groups keep the count of groups per step fixed
    }
    uint4 xa[S::NT][S::XCHUNKS], xb[S::NT][S::XCHUNKS];
    if constexpr (!S::X_RING) load_x(0, xa);
    int read = 0, write = S::STAGES - 1;
    // One step: wait for its chunks, refill the stage freed by the previous step, compute (x from the
    // ring, or from registers loaded a step ahead: the two buffers alternate so that no register copy
    // waits on a load in flight).
    auto step = [&](int i, const uint4(&xc)[S::NT][S::XCHUNKS], uint4(&x_next)[S::NT][S::XCHUNKS]) {
      copy_async_wait<S::STAGES - 2>();
      if (i + S::STAGES - 1 < nsteps) fill(i + S::STAGES - 1, write);
      copy_async_commit();
      uint4 wc[S::MT][2];
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) wc[m][h] = ring[warp][read][2 * m + h][lane];
      if constexpr (S::X_RING) {
        uint4 xr[S::NT][S::XCHUNKS];
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int c = 0; c < S::XCHUNKS; ++c) xr[n][c] = ring[warp][read][S::W_SLOTS + n * S::XCHUNKS + c][lane];
        gemv_step<S, W>(acc, wc, xr);
      } else {
        if (i + 1 < nsteps) load_x(i + 1, x_next);
        gemv_step<S, W>(acc, wc, xc);
      }
      read = read == S::STAGES - 1 ? 0 : read + 1;
      write = write == S::STAGES - 1 ? 0 : write + 1;
    };
    for (int i = 0; i < nsteps; i += 2) {
      step(i, xa, xb);
      if (i + 1 < nsteps) step(i + 1, xb, xa);
    }
    release_dependents();  // this CTA's weights are read: the next kernel may start on its own
    copy_async_wait<0>();  // only empty groups remain; the ring is free for the join
    writer = join([&](int v) { return reinterpret_cast<float*>(&ring[v][0][0][0]); });
  } else {
    direct_loop();
    release_dependents();
    __shared__ float part[S::WARPS > 1 ? S::WARPS - 1 : 1][ACC * 32];
    writer = join([&](int v) { return part[v - 1]; });
    if constexpr (CSPLIT > 1) {
      // The cluster's join: each CTA's writer leaves its joined tile in part[0] (its own warp 1's slot,
      // which it has read), and rank 0's writer adds ranks 1.. in order. Every thread of the cluster
      // reaches both barriers; the second keeps each CTA's shared memory until rank 0 has read it. (The
      // store loop repeats the warp join's: one helper lambda for both changed nvcc's code for every gemv
      // shape, ring loops too.)
      float* mine = part[0];
      if (writer)
#pragma unroll
        for (int m = 0; m < S::MT; ++m)
#pragma unroll
          for (int n = 0; n < S::NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) mine[((m * S::NT + n) * 4 + i) * 32 + lane] = acc[m][n][i];
      cluster_barrier();
      if (writer && rank == 0)
        for (int cc = 1; cc < CSPLIT; ++cc)
#pragma unroll
          for (int m = 0; m < S::MT; ++m)
#pragma unroll
            for (int n = 0; n < S::NT; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i)
                acc[m][n][i] += load_peer(mine + ((m * S::NT + n) * 4 + i) * 32 + lane, static_cast<unsigned>(cc));
      cluster_barrier();
      writer = writer && rank == 0;
    }
  }
  if (!writer) return;
  if constexpr (kAccUnscale<S, W> != 1.0f) {
#pragma unroll
    for (int m = 0; m < S::MT; ++m)
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] *= kAccUnscale<S, W>;
  }

  if constexpr (EPI == kEpilogueTop1) {
    if (tile < ceil_div(N, COLS))
      write_top1_parts<S, N, COLS>(acc, scale, static_cast<Top1Part*>(out), tile, row0, nrows, g, t);
  } else {
    epilogue(acc, tile, row0, nrows, g, t);
  }
}

// gemv and gemv_cluster: gemv_run with the elementwise epilogues (kEpilogueTop1 is gemv_run's). SwiGLU
// writes its tile 0 (gate) with tile 1 (up); the others write every tile.
template <typename Cfg, long long CSPLIT>
__device__ __forceinline__ void gemv_elementwise(const GemvParams& p) {
  using S = GemvShape<Cfg::K, Cfg::N, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS, Cfg::COLS>;
  constexpr long long N = Cfg::N, EPI = Cfg::EPILOGUE, COLS = Cfg::COLS;
  auto epilogue = [&](const float(&acc)[S::MT][S::NT][4], long long tile, long long row0, long long nrows, int g,
                      int t) {
    constexpr int OUT_TILES = EPI == kEpilogueSwiGLU ? 1 : S::MT;
#pragma unroll
    for (int m = 0; m < OUT_TILES; ++m)
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const long long j = gemv_column<EPI, COLS, 0>(tile, m, g, i >> 1);
          const long long r = n * 8 + 2 * t + (i & 1);
          if (j >= N || r >= nrows) continue;
          const long long at = (row0 + r) * N + j;
          float v = acc[m][n][i];
          if constexpr (S::FP8) v *= p.scale[j];
          if constexpr (EPI == kEpilogueF32) {
            static_cast<float*>(p.y)[at] = v;
          } else if constexpr (EPI == kEpilogueBF16) {
            static_cast<bf16*>(p.y)[at] = to_bf16(v);
          } else if constexpr (EPI == kEpilogueResidual) {
            static_cast<bf16*>(p.y)[at] = to_bf16(to_float(p.residual[at]) + v);
          } else {
            float up = acc[S::MT - 1][n][i];  // tile 1: the up rows of the same columns
            if constexpr (S::FP8) up *= p.scale[N + j];
            const float gate = round_bf16(v);
            const float a = round_bf16(silu(gate));
            static_cast<bf16*>(p.y)[at] = to_bf16(a * round_bf16(up));
          }
        }
  };
  gemv_run<Cfg::K, N, Cfg::WEIGHT, EPI, Cfg::ROWS, COLS, 0, CSPLIT, Cfg::TILED != 0>(p.w, p.scale, p.x, p.y, p.rows,
                                                                                     epilogue);
}

template <typename Cfg>
__global__ void __launch_bounds__(
    32 * GemvShape<Cfg::K, Cfg::N, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS, Cfg::COLS>::WARPS,
    GemvShape<Cfg::K, Cfg::N, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS, Cfg::COLS>::MIN_CTAS) gemv(const GemvParams p) {
  gemv_elementwise<Cfg, 1>(p);
}

// gemv_cluster: gemv over a narrow output (GemvShape::NARROW: fewer than 64 tiles of 16 columns, which
// leaves most SMs idle) with each column tile's K split over a cluster of CSPLIT CTAs (grid.x = tiles x
// CSPLIT), joined through distributed shared memory in rank order: CSPLIT times the SMs stream the
// weights. two_stage's lr_a (512 columns, 32 tiles) is the shape it is for.
using GemvClusterParams = GemvParams;  // gemv's slots

template <typename Cfg>
__global__ void TFE_CLUSTER(Cfg::CSPLIT)
    __launch_bounds__(32 * GemvShape<Cfg::K, Cfg::N, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS, Cfg::COLS>::WARPS,
                      GemvShape<Cfg::K, Cfg::N, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS, Cfg::COLS>::MIN_CTAS)
        gemv_cluster(const GemvClusterParams p) {
  gemv_elementwise<Cfg, Cfg::CSPLIT>(p);
}

// gemv_rope_kv: the draft's wqkv GEMV with qk_rope_kv (without qk_norm) as its epilogue, in place of the
// two nodes: q rotated into q_out, k rotated and v as is into the slot's ring row (position pos[r] +
// pos_offset, mod RING). N = (HEADS + 2 KV_HEADS) x HEAD_DIM columns, [q | k | v] heads; the column
// tiles hold rotate-half pairs (gemv_column with PAIR = HEAD_DIM / 2), so a lane rotates its own two
// sums with no exchange. The bits are the two-node path's: each sum is rounded to bf16 (the value qkv
// would hold), then rotated as kernels/rope.cuh does. A head with qk_norm needs the whole head's sum of
// squares first, which spans HEAD_DIM / 16 tiles: it keeps the qk_rope_kv node.
template <typename Cfg>
struct GemvRopeKvShape {
  static constexpr long long HEAD_DIM = Cfg::HEAD_DIM, HALF = HEAD_DIM / 2;
  static constexpr long long N = gemv_rope_kv_columns(Cfg::HEADS, Cfg::KV_HEADS, HEAD_DIM);
  static_assert(HEAD_DIM % 16 == 0, "gemv_rope_kv: a 16-column tile holds 8 rotate-half pairs of one head");
  using S = GemvShape<Cfg::K, N, Cfg::WEIGHT, kEpilogueBF16, Cfg::ROWS, Cfg::COLS>;
};

struct GemvRopeKvParams {
  const void* w;          // wqkv [N, K]: bf16, or e4m3 when WEIGHT is kWeightFP8
  const float* scale;     // FP8: [N] per weight row; unused for bf16
  const bf16* x;          // [rows, K]
  const float* inv_freq;  // [HEAD_DIM / 2]
  const int* slot;        // [rows]
  const int* pos;         // [rows]
  long long pos_offset;
  bf16* q_out;   // [rows, HEADS, HEAD_DIM]
  bf16* ring_k;  // [slots, RING, KV_HEADS, HEAD_DIM]
  bf16* ring_v;
  long long rows;
};
static_assert(sizeof(GemvRopeKvParams) == 8 * 11, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(32 * GemvRopeKvShape<Cfg>::S::WARPS, GemvRopeKvShape<Cfg>::S::MIN_CTAS)
    gemv_rope_kv(const GemvRopeKvParams p) {
  using R = GemvRopeKvShape<Cfg>;
  using S = typename R::S;
  constexpr long long HD = R::HEAD_DIM, HALF = R::HALF, N = R::N, QH = Cfg::HEADS, KVH = Cfg::KV_HEADS;
  auto epilogue = [&](const float(&acc)[S::MT][S::NT][4], long long tile, long long row0, long long nrows, int g,
                      int t) {
#pragma unroll
    for (int m = 0; m < S::MT; ++m) {
      const long long j = gemv_column<kEpilogueBF16, Cfg::COLS, HALF>(tile, m, g, 0);  // j + HALF: its pair
      if (j >= N) continue;
      const long long head = j / HD, i = j % HD;  // i < HALF
      const float scale_lo = S::FP8 ? p.scale[j] : 1.0f, scale_hi = S::FP8 ? p.scale[j + HALF] : 1.0f;
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (n * 8 + 2 * t + b >= nrows) continue;
          const long long r = row0 + n * 8 + 2 * t + b;
          // Lane rows g (column j) and g + 8 (j + HALF), rounded to the bf16 that qkv would hold.
          float lo = acc[m][n][b], hi = acc[m][n][2 + b];
          if constexpr (S::FP8) lo *= scale_lo, hi *= scale_hi;
          lo = round_bf16(lo);
          hi = round_bf16(hi);
          const long long position = p.pos[r] + p.pos_offset;
          const long long ring_at = (static_cast<long long>(p.slot[r]) * Cfg::RING + position % Cfg::RING) * KVH * HD;
          if (head >= QH + KVH) {  // v: stored as is
            bf16* dst = p.ring_v + ring_at + (head - QH - KVH) * HD;
            dst[i] = to_bf16(lo);
            dst[i + HALF] = to_bf16(hi);
            continue;
          }
          const RopeAngle a = rope_angle(position, p.inv_freq[i]);
          bf16* dst = head < QH ? p.q_out + (r * QH + head) * HD : p.ring_k + ring_at + (head - QH) * HD;
          dst[i] = rope_lo(lo, hi, a);
          dst[i + HALF] = rope_hi(lo, hi, a);
        }
    }
  };
  gemv_run<Cfg::K, N, Cfg::WEIGHT, kEpilogueBF16, Cfg::ROWS, Cfg::COLS, HALF, 1, Cfg::TILED != 0>(
      p.w, p.scale, p.x, nullptr, p.rows, epilogue);
}

}  // namespace kernels
}  // namespace tfe
