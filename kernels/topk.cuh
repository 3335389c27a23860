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
// tie, as floats compare). A radix select narrows to the bucket (prefix under mask) that holds the k-th
// largest key and how many of its keys are taken (`need`), in at most 3 passes of 11, 10 and 11 bits from
// the top (the first is sign, exponent and 2 mantissa bits); it stops early once that bucket is taken
// whole. A pass counts its digits into a shared histogram; each thread sums 4 bins (thread 0 the top 4)
// and a warp reduction gives the 16 warp totals; from them every thread knows the warp whose 128 bins
// hold the need-th key, and every warp rescans those bins to find the digit itself rather than wait for
// one thread to publish it: 2 barriers a pass, at most 6 a level (8-bit digits took 4 a pass, at most 16).
// The histogram is then still read after the pass's last barrier, so consecutive passes count into
// different histograms: 2048 bins for passes 1 and 3, 1024 for pass 2 (hence the narrow digit in the
// middle: 12 KB fits beside the 32 KB key stage under the 48 KB of static shared memory, two 2048-bin
// histograms would not). Both are cleared before each level, the first again during pass 2 for pass 3.
// Histograms use integer shared-memory atomics; a warp with many lanes in the bucket adds once per group
// of equal digits (__match_any_sync: the join's partials and tied rows put most of a warp's keys in few
// bins, and same-address atomics would serialize), one with few adds once per lane (later passes, where
// most keys lie outside the bucket). Their result does not depend on order. A final pass in position
// order takes every key above the bucket and the first `need` keys in it; an element's output slot is the
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
  alignas(16) unsigned hist_a[2048];  // passes 1 and 3
  alignas(16) unsigned hist_b[1024];  // pass 2
  alignas(16) unsigned warp_total[kTopkWarps];
  unsigned tile_gt[2][kTopkWarps], tile_eq[2][kTopkWarps];
};

// A warp counts its digits by groups of equal digits when at least this many of its lanes are in the
// bucket; with fewer, same-address conflicts are bounded by that count. (In a chunk's first pass the 32
// keys of a warp of normal scores fall in about 22 digits, 3-4 at most equal; the join's partials, a few
// exponents wide, and tied rows gather far more. 0 always matches, 33 never: one to measure.)
constexpr int kTopkMatchLanes = 16;

// Zeroes both histograms, as radix_bucket requires on entry; a barrier must follow before the call.
__device__ __forceinline__ void clear_histograms(TopkSmem& sm) {
  const int tid = threadIdx.x;
  reinterpret_cast<uint4*>(sm.hist_a)[tid] = make_uint4(0, 0, 0, 0);
  if (tid < 1024 / 4) reinterpret_cast<uint4*>(sm.hist_b)[tid] = make_uint4(0, 0, 0, 0);
}
static_assert(kTopkThreads * 4 == 2048, "topk: a thread clears and owns 4 bins of an 11-bit pass");

// One pass of radix_bucket over the digit (k >> SHIFT) & (2^BITS - 1), counted into `hist` (zero on
// entry). `stale` (the histogram of the pass before last: its readers all passed this pass's first
// barrier) is cleared here for the next pass, or null. Returns true when the bucket found is taken whole.
template <int SHIFT, int BITS, typename KeyAt>
__device__ __forceinline__ bool radix_pass(const KeyAt& key_at, int n, unsigned* hist, unsigned* stale,
                                           unsigned& prefix, unsigned& mask, unsigned& need, TopkSmem& sm) {
  constexpr int BINS = 1 << BITS;
  static_assert(BINS % 128 == 0 && BINS <= 4 * kTopkThreads, "topk: a warp's 32 threads own 128 bins");
  const int tid = threadIdx.x, lane = tid & 31;
  // A trip count shared by the CTA keeps every lane in the ballot and the match.
  for (int base = 0; base < n; base += kTopkThreads) {
    const int i = base + tid;
    bool in = false;
    unsigned digit = BINS;  // not in the bucket
    if (i < n) {
      const unsigned k = key_at(i);
      in = (k & mask) == prefix;
      if (in) digit = (k >> SHIFT) & (BINS - 1u);
    }
    if (__popc(__ballot_sync(0xffffffffu, in)) >= kTopkMatchLanes) {
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<unsigned>(__popc(peers)));
    } else if (in) {
      atomicAdd(&hist[digit], 1u);
    }
  }
  __syncthreads();
  // Thread t owns bins BINS - 4t - 4 .. BINS - 4t - 1 (.w the highest), so that warps, and lanes within a
  // warp, in ascending order count from the top.
  const auto bins_of = [&](int t) {
    return 4 * t < BINS ? *reinterpret_cast<const uint4*>(hist + BINS - 4 * t - 4) : make_uint4(0, 0, 0, 0);
  };
  {
    const uint4 c = bins_of(tid);
    const unsigned total = __reduce_add_sync(0xffffffffu, c.x + c.y + c.z + c.w);
    if (lane == 0) sm.warp_total[tid >> 5] = total;
  }
  if (stale) reinterpret_cast<uint4*>(stale)[tid] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  // Every thread finds the warp w whose bins hold the need-th key (the warps before it count fewer than
  // `need`); warp_total is rewritten only after the next pass's first barrier, which every reader passes
  // first.
  int w = 0;
  unsigned above = 0;  // keys in the bins of the warps before w
  {
    unsigned total[kTopkWarps];
#pragma unroll
    for (int q = 0; q < kTopkWarps / 4; ++q) {
      const uint4 t4 = reinterpret_cast<const uint4*>(sm.warp_total)[q];
      total[4 * q] = t4.x, total[4 * q + 1] = t4.y, total[4 * q + 2] = t4.z, total[4 * q + 3] = t4.w;
    }
    unsigned run = 0;
#pragma unroll
    for (int q = 0; q < kTopkWarps; ++q) {
      run += total[q];
      if (run < need) ++w, above = run;
    }
  }
  // Every warp scans warp w's bins, so that the digit needs no barrier to reach the CTA.
  const uint4 c = bins_of(w * 32 + lane);
  const unsigned sum = c.x + c.y + c.z + c.w;
  unsigned incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  unsigned run = above + incl - sum;  // keys above this lane's bins
  const int hit = __ffs(__ballot_sync(0xffffffffu, run < need && run + sum >= need)) - 1;
  // This lane's bins from the highest; meaningful in lane `hit` only.
  unsigned digit = static_cast<unsigned>(BINS - 4 * (w * 32 + lane) - 1), count = c.w;
  if (run + c.w < need) {
    run += c.w, --digit, count = c.z;
    if (run + c.z < need) {
      run += c.z, --digit, count = c.y;
      if (run + c.y < need) run += c.y, --digit, count = c.x;
    }
  }
  digit = __shfl_sync(0xffffffffu, digit, hit);
  count = __shfl_sync(0xffffffffu, count, hit);
  need -= __shfl_sync(0xffffffffu, run, hit);
  prefix |= digit << SHIFT;
  mask |= static_cast<unsigned>(BINS - 1) << SHIFT;
  return count == need;
}

// The bucket of the need-th largest of key_at(0 .. n-1) (1 <= need <= n): on return, the keys k with
// (k & mask) > prefix are all taken and `need` of those with (k & mask) == prefix. Every thread of the
// CTA (kTopkThreads, whole warps) calls it with the same n and need, with both histograms zero and a
// barrier since they were cleared; it leaves them dirty.
template <typename KeyAt>
__device__ __forceinline__ void radix_bucket(const KeyAt& key_at, int n, unsigned& prefix, unsigned& mask,
                                             unsigned& need, TopkSmem& sm) {
  prefix = 0;
  mask = 0;
  if (radix_pass<21, 11>(key_at, n, sm.hist_a, nullptr, prefix, mask, need, sm)) return;
  if (radix_pass<11, 10>(key_at, n, sm.hist_b, sm.hist_a, prefix, mask, need, sm)) return;
  radix_pass<0, 11>(key_at, n, sm.hist_a, nullptr, prefix, mask, need, sm);
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
  clear_histograms(sm);  // the barrier after the keys are staged orders it before the first pass

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
  // Every thread has passed take_in_order's barriers, so no one reads the histograms any more; the
  // barrier in last_to_arrive orders the clearing before the join's first pass.
  clear_histograms(sm);

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
