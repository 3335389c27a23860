// Few-row GEMV on the tensor cores: y[r, j] = epilogue(sum_k w[j, k] x[r, k]) for up to ROWS input rows
// per CTA (grid.y tiles larger row counts).
//
// Mapping (compiler/launch_shapes.cpp mirrors GemvShape): a CTA owns 16 output columns j0..j0+15 and
// KSPLIT warps; warp w takes the K steps w, w + KSPLIT, ... Each step is one mma.sync m16n8k16 tile row
// per 16 weight rows: lane (g = lane / 4, t = lane % 4) loads one 16-byte chunk of weight rows j0+g and
// j0+g+8 at k0 = step * 4E + t * E, and the 16-byte chunk of x at the same k0 for input row g (+8 per
// n tile). A dot product is invariant under a permutation of k shared by both operands, so the
// contiguous chunks are fed to the mma as if they were its k columns. Each weight byte is read once
// (streaming, no L1 allocation); each x chunk serves 16 weight rows (32 for SwiGLU). The KSPLIT partial
// tiles are summed in warp order through shared memory, so the result does not depend on scheduling.
//
// SwiGLU: w holds 2N rows (gate 0..N-1, up N..2N-1); the warp runs a second tile on rows N+j0.., whose
// accumulators land in the same lanes as the gate's, and writes y = bf16(bf16(silu(bf16(gate))) * bf16(up)).
// FP8 (e4m3 rows with an f32 scale per weight row): chunks widen exactly to bf16; y = scale_j * acc.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct GemvParams {
  const void* w;         // [N or 2N (SwiGLU), K]: bf16, or e4m3 when WEIGHT is kWeightFP8
  const float* scale;    // FP8: [N or 2N] per weight row; unused for bf16
  const bf16* x;         // [rows, K]
  void* y;               // [rows, N]: f32 for kEpilogueF32, else bf16; may alias residual
  const bf16* residual;  // [rows, N] for kEpilogueResidual, else unused
  long long rows;
};
static_assert(sizeof(GemvParams) == 8 * 6, "one 8-byte slot per registry parameter");

template <long long K, long long WEIGHT, long long EPILOGUE, long long ROWS>
struct GemvShape {
  static constexpr bool FP8 = WEIGHT == kWeightFP8;
  static constexpr int WBYTES = FP8 ? 1 : 2;
  static constexpr int E = FP8 ? 16 : 8;  // k elements in one lane's 16-byte weight chunk
  static constexpr long long STEP = 4 * E;  // k covered by one warp step (4 lanes per weight row)
  static constexpr long long STEPS = ceil_div(K, STEP);
  static constexpr int KSPLIT = static_cast<int>(min_ll(8, STEPS));  // = launch_shapes.cpp gemv_ksplit
  static constexpr int MT = EPILOGUE == kEpilogueSwiGLU ? 2 : 1;      // 16-row weight tiles per warp
  static constexpr int NT = static_cast<int>(ceil_div(ROWS, 8));       // 8-row input tiles
  static constexpr int XCHUNKS = E / 8;                                 // 16-byte x chunks per k0
  static constexpr int MMAS = E / 4;                                    // k16 mmas per chunk
  // Steps in flight per warp, measured (kernels/README.md, gemv performance): 4 for bf16 at one n tile;
  // 2 for FP8 and for two n tiles, where deeper unrolling costs occupancy and measured slower.
  static constexpr int UNROLL = (FP8 || NT > 1) ? 2 : 4;
  static constexpr bool W_VEC = (K * WBYTES) % 16 == 0;
  static constexpr bool X_VEC = K % 8 == 0;
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

// Two e4m3 -> bf16x2, exact: one packed cvt to f16x2, two f16 -> f32, and one byte permute that keeps the
// high halves (every e4m3 value is a bf16 value, so dropping the low halves loses nothing).
__device__ __forceinline__ unsigned fp8x2_widen(unsigned short u) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return __byte_perm(__float_as_uint(f.x), __float_as_uint(f.y), 0x7632);
}

// One lane's weight chunk as bf16x2 words, low k first: 4 words (bf16) or 8 words (e4m3 widened).
template <bool FP8>
__device__ __forceinline__ void widen(const uint4 c, unsigned (&out)[FP8 ? 8 : 4]) {
  if constexpr (FP8) {
    const unsigned in[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = fp8x2_widen(static_cast<unsigned short>(in[i] & 0xffffu));
      out[2 * i + 1] = fp8x2_widen(static_cast<unsigned short>(in[i] >> 16));
    }
  } else {
    out[0] = c.x;
    out[1] = c.y;
    out[2] = c.z;
    out[3] = c.w;
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

template <typename Cfg>
__global__ void __launch_bounds__(32 * GemvShape<Cfg::K, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS>::KSPLIT)
    gemv(const GemvParams p) {
  using S = GemvShape<Cfg::K, Cfg::WEIGHT, Cfg::EPILOGUE, Cfg::ROWS>;
  constexpr long long K = Cfg::K, N = Cfg::N, EPI = Cfg::EPILOGUE;
  constexpr long long W_ROW_BYTES = K * S::WBYTES, X_ROW_BYTES = K * 2;
  constexpr int P = S::E / 2;  // bf16x2 words per widened chunk

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const long long j0 = static_cast<long long>(blockIdx.x) * 16;
  const long long row0 = static_cast<long long>(blockIdx.y) * Cfg::ROWS;
  const long long nrows = min_ll(Cfg::ROWS, p.rows - row0);
  if (nrows <= 0) return;

  const unsigned char* w = static_cast<const unsigned char*>(p.w);
  const unsigned char* x = reinterpret_cast<const unsigned char*>(p.x + row0 * K);
  const bool w_vec = (reinterpret_cast<unsigned long long>(w) & 15) == 0;
  const bool x_vec = (reinterpret_cast<unsigned long long>(x) & 15) == 0;

  // This lane's two weight rows per tile (g and g+8) and its input row per n tile; null when out of range.
  const unsigned char* wrow[S::MT][2];
#pragma unroll
  for (int m = 0; m < S::MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long j = j0 + g + 8 * h;
      wrow[m][h] = j < N ? w + (m * N + j) * W_ROW_BYTES : nullptr;
    }
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

  for (long long s0 = warp; s0 < S::STEPS; s0 += static_cast<long long>(S::KSPLIT) * S::UNROLL) {
    // Issue every load of UNROLL steps before the first mma.
    uint4 wc[S::UNROLL][S::MT][2];
    uint4 xc[S::UNROLL][S::NT][S::XCHUNKS];
#pragma unroll
    for (int u = 0; u < S::UNROLL; ++u) {
      const long long s = s0 + static_cast<long long>(u) * S::KSPLIT;
      const long long k0 = s * S::STEP + t * S::E;
      const bool live = s < S::STEPS;
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wc[u][m][h] = live && wrow[m][h]
                            ? load_chunk<S::W_VEC, S::WBYTES, true>(wrow[m][h], k0 * S::WBYTES, W_ROW_BYTES, w_vec)
                            : make_uint4(0u, 0u, 0u, 0u);
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
      if (s0 + static_cast<long long>(u) * S::KSPLIT >= S::STEPS) break;
      unsigned b[S::NT][P];
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int c = 0; c < S::XCHUNKS; ++c) {
          b[n][4 * c] = xc[u][n][c].x;
          b[n][4 * c + 1] = xc[u][n][c].y;
          b[n][4 * c + 2] = xc[u][n][c].z;
          b[n][4 * c + 3] = xc[u][n][c].w;
        }
#pragma unroll
      for (int m = 0; m < S::MT; ++m) {
        unsigned a_lo[P], a_hi[P];  // rows g and g+8
        widen<S::FP8>(wc[u][m][0], a_lo);
        widen<S::FP8>(wc[u][m][1], a_hi);
#pragma unroll
        for (int q = 0; q < S::MMAS; ++q)
#pragma unroll
          for (int n = 0; n < S::NT; ++n)
            mma_bf16(acc[m][n], a_lo[2 * q], a_hi[2 * q], a_lo[2 * q + 1], a_hi[2 * q + 1], b[n][2 * q],
                     b[n][2 * q + 1]);
      }
    }
  }

  // Join the K split in warp order: warp 0 adds warps 1, 2, ... in turn.
  constexpr int ACC = S::MT * S::NT * 4;
  if constexpr (S::KSPLIT > 1) {
    __shared__ float part[S::KSPLIT - 1][ACC][32];
    if (warp > 0) {
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) part[warp - 1][(m * S::NT + n) * 4 + i][lane] = acc[m][n][i];
    }
    __syncthreads();
    if (warp > 0) return;
    for (int v = 0; v < S::KSPLIT - 1; ++v)
#pragma unroll
      for (int m = 0; m < S::MT; ++m)
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][n][i] += part[v][(m * S::NT + n) * 4 + i][lane];
  }

  // Accumulator i of tile (m, n): weight row g + 8 * (i / 2), input row n * 8 + 2t + (i % 2).
#pragma unroll
  for (int n = 0; n < S::NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const long long j = j0 + g + 8 * (i >> 1);
      const long long r = n * 8 + 2 * t + (i & 1);
      if (j >= N || r >= nrows) continue;
      const long long at = (row0 + r) * N + j;
      float v = acc[0][n][i];
      if constexpr (S::FP8) v *= p.scale[j];
      if constexpr (EPI == kEpilogueF32) {
        static_cast<float*>(p.y)[at] = v;
      } else if constexpr (EPI == kEpilogueBF16) {
        static_cast<bf16*>(p.y)[at] = to_bf16(v);
      } else if constexpr (EPI == kEpilogueResidual) {
        static_cast<bf16*>(p.y)[at] = to_bf16(to_float(p.residual[at]) + v);
      } else {
        float up = acc[S::MT - 1][n][i];
        if constexpr (S::FP8) up *= p.scale[N + j];
        const float gate = round_bf16(v);
        const float a = round_bf16(silu(gate));
        static_cast<bf16*>(p.y)[at] = to_bf16(a * round_bf16(up));
      }
    }
}

}  // namespace kernels
}  // namespace tfe
