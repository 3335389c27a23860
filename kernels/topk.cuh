// two_stage candidates: the CAND_K highest scores of a row, ties to the lower id, as draft ids, in one
// kernel whose CTAs split a row's scores (TopkShape; compiler/launch_shapes.cpp mirrors it).
//   Grid (PARTS = ceil(VOCAB / CHUNK), rows), 512 threads. A CTA stages its chunk's keys in shared memory
//   and writes the chunk's KP = min(CAND_K, CHUNK) best (all of a shorter last chunk) to part_score /
//   part_id [rows, PARTS * KP] at part * KP, ascending by id. Then it takes an integer ticket from
//   arrivals[r]; the last CTA of the row runs the same selection over the row's JOIN_N partials, writes
//   cand [rows, CAND_K] ascending by id, and returns the counter to zero for the next pass.
// The two levels select the global set: an element of the row's top CAND_K has fewer than CAND_K elements
// of its own chunk ranked above it (each of them ranks above it in the row too), so its chunk keeps it.
// Only the last part can be short, so the join's valid entries are the prefix [0, JOIN_N) of a row's
// partials, and ascending position there is ascending id: ties resolved by position are ties to the
// lower id, the same rule as within a chunk. The join reads the partials in position order whichever CTA
// runs it, so the result does not depend on the order of arrival.
//
// Selection (both levels): scores map to order-preserving 32-bit keys (-0 folded onto +0 so that they
// tie, as floats compare). A radix select, 8 bits per pass from the top, narrows to the bucket (prefix
// under mask) that holds the k-th largest key and how many of its keys are taken (`need`); it stops
// early once that bucket is taken whole. Histograms use integer shared-memory atomics, one per group of
// equal digits in a warp (__match_any_sync: the top digits of a score row are few, and same-address
// atomics would serialize); their result does not depend on order. A final pass in position order
// takes every key above the bucket and the first `need` keys in it; an element's output slot is the
// number of taken elements before it, so the output order is the same every run.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct TopkParams {
  const float* scores;  // [rows, VOCAB]
  float* part_score;    // [rows, PARTS * KP]
  int* part_id;         // [rows, PARTS * KP] draft ids
  int* arrivals;        // [rows], zero between passes
  int* cand;            // [rows, CAND_K] draft ids, ascending
  long long rows;
};
static_assert(sizeof(TopkParams) == 8 * 6, "one 8-byte slot per registry parameter");

constexpr int kTopkThreads = 512, kTopkWarps = kTopkThreads / 32;
// Largest chunk a CTA stages (4 bytes a key of static shared memory), and largest join input the joining
// CTA stages (in the same array); a larger join reads its keys from global memory (L2) on every pass.
constexpr long long kTopkMaxChunk = 8192, kTopkJoinStaged = 8192;

template <typename Cfg>
struct TopkShape {
  static constexpr long long VOCAB = Cfg::VOCAB, CHUNK = Cfg::CHUNK, CAND_K = Cfg::CAND_K;
  static constexpr long long PARTS = ceil_div(VOCAB, CHUNK);
  static constexpr long long KP = min_ll(CAND_K, CHUNK);              // slots per part
  static constexpr long long LAST = VOCAB - (PARTS - 1) * CHUNK;      // length of the last chunk
  static constexpr long long JOIN_N = (PARTS - 1) * KP + min_ll(KP, LAST);
  static constexpr long long STRIDE = PARTS * KP;                     // a row of part_score / part_id
  static_assert(CAND_K >= 1 && CAND_K <= VOCAB, "topk: CAND_K must be in 1..VOCAB");
  static_assert(CHUNK >= 1 && CHUNK <= kTopkMaxChunk, "topk: CHUNK must be in 1..kTopkMaxChunk");
  static_assert(JOIN_N >= CAND_K, "topk: the partials must hold at least CAND_K entries");
};

__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopkSmem {
  unsigned hist[256];
  unsigned warp_total[kTopkWarps];
  unsigned found_digit, found_need, found_count;
  unsigned tile_gt[2][kTopkWarps], tile_eq[2][kTopkWarps];
};

// The bucket of the need-th largest of key_at(0 .. n-1) (1 <= need <= n): on return, the keys k with
// (k & mask) > prefix are all taken and `need` of those with (k & mask) == prefix. Every thread of the
// CTA (kTopkThreads, whole warps) calls it with the same n and need.
template <typename KeyAt>
__device__ __forceinline__ void radix_bucket(const KeyAt& key_at, int n, unsigned& prefix, unsigned& mask,
                                             unsigned& need, TopkSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  prefix = 0;
  mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) sm.hist[tid] = 0;
    __syncthreads();
    // A trip count shared by the CTA keeps every lane in the match.
    for (int base = 0; base < n; base += kTopkThreads) {
      const int i = base + tid;
      unsigned digit = 256u;  // not in the bucket
      if (i < n) {
        const unsigned k = key_at(i);
        if ((k & mask) == prefix) digit = (k >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&sm.hist[digit], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    // Counts from the highest digit down; the digit where the running count reaches `need` holds the
    // need-th largest key.
    unsigned c = 0, incl = 0;
    if (tid < 256) {
      c = sm.hist[255 - tid];
      incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31) sm.warp_total[warp] = incl;
    }
    __syncthreads();
    if (tid < 256) {
      for (int w = 0; w < warp; ++w) incl += sm.warp_total[w];
      const unsigned excl = incl - c;
      if (excl < need && incl >= need) {
        sm.found_digit = 255u - static_cast<unsigned>(tid);
        sm.found_need = need - excl;
        sm.found_count = c;
      }
    }
    __syncthreads();
    // found_* are rewritten only after the next pass's second barrier, which every reader passes first.
    prefix |= sm.found_digit << shift;
    mask |= 255u << shift;
    need = sm.found_need;
    if (sm.found_count == need) break;  // the bucket is taken whole: lower digits change nothing
  }
}

// Calls take(i, slot) for each taken element, slot = the number of taken elements before position i
// (0 .. taken - 1). A tile of kTopkThreads positions at a time; tile_* are double-buffered so one
// barrier per tile suffices.
template <typename KeyAt, typename Take>
__device__ __forceinline__ void take_in_order(const KeyAt& key_at, int n, unsigned prefix, unsigned mask,
                                              unsigned need, TopkSmem& sm, const Take& take) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  unsigned gt_base = 0, eq_base = 0;
  for (int base = 0, tile = 0; base < n; base += kTopkThreads, ++tile) {
    const int i = base + tid;
    const unsigned k = i < n ? key_at(i) & mask : 0u;
    const bool gt = i < n && k > prefix, eq = i < n && k == prefix;
    const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
    const int buf = tile & 1;
    if (lane == 0) {
      sm.tile_gt[buf][warp] = __popc(bg);
      sm.tile_eq[buf][warp] = __popc(be);
    }
    __syncthreads();
    unsigned gt_before = gt_base + __popc(bg & below), eq_before = eq_base + __popc(be & below);
    unsigned gt_tile = 0, eq_tile = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      if (w < warp) {
        gt_before += sm.tile_gt[buf][w];
        eq_before += sm.tile_eq[buf][w];
      }
      gt_tile += sm.tile_gt[buf][w];
      eq_tile += sm.tile_eq[buf][w];
    }
    if (gt || (eq && eq_before < need)) take(i, static_cast<int>(gt_before + min(eq_before, need)));
    gt_base += gt_tile;
    eq_base += eq_tile;
  }
}

// Two CTAs per SM: without a minimum, ptxas held the kernel to 40 registers and spilled.
template <typename Cfg>
__global__ void __launch_bounds__(kTopkThreads, 2) topk(const TopkParams p) {
  start_after_predecessors();
  using S = TopkShape<Cfg>;
  constexpr int PER_THREAD = static_cast<int>(ceil_div(S::CHUNK, kTopkThreads));
  constexpr int N = static_cast<int>(S::JOIN_N);
  constexpr bool STAGED = S::JOIN_N <= kTopkJoinStaged;
  constexpr long long KEYS = STAGED && S::JOIN_N > S::CHUNK ? S::JOIN_N : S::CHUNK;
  __shared__ unsigned keys[KEYS];
  __shared__ TopkSmem sm;
  const int tid = threadIdx.x;
  const long long part = blockIdx.x, r = blockIdx.y;
  if (r >= p.rows) return;

  // This CTA's chunk: its KP best into the row's partials.
  const long long begin = part * S::CHUNK;
  const int len = static_cast<int>(min_ll(S::CHUNK, S::VOCAB - begin));
  const float* s = p.scores + r * S::VOCAB + begin;
#pragma unroll
  for (int j = 0; j < PER_THREAD; ++j) {
    const int i = j * kTopkThreads + tid;
    if (i < len) keys[i] = order_key(s[i]);
  }
  __syncthreads();
  {
    const auto key_at = [&](int i) { return keys[i]; };
    unsigned prefix, mask, need = static_cast<unsigned>(min_ll(S::KP, len));
    radix_bucket(key_at, len, prefix, mask, need, sm);
    float* out_score = p.part_score + r * S::STRIDE + part * S::KP;
    int* out_id = p.part_id + r * S::STRIDE + part * S::KP;
    take_in_order(key_at, len, prefix, mask, need, sm, [&](int i, int slot) {
      out_score[slot] = s[i];
      out_id[slot] = static_cast<int>(begin + i);
    });
  }

  // The last CTA of the row to arrive joins its partials.
  if (!last_to_arrive(p.arrivals + r, S::PARTS)) return;

  const float* score = p.part_score + r * S::STRIDE;
  const int* id = p.part_id + r * S::STRIDE;
  if constexpr (STAGED) {
    for (int i = tid; i < N; i += kTopkThreads) keys[i] = order_key(__ldcg(score + i));
    __syncthreads();
  }
  const auto key_at = [&](int i) -> unsigned {
    if constexpr (STAGED) return keys[i];
    else return order_key(__ldcg(score + i));
  };
  unsigned prefix, mask, need = static_cast<unsigned>(S::CAND_K);
  radix_bucket(key_at, N, prefix, mask, need, sm);
  int* out = p.cand + r * S::CAND_K;
  take_in_order(key_at, N, prefix, mask, need, sm, [&](int i, int slot) { out[slot] = __ldcg(id + i); });
}

}  // namespace kernels
}  // namespace tfe
