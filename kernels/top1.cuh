// Vocabulary top-1 with its softmax confidence, in one kernel whose CTAs split the logits of a row.
//
// Grid (PARTS = ceil(VOCAB / CHUNK), rows), 256 threads. Each CTA takes one chunk of a row's logits: the
// max, its lowest index, and sum exp(l - max) over the chunk (fp32; thread-strided sums, then the fixed
// warp tree), stored as the chunk's partial. Then it takes an integer ticket from arrivals[r]; the last CTA
// of the row joins the PARTS partials and returns the counter to zero for the next pass:
//   M = max of the partial maxima (ties: lower index); sum = sum_p part_sum[p] * exp(part_max[p] - M), as
//   thread-strided sums in part order and the fixed warp tree; conf = softmax at the argmax = 1 / sum.
// It writes the target id (draft + d2t[draft]) and conf of `step`, and the next step's token. Every sum
// has a fixed order, so the result does not depend on which CTA joins.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct Top1Params {
  const float* logits;  // [rows, VOCAB]
  float* part_max;      // [rows, PARTS]
  int* part_idx;        // [rows, PARTS]
  float* part_sum;      // [rows, PARTS]
  int* arrivals;        // [rows], zero between passes
  const int* d2t;       // [draft vocab]: target id = draft id + d2t[draft id]
  int* out_token;       // [rows, MAX_STEPS]
  float* out_conf;      // [rows, MAX_STEPS]
  int* next_token;      // [rows]
  long long step;       // 1-based
  long long rows;
};
static_assert(sizeof(Top1Params) == 8 * 11, "one 8-byte slot per registry parameter");

// The CTA's argmax (ties: lower index) of `best`, broadcast to every thread. `sv`, `si`: 32 entries each.
__device__ __forceinline__ ArgMax block_argmax(ArgMax best, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  best = warp_argmax(best);
  if (lane == 0) {
    sv[warp] = best.v;
    si[warp] = best.i;
  }
  __syncthreads();
  for (int w = 0; w < warps; ++w)
    if (better(sv[w], si[w], best.v, best.i)) best = ArgMax{sv[w], si[w]};
  __syncthreads();
  return best;
}

template <typename Cfg>
__global__ void __launch_bounds__(256) top1(const Top1Params p) {
  start_after_predecessors();
  constexpr long long V = Cfg::VOCAB, CHUNK = Cfg::CHUNK, PARTS = ceil_div(V, CHUNK);
  constexpr long long THREADS = 256, PER = ceil_div(CHUNK, THREADS);  // = launch_shapes.cpp (block 256)
  __shared__ float sv[32], scratch[32];
  __shared__ int si[32];
  const int tid = threadIdx.x;
  const long long part = blockIdx.x, r = blockIdx.y;
  if (r >= p.rows) return;
  const long long begin = part * CHUNK;
  const long long end = min_ll(begin + CHUNK, V);
  const float* l = p.logits + r * V;

  // A thread's logits begin + tid + k * THREADS: a compile-time count of predicated loads, issued together.
  ArgMax best{neg_inf(), 0x7fffffff};
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = begin + tid + k * THREADS;
    if (i < end) {
      const float v = l[i];
      if (better(v, static_cast<int>(i), best.v, best.i)) best = ArgMax{v, static_cast<int>(i)};
    }
  }
  best = block_argmax(best, sv, si);
  float sum = 0.0f;
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = begin + tid + k * THREADS;
    if (i < end) sum += expf(l[i] - best.v);
  }
  sum = block_sum(sum, scratch);
  if (tid == 0) {
    p.part_max[r * PARTS + part] = best.v;
    p.part_idx[r * PARTS + part] = best.i;
    p.part_sum[r * PARTS + part] = sum;
  }
  if (!last_to_arrive(p.arrivals + r, PARTS)) return;

  const float* pm = p.part_max + r * PARTS;
  const float* ps = p.part_sum + r * PARTS;
  const int* pi = p.part_idx + r * PARTS;
  best = ArgMax{neg_inf(), 0x7fffffff};
  for (long long i = tid; i < PARTS; i += THREADS) {
    const float v = __ldcg(pm + i);
    const int idx = __ldcg(pi + i);
    if (better(v, idx, best.v, best.i)) best = ArgMax{v, idx};
  }
  best = block_argmax(best, sv, si);
  float total = 0.0f;
  for (long long i = tid; i < PARTS; i += THREADS) total += __ldcg(ps + i) * expf(__ldcg(pm + i) - best.v);
  total = block_sum(total, scratch);
  if (tid == 0) {
    const int target = best.i + p.d2t[best.i];
    const long long at = r * Cfg::MAX_STEPS + (p.step - 1);
    p.out_token[at] = target;
    p.out_conf[at] = 1.0f / total;
    p.next_token[r] = target;
  }
}

}  // namespace kernels
}  // namespace tfe
