// Vocabulary top-1 with its softmax confidence, in two kernels so that the logits of a row are read by
// many CTAs.
//   top1_partial: grid (PARTS = ceil(VOCAB / CHUNK), rows), 256 threads. Per chunk: the max, its lowest
//     index, and sum exp(l - max) over the chunk (fp32; thread-strided sums, then the fixed warp tree).
//   top1_join: one warp per row. M = max of the partial maxima (ties: lower index);
//     sum = sum_p part_sum[p] * exp(part_max[p] - M) in part order; conf = softmax at the argmax = 1 / sum.
//     Writes the target id (draft + d2t[draft]) and conf of `step` and the next step's token.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct Top1PartialParams {
  const float* logits;  // [rows, VOCAB]
  float* part_max;      // [rows, PARTS]
  int* part_idx;        // [rows, PARTS]
  float* part_sum;      // [rows, PARTS]
  long long rows;
};
static_assert(sizeof(Top1PartialParams) == 8 * 5, "one 8-byte slot per registry parameter");

struct Top1JoinParams {
  const float* part_max;  // [rows, PARTS]
  const int* part_idx;
  const float* part_sum;
  const int* d2t;         // [draft vocab]: target id = draft id + d2t[draft id]
  int* out_token;         // [rows, MAX_STEPS]
  float* out_conf;        // [rows, MAX_STEPS]
  int* next_token;        // [rows]
  long long step;         // 1-based
  long long rows;
};
static_assert(sizeof(Top1JoinParams) == 8 * 9, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(256) top1_partial(const Top1PartialParams p) {
  constexpr long long V = Cfg::VOCAB, CHUNK = Cfg::CHUNK, PARTS = ceil_div(V, CHUNK);
  __shared__ float smax[32];
  __shared__ int sidx[32];
  __shared__ float ssum[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const long long part = blockIdx.x, r = blockIdx.y;
  if (r >= p.rows) return;
  const long long begin = part * CHUNK;
  const long long end = min_ll(begin + CHUNK, V);
  const float* l = p.logits + r * V;

  ArgMax best{neg_inf(), 0x7fffffff};
  for (long long i = begin + tid; i < end; i += blockDim.x) {
    const float v = l[i];
    if (better(v, static_cast<int>(i), best.v, best.i)) best = ArgMax{v, static_cast<int>(i)};
  }
  best = warp_argmax(best);
  if (lane == 0) {
    smax[warp] = best.v;
    sidx[warp] = best.i;
  }
  __syncthreads();
  for (int w = 0; w < warps; ++w)
    if (better(smax[w], sidx[w], best.v, best.i)) best = ArgMax{smax[w], sidx[w]};

  float sum = 0.0f;
  for (long long i = begin + tid; i < end; i += blockDim.x) sum += expf(l[i] - best.v);
  sum = warp_sum(sum);
  if (lane == 0) ssum[warp] = sum;
  __syncthreads();
  if (tid == 0) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += ssum[w];
    p.part_max[r * PARTS + part] = best.v;
    p.part_idx[r * PARTS + part] = best.i;
    p.part_sum[r * PARTS + part] = total;
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(32) top1_join(const Top1JoinParams p) {
  constexpr long long PARTS = Cfg::PARTS;
  const int lane = threadIdx.x;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const float* pm = p.part_max + r * PARTS;
  const float* ps = p.part_sum + r * PARTS;
  const int* pi = p.part_idx + r * PARTS;

  ArgMax best{neg_inf(), 0x7fffffff};
  for (long long i = lane; i < PARTS; i += 32)
    if (better(pm[i], pi[i], best.v, best.i)) best = ArgMax{pm[i], pi[i]};
  best = warp_argmax(best);
  float sum = 0.0f;
  for (long long i = lane; i < PARTS; i += 32) sum += ps[i] * expf(pm[i] - best.v);
  sum = warp_sum(sum);
  if (lane == 0) {
    const int target = best.i + p.d2t[best.i];
    const long long at = r * Cfg::MAX_STEPS + (p.step - 1);
    p.out_token[at] = target;
    p.out_conf[at] = 1.0f / sum;
    p.next_token[r] = target;
  }
}

}  // namespace kernels
}  // namespace tfe
