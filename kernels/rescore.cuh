// two_stage: exact logits of the candidates against the target's output head, their argmax (ties: lower
// target id) and the softmax over the CAND_K exact logits at it.
//
// Mapping: one CTA of 512 threads per row; n[r] is staged in shared memory (bf16), each warp takes candidates
// w, w + 16, ... and streams the candidate's target_head row with 16-byte loads (a row of HIDDEN bf16,
// or e4m3 times its row scale), lanes over k, then the fixed warp tree. Warp 0 joins: argmax over
// (logit, target id), sum exp(l - max) in candidate order, conf = 1 / sum.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct RescoreParams {
  const void* target_head;  // [vocab, HIDDEN]: bf16, or e4m3 when WEIGHT is kWeightFP8
  const float* scale;       // FP8: [vocab] per row; unused for bf16
  const bf16* n;            // [rows, HIDDEN]: the final-normed hidden state
  const int* cand;          // [rows, CAND_K] draft ids
  const int* d2t;           // [draft vocab]
  int* out_token;           // [rows, MAX_STEPS]
  float* out_conf;          // [rows, MAX_STEPS]
  int* next_token;          // [rows]
  long long step;           // 1-based
  long long rows;
};
static_assert(sizeof(RescoreParams) == 8 * 10, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(512) rescore(const RescoreParams p) {
  constexpr long long H = Cfg::HIDDEN, KC = Cfg::CAND_K;
  constexpr bool FP8 = Cfg::WEIGHT == kWeightFP8;
  constexpr int THREADS = 512, WARPS = THREADS / 32;
  constexpr int E = FP8 ? 16 : 8;  // elements per 16-byte chunk
  constexpr long long ROW_BYTES = H * (FP8 ? 1 : 2);
  constexpr bool VEC = ROW_BYTES % 16 == 0 && H % 8 == 0;
  __shared__ __align__(16) bf16 xs[H];  // n[r], read in the 16-byte chunks that match the weights
  __shared__ float logit[KC];
  __shared__ int target[KC];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  for (long long k = tid; k < H; k += THREADS) xs[k] = p.n[r * H + k];
  __syncthreads();

  const unsigned char* head = static_cast<const unsigned char*>(p.target_head);
  for (long long c = warp; c < KC; c += WARPS) {
    const int draft = p.cand[r * KC + c];
    const int t = draft + p.d2t[draft];
    const unsigned char* row = head + static_cast<long long>(t) * ROW_BYTES;
    float acc = 0.0f;
    if constexpr (VEC) {
#pragma unroll 4
      for (long long k0 = lane * E; k0 < H; k0 += 32 * E) {
        const uint4 u = *reinterpret_cast<const uint4*>(row + k0 * (FP8 ? 1 : 2));
        const unsigned in[4] = {u.x, u.y, u.z, u.w};
        unsigned w[E / 2];  // bf16x2 words, low k first
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
#pragma unroll
        for (int h = 0; h < E / 8; ++h) {
          const uint4 xv = reinterpret_cast<const uint4*>(xs + k0)[h];
          const unsigned x[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc += bf16_lo(w[4 * h + i]) * bf16_lo(x[i]) + bf16_hi(w[4 * h + i]) * bf16_hi(x[i]);
        }
      }
    } else {
      for (long long k = lane; k < H; k += 32) {
        const float w = FP8 ? __half2float(__half(__nv_cvt_fp8_to_halfraw(row[k], __NV_E4M3)))
                            : to_float(reinterpret_cast<const bf16*>(row)[k]);
        acc += w * to_float(xs[k]);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      logit[c] = FP8 ? acc * p.scale[t] : acc;
      target[c] = t;
    }
  }
  __syncthreads();

  if (warp != 0) return;
  ArgMax best{neg_inf(), 0x7fffffff};
  for (long long c = lane; c < KC; c += 32)
    if (better(logit[c], target[c], best.v, best.i)) best = ArgMax{logit[c], target[c]};
  best = warp_argmax(best);
  float sum = 0.0f;
  for (long long c = lane; c < KC; c += 32) sum += expf(logit[c] - best.v);
  sum = warp_sum(sum);
  if (lane == 0) {
    const long long at = r * Cfg::MAX_STEPS + (p.step - 1);
    p.out_token[at] = best.i;
    p.out_conf[at] = 1.0f / sum;
    p.next_token[r] = best.i;
  }
}

}  // namespace kernels
}  // namespace tfe
