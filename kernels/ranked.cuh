// Step 1 of a plan with first_ranks (the branches of a draft tree): per row, the token of the row's rank
// (0: the best .. kMaxFirstRank) over the lm_head's fp32 logits, which step 1's gemv writes whole (the
// other steps keep their logits in the gemv's top1 records). The rule is the reference's ref::ranked:
// logits ordered by value, equal values by the lower draft id; confidence = exp(l - max) / sum_i exp(l_i - max).
//
// Grid (rows), kRankedThreads threads: a CTA per row. Thread t reads logits t, t + THREADS, ... and keeps
// its best KEEP = kMaxFirstRank + 1 of them, best first, in registers. Then rank + 1 rounds of a block
// argmax over the threads' first entries, the winner's thread dropping its first each round: round j's
// winner is the row's rank-j logit (every logit of the row's top KEEP is in its thread's top KEEP). The sum
// runs per thread in index order, then block_sum's fixed tree. It writes the target id (draft + d2t[draft])
// and conf of `step`, and the next step's token. Every order is fixed, so eager launches and graph replays
// agree bit for bit; rank 0 takes the argmax top1 would (the same logits, the same tie rule).
#pragma once
#include "common.cuh"
#include "ranked.h"

namespace tfe {
namespace kernels {

struct RankedParams {
  const float* logits;  // [rows, VOCAB]: step 1's lm_head gemv, fp32
  const int* rank;      // [rows]: 0..kMaxFirstRank, load_tables checked them
  const int* d2t;       // [draft vocab]: target id = draft id + d2t[draft id]
  int* out_token;       // [rows, MAX_STEPS]
  float* out_conf;      // [rows, MAX_STEPS]
  int* next_token;      // [rows]
  long long step;       // 1-based
  long long rows;
};
static_assert(sizeof(RankedParams) == 8 * 8, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(kRankedThreads) ranked(const RankedParams p) {
  start_after_predecessors();
  constexpr long long V = Cfg::VOCAB, THREADS = kRankedThreads, PER = ceil_div(V, THREADS);
  constexpr int KEEP = kMaxFirstRank + 1;
  __shared__ float sv[32], scratch[32];
  __shared__ int si[32];
  const int tid = threadIdx.x;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const float* logit = p.logits + r * V;

  // This thread's best KEEP, best first; a new logit enters at the end and moves up (unrolled: registers).
  float kv[KEEP];
  int ki[KEEP];
#pragma unroll
  for (int j = 0; j < KEEP; ++j) {
    kv[j] = neg_inf();
    ki[j] = 0x7fffffff;
  }
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = tid + k * THREADS;
    if (i >= V) break;
    const float v = logit[i];
    if (!better(v, static_cast<int>(i), kv[KEEP - 1], ki[KEEP - 1])) continue;
    kv[KEEP - 1] = v;
    ki[KEEP - 1] = static_cast<int>(i);
#pragma unroll
    for (int j = KEEP - 1; j > 0; --j)
      if (better(kv[j], ki[j], kv[j - 1], ki[j - 1])) {
        const float tv = kv[j];
        const int ti = ki[j];
        kv[j] = kv[j - 1];
        ki[j] = ki[j - 1];
        kv[j - 1] = tv;
        ki[j - 1] = ti;
      }
  }

  // The same rank in every thread of the row, so every thread runs the same rounds to the barriers; held
  // to what the rounds can reach (load_tables checked it against the plan's max_rank, which validation
  // holds to the same limit).
  constexpr int HIGHEST = static_cast<int>(min_ll(KEEP - 1, V - 1));
  const int want = min(max(p.rank[r], 0), HIGHEST);
  ArgMax top{neg_inf(), 0x7fffffff};
  float max = 0.0f;
  for (int round = 0; round <= want; ++round) {
    top = block_argmax<THREADS>(ArgMax{kv[0], ki[0]}, sv, si);
    if (round == 0) max = top.v;
    if (top.i == ki[0]) {  // ids are distinct: this thread's first entry won
#pragma unroll
      for (int j = 0; j + 1 < KEEP; ++j) {
        kv[j] = kv[j + 1];
        ki[j] = ki[j + 1];
      }
      kv[KEEP - 1] = neg_inf();
      ki[KEEP - 1] = 0x7fffffff;
    }
  }

  float total = 0.0f;
#pragma unroll 8
  for (long long k = 0; k < PER; ++k) {
    const long long i = tid + k * THREADS;
    if (i < V) total += expf(logit[i] - max);
  }
  total = block_sum<THREADS>(total, scratch);
  if (tid == 0)
    store_step(p.out_token, p.out_conf, p.next_token, r, Cfg::MAX_STEPS, p.step, top.i + p.d2t[top.i],
               expf(top.v - max) / total);
}

}  // namespace kernels
}  // namespace tfe
