// two_stage: exact logits of the candidates against the target's output head, their argmax (ties: lower
// target id) and the softmax over the CAND_K exact logits at it, in one kernel whose CTAs split the
// candidate rows (CAND_K rows of HIDDEN weights per row: 512 KB at H 4096, cand_k 64, bf16) so that they
// stream through many SMs. Grid (ceil(CAND_K / kRescoreWarps), rows), a warp per candidate
// (kRescoreWarps: rescore.h, which the launch shape reads too).
//   Each warp streams its candidate's target_head row with 16-byte loads, up to 16 in flight per lane (a
//   row of HIDDEN bf16, or e4m3 widened exactly and times its row scale), against n[r] read through L1 (the
//   CTA's warps share it), lanes over k, then the fixed warp tree; it writes exact [rows, CAND_K] in
//   candidate order.
//   Then the CTA takes an integer ticket from arrivals[r]; in the last CTA of the row, warp 0 joins:
//   argmax over (logit, target id), sum exp(l - max) lane-strided then the warp tree, conf = 1 / sum. It
//   writes the target id and conf of `step` and the next step's token, and returns the counter to zero.
//   The join reads the logits in candidate order whichever CTA runs it.
#pragma once
#include "common.cuh"
#include "rescore.h"

namespace tfe {
namespace kernels {

struct RescoreParams {
  const void* target_head;  // [vocab, HIDDEN]: bf16, or e4m3 when WEIGHT is kWeightFP8
  const float* scale;       // FP8: [vocab] per row; unused for bf16
  const bf16* n;            // [rows, HIDDEN]: the final-normed hidden state
  const int* cand;          // [rows, CAND_K] draft ids
  const int* d2t;           // [draft vocab]: target id = draft id + d2t[draft id]
  float* exact;             // [rows, CAND_K]
  int* arrivals;            // [rows], zero between passes
  int* out_token;           // [rows, MAX_STEPS]
  float* out_conf;          // [rows, MAX_STEPS]
  int* next_token;          // [rows]
  long long step;           // 1-based
  long long rows;
};
static_assert(sizeof(RescoreParams) == 8 * 12, "one 8-byte slot per registry parameter");

// A 16-byte weight chunk read once: no L1 allocation, so n keeps the L1.
__device__ __forceinline__ uint4 rescore_stream(const unsigned char* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// sum over one 16-byte weight chunk (8 bf16, or 16 e4m3) times the matching elements of x, low k first.
template <bool FP8>
__device__ __forceinline__ float rescore_chunk_dot(const uint4 c, const uint4* x) {
  const unsigned in[4] = {c.x, c.y, c.z, c.w};
  constexpr int WORDS = FP8 ? 8 : 4;  // bf16x2 words of the chunk
  unsigned w[WORDS];
  if constexpr (FP8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] & 0xffffu));
      w[2 * i + 1] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = in[i];
  }
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < WORDS / 4; ++h) {
    const uint4 xv = __ldg(x + h);
    const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) acc += bf16_lo(w[4 * h + i]) * bf16_lo(xw[i]) + bf16_hi(w[4 * h + i]) * bf16_hi(xw[i]);
  }
  return acc;
}

// Candidate c of row r: its exact logit into p.exact, by one warp.
template <typename Cfg>
__device__ __forceinline__ void exact_logit(const RescoreParams p, long long r, long long c, int lane) {
  constexpr long long H = Cfg::HIDDEN, KC = Cfg::CAND_K;
  constexpr bool FP8 = Cfg::WEIGHT == kWeightFP8;
  constexpr int E = FP8 ? 16 : 8;  // elements per 16-byte weight chunk
  constexpr long long ROW_BYTES = H * (FP8 ? 1 : 2);
  // 16-byte chunks need every weight row and every row of n 16-byte aligned (the buffers are 256-aligned).
  constexpr bool VEC = H % E == 0;
  const int draft = p.cand[r * KC + c];
  const int t = draft + p.d2t[draft];
  const unsigned char* row = static_cast<const unsigned char*>(p.target_head) + static_cast<long long>(t) * ROW_BYTES;
  const bf16* x = p.n + r * H;
  float acc = 0.0f;
  if constexpr (VEC) {
    constexpr int CHUNKS = static_cast<int>(H / E);
    constexpr int PER_LANE = (CHUNKS + 31) / 32;
    constexpr int BATCH = PER_LANE < 16 ? PER_LANE : 16;  // loads in flight per lane
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int b0 = 0; b0 < PER_LANE; b0 += BATCH) {
      uint4 w[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int ch = (b0 + j) * 32 + lane;
        w[j] = ch < CHUNKS ? rescore_stream(row + static_cast<long long>(ch) * 16) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int ch = (b0 + j) * 32 + lane;
        if (ch < CHUNKS) acc += rescore_chunk_dot<FP8>(w[j], xv + ch * (E / 8));
      }
    }
  } else {
    for (long long k = lane; k < H; k += 32) {
      const float w = FP8 ? __half2float(__half(__nv_cvt_fp8_to_halfraw(row[k], __NV_E4M3)))
                          : to_float(reinterpret_cast<const bf16*>(row)[k]);
      acc += w * to_float(x[k]);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) p.exact[r * KC + c] = FP8 ? acc * p.scale[t] : acc;
}

// Four CTAs per SM (up to 128 registers): without a minimum, ptxas held the kernel to 32-56 registers,
// too few for a lane's 16 chunks in flight (64 registers), and spilled at HIDDEN 8192.
template <typename Cfg>
__global__ void __launch_bounds__(32 * kRescoreWarps, 4) rescore(const RescoreParams p) {
  start_after_predecessors();
  constexpr long long KC = Cfg::CAND_K;
  static_assert(KC >= 1, "rescore: CAND_K must be at least 1");

  constexpr long long PARTS = ceil_div(KC, kRescoreWarps);  // CTAs per row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long r = blockIdx.y, c = static_cast<long long>(blockIdx.x) * kRescoreWarps + warp;
  if (r >= p.rows) return;  // the whole CTA
  if (c < KC) exact_logit<Cfg>(p, r, c, lane);

  // The last CTA of the row to arrive joins its logits.
  if (!last_to_arrive(p.arrivals + r, PARTS) || warp > 0) return;
  const float* logit = p.exact + r * KC;
  const int* cand = p.cand + r * KC;
  ArgMax best{neg_inf(), 0x7fffffff};
  for (long long i = lane; i < KC; i += 32) {
    const int draft = cand[i];
    const int t = draft + p.d2t[draft];
    const float l = __ldcg(logit + i);
    if (better(l, t, best.v, best.i)) best = ArgMax{l, t};
  }
  best = warp_argmax(best);
  float sum = 0.0f;
  for (long long i = lane; i < KC; i += 32) sum += expf(__ldcg(logit + i) - best.v);
  sum = warp_sum(sum);
  if (lane == 0) store_step(p.out_token, p.out_conf, p.next_token, r, Cfg::MAX_STEPS, p.step, best.i, 1.0f / sum);
}

}  // namespace kernels
}  // namespace tfe
