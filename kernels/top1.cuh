// Vocabulary top-1 with its softmax confidence: the join of the partials that the vocabulary GEMV's
// epilogue left (gemv.cuh, kEpilogueTop1: per row and gemv CTA, the max of its COLS logits, the lowest
// column at it, and sum exp(l - max) over them, as one 16-byte Top1Part).
//
// Grid (rows), 256 threads: a CTA per row reads the row's PARTS = ceil(VOCAB / COLS) records (the lm_head
// gemv's column tiles, so COLS must be that gemv's) thread-strided, part p by thread p % 256, and joins
//   M = max of the partial maxima (ties: lower index);
//   total = sum_p part_sum[p] * exp(part_max[p] - M), as per-thread sums in part order, then the fixed
//   warp tree and the warp totals in warp order; conf = softmax at the argmax = 1 / total.
// It writes the target id (draft + d2t[draft]) and conf of `step`, and the next step's token. Every sum has
// a fixed order, so eager launches and graph replays agree bit for bit.
//
// Why one CTA per row and no split: the per-chunk pass over the logits (a load, two block reductions, a
// fence and a ticket per chunk, then the join) was a chain of 7-9 us a step; the chunk half now runs in the
// GEMV's epilogue, and what is left is one load of PARTS records (32 KB a row at 2000 parts) and two block
// reductions, which one CTA does with every load in flight at once.
#pragma once
#include "common.cuh"
#include "top1.h"

namespace tfe {
namespace kernels {

struct Top1Params {
  const Top1Part* part;  // [rows, PARTS]: the lm_head gemv's records
  const int* d2t;        // [draft vocab]: target id = draft id + d2t[draft id]
  int* out_token;        // [rows, MAX_STEPS]
  float* out_conf;       // [rows, MAX_STEPS]
  int* next_token;       // [rows]
  long long step;        // 1-based
  long long rows;
};
static_assert(sizeof(Top1Params) == 8 * 7, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(kTop1Threads) top1(const Top1Params p) {
  start_after_predecessors();
  constexpr long long PARTS = ceil_div(Cfg::VOCAB, Cfg::COLS);
  constexpr long long THREADS = kTop1Threads, PER = ceil_div(PARTS, THREADS);
  __shared__ float sv[32], scratch[32];
  __shared__ int si[32];
  const int tid = threadIdx.x;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const Top1Part* part = p.part + r * PARTS;

  // A compile-time count of predicated 16-byte loads per thread, issued together. The second pass reads
  // the same records again, from L1 (holding them in registers instead would spill at large PARTS).
  ArgMax best{neg_inf(), 0x7fffffff};
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = tid + k * THREADS;
    if (i < PARTS) {
      const Top1Part q = part[i];
      if (better(q.max, q.idx, best.v, best.i)) best = ArgMax{q.max, q.idx};
    }
  }
  best = block_argmax<THREADS>(best, sv, si);
  float total = 0.0f;
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = tid + k * THREADS;
    if (i < PARTS) {
      const Top1Part q = part[i];
      total += q.sum * expf(q.max - best.v);
    }
  }
  total = block_sum<THREADS>(total, scratch);
  if (tid == 0)
    store_step(p.out_token, p.out_conf, p.next_token, r, Cfg::MAX_STEPS, p.step, best.i + p.d2t[best.i], 1.0f / total);
}

}  // namespace kernels
}  // namespace tfe
