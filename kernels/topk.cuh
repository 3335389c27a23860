// two_stage candidates: the CAND_K highest scores of a row, ties to the lower id, as draft ids ascending,
// selected by one thread-block cluster per row (TopkShape; the block, kTopkThreads, is topk.h's).
//   Grid (SPLIT, rows), clusters of (SPLIT, 1, 1), 512 threads. CTA c of a row's cluster holds the positions
//   [c * CHUNK, (c + 1) * CHUNK) of the row, CHUNK = 512 * PER_THREAD, and its thread t the PER_THREAD
//   consecutive positions from c * CHUNK + t * PER_THREAD (positions past VOCAB hold nothing). A thread's
//   keys stay in registers up to kTopkRegisterKeys a thread; past that (a vocabulary over SPLIT x 512 x 32,
//   or one CTA a row below sm_90) they are read again from the scores (through L1) on every pass.
//
// Selection: scores map to order-preserving 32-bit keys (-0 folded onto +0 so that they tie, as floats
// compare). First a bound: `lo`, the least of the maxima of CAND_K or more disjoint groups of positions
// (a warp's keys where the row has enough warps), is at most the row's CAND_K-th largest key, and `hi` is
// the largest; so every key taken lies in [lo, hi] and shares their leading bits, and a key below lo takes
// part in nothing after. A radix select, 8 bits a pass from the highest bit where lo and hi differ, then
// narrows to the bucket (prefix under mask) that holds the CAND_K-th largest key, and how many of its keys
// are taken (`need`). In a pass each CTA counts its keys of the bucket by digit into a shared-memory
// histogram (integer atomics, so the counts do not depend on their order); after a cluster barrier warp 0 of
// every CTA sums the SPLIT histograms through distributed shared memory and finds the digit, so every CTA of
// the cluster narrows to the same bucket. The histograms alternate between two buffers, so one cluster
// barrier a pass suffices. The select stops once the bucket is taken whole. Where the keys taken share their
// sign and high exponent bits, as the largest logits of a row do, the bound skips the pass over those bits
// (which would narrow nothing) and leaves a few percent of the keys to count: a 64-of-32000 select then
// takes two passes.
// Then every key above the bucket and the first `need` in it, in position order, are taken: each thread
// counts its keys above and in the bucket, and a scan over the CTA plus the counts of the lower-ranked CTAs
// (through distributed shared memory, after one more cluster barrier) give each taken element its slot, the
// number of taken elements before its position. So cand is ascending by id and the same every run: the
// counts are integers, and nothing depends on the order in which CTAs or warps arrive.
#pragma once
#include "common.cuh"
#include "topk.h"

namespace tfe {
namespace kernels {

struct TopkParams {
  const float* scores;  // [rows, VOCAB]
  int* cand;            // [rows, CAND_K] draft ids, ascending
  long long rows;
};
static_assert(sizeof(TopkParams) == 8 * 3, "one 8-byte slot per registry parameter");

constexpr int kTopkWarps = kTopkThreads / 32;
static_assert(kTopkThreads == 2 * 256, "a thread zeroes one bin of the two histogram buffers");
constexpr long long kTopkMaxSplit = 8;       // the portable cluster size
constexpr long long kTopkRegisterKeys = 32;  // keys a thread holds in registers

template <typename Cfg>
struct TopkShape {
  static constexpr long long VOCAB = Cfg::VOCAB, CAND_K = Cfg::CAND_K, SPLIT = Cfg::SPLIT;
  static constexpr long long PER_THREAD = ceil_div(VOCAB, SPLIT* kTopkThreads);
  static constexpr long long CHUNK = PER_THREAD * kTopkThreads;  // positions of a CTA
  static constexpr bool IN_REGISTERS = PER_THREAD <= kTopkRegisterKeys;
  // 16-byte loads of a thread's scores: its first position and the row are then multiples of four, so a
  // load is all below VOCAB or all past it.
  static constexpr bool VEC = IN_REGISTERS && VOCAB % 4 == 0 && PER_THREAD % 4 == 0;
  // Lanes whose keys form one group of the bound: the most (a power of two up to a warp) that still leaves
  // at least CAND_K groups holding a key; 0 where even a thread's keys are too few groups: lo is then the
  // least key.
  static constexpr int GROUP = [] {
    for (int lanes = 32; lanes >= 1; lanes /= 2)
      if (ceil_div(VOCAB, PER_THREAD * lanes) >= CAND_K) return lanes;
    return 0;
  }();
  // Two CTAs an SM where the keys allow 64 registers: at one an SM, 16 clusters of 8 did not all fit at once.
  static constexpr int MIN_CTAS = PER_THREAD <= 8 ? 2 : 1;
  static_assert(CAND_K >= 1 && CAND_K <= VOCAB, "topk: CAND_K must be in 1..VOCAB");
  static_assert(SPLIT >= 1 && SPLIT <= kTopkMaxSplit, "topk: SPLIT must be in 1..kTopkMaxSplit");
};

__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopkSmem {
  alignas(16) unsigned hist[2][256];  // by pass parity; read by the whole cluster
  unsigned warp_lo[kTopkWarps], warp_hi[kTopkWarps], warp_gt[kTopkWarps], warp_eq[kTopkWarps];
  unsigned cta_lo, cta_hi;  // this CTA's part of the bound; read by the cluster
  unsigned cta_gt, cta_eq;  // this CTA's keys above and in the final bucket; read by higher ranks
  unsigned found_digit, found_need, found_count;
};

// A thread's keys: in registers, or read from the scores at each use.
template <typename S>
struct ThreadKeys {
  unsigned reg[S::IN_REGISTERS ? S::PER_THREAD : 1];
  const float* at;  // the thread's first score
  int n;            // its positions below VOCAB: 0 .. PER_THREAD

  __device__ __forceinline__ void load(const float* first, long long valid) {
    at = first;
    n = static_cast<int>(valid < 0 ? 0 : min_ll(valid, S::PER_THREAD));
    if constexpr (S::VEC) {
#pragma unroll
      for (int j = 0; j < S::PER_THREAD; j += 4) {
        if (j < n) {
          const float4 v = *reinterpret_cast<const float4*>(first + j);
          reg[j] = order_key(v.x);
          reg[j + 1] = order_key(v.y);
          reg[j + 2] = order_key(v.z);
          reg[j + 3] = order_key(v.w);
        }
      }
    } else if constexpr (S::IN_REGISTERS) {
#pragma unroll
      for (int j = 0; j < S::PER_THREAD; ++j)
        if (j < n) reg[j] = order_key(first[j]);
    }
  }
  __device__ __forceinline__ unsigned operator[](int j) const {
    if constexpr (S::IN_REGISTERS)
      return reg[j];
    else
      return order_key(at[j]);
  }
};

template <typename S>
constexpr int kTopkUnroll = S::IN_REGISTERS ? static_cast<int>(S::PER_THREAD) : 4;

// The bound [lo, hi] of the keys taken (see above), the same in every CTA of the cluster. Every thread of
// every CTA calls it.
template <typename S>
__device__ __forceinline__ void cluster_bound(const ThreadKeys<S>& keys, unsigned& lo, unsigned& hi, TopkSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned t_hi = 0, t_lo = ~0u;  // no key maps to 0 (that is a NaN's key)
#pragma unroll kTopkUnroll < S>
  for (int j = 0; j < S::PER_THREAD; ++j) {
    if (j < keys.n) {
      const unsigned k = keys[j];
      t_hi = max(t_hi, k);
      t_lo = min(t_lo, k);
    }
  }
  unsigned g = t_lo;
  if constexpr (S::GROUP > 0) {
    g = t_hi;  // the group's maximum; a group without keys takes no part in the minimum
#pragma unroll
    for (int o = 1; o < S::GROUP; o <<= 1) g = max(g, __shfl_xor_sync(0xffffffffu, g, o));
    if (g == 0) g = ~0u;
  }
  g = __reduce_min_sync(0xffffffffu, g);
  t_hi = __reduce_max_sync(0xffffffffu, t_hi);
  if (lane == 0) sm.warp_lo[warp] = g, sm.warp_hi[warp] = t_hi;
  sm.hist[tid >> 8][tid & 255] = 0;  // both buffers (512 threads) before the first pass; no peer reads them yet
  __syncthreads();
  if (warp == 0) {
    const unsigned w_lo = __reduce_min_sync(0xffffffffu, lane < kTopkWarps ? sm.warp_lo[lane] : ~0u);
    const unsigned w_hi = __reduce_max_sync(0xffffffffu, lane < kTopkWarps ? sm.warp_hi[lane] : 0u);
    if (lane == 0) sm.cta_lo = w_lo, sm.cta_hi = w_hi;
  }
  if constexpr (S::SPLIT > 1) {
    cluster_barrier();
    // Lane cc < SPLIT of every warp reads CTA cc's part.
    const bool peer = lane < S::SPLIT;
    lo = __reduce_min_sync(0xffffffffu, peer ? load_peer(&sm.cta_lo, lane) : ~0u);
    hi = __reduce_max_sync(0xffffffffu, peer ? load_peer(&sm.cta_hi, lane) : 0u);
  } else {
    __syncthreads();
    lo = sm.cta_lo;
    hi = sm.cta_hi;
  }
}

// A key takes part in the select if it lies in the bound.
__device__ __forceinline__ bool in_bound(unsigned k, unsigned lo) { return k >= lo; }

// The bucket of the row's need-th largest key among those in the bound: on return, the keys k >= lo with
// (k & mask) > prefix are all taken and `need` of those with (k & mask) == prefix. Every thread of every
// CTA of the cluster calls it with the same lo and hi.
template <typename S>
__device__ __forceinline__ void cluster_radix_bucket(const ThreadKeys<S>& keys, unsigned lo, unsigned hi,
                                                     unsigned& prefix, unsigned& mask, unsigned& need, TopkSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  // The first digit holds the highest bit where lo and hi differ; the bits above it are lo's.
  const unsigned diff = lo ^ hi;
  int shift = diff == 0 ? 0 : max(31 - __clz(static_cast<int>(diff)) - 7, 0);
  mask = shift + 8 >= 32 ? 0u : ~0u << (shift + 8);
  prefix = lo & mask;
  for (int pass = 0;; ++pass) {
    unsigned* hist = sm.hist[pass & 1];
#pragma unroll kTopkUnroll < S>
    for (int j = 0; j < S::PER_THREAD; ++j) {
      if (j < keys.n) {
        const unsigned k = keys[j];
        if (in_bound(k, lo) && (k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
      }
    }
    if constexpr (S::SPLIT > 1)
      cluster_barrier();  // every CTA's histogram of this pass is complete
    else
      __syncthreads();
    // The other buffer was last read in the previous pass, before every CTA arrived at this barrier.
    if (tid < 256) sm.hist[(pass + 1) & 1][tid] = 0;
    if (tid < 32) {
      // Lane l sums the cluster's bins 248 - 8l .. 255 - 8l (lane 0 the highest), then counts from the
      // highest digit down: the digit where the running count reaches `need` holds the need-th largest key.
      const int low = 248 - 8 * lane;
      unsigned c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      // Four peers' loads in flight (32 registers): all eight took the 64 registers that two CTAs an SM
      // leave, and spilled where a thread holds one key.
#pragma unroll 4
      for (int cc = 0; cc < S::SPLIT; ++cc) {
        uint4 a, b;
        if constexpr (S::SPLIT > 1) {
          a = load_peer_v4(hist + low, cc);
          b = load_peer_v4(hist + low + 4, cc);
        } else {
          a = *reinterpret_cast<const uint4*>(hist + low);
          b = *reinterpret_cast<const uint4*>(hist + low + 4);
        }
        c[0] += a.x, c[1] += a.y, c[2] += a.z, c[3] += a.w, c[4] += b.x, c[5] += b.y, c[6] += b.z, c[7] += b.w;
      }
      const unsigned total = c[0] + c[1] + c[2] + c[3] + c[4] + c[5] + c[6] + c[7];
      const unsigned incl = warp_inclusive_sum(total);
      unsigned before = incl - total;
      if (before < need && incl >= need) {
#pragma unroll
        for (int b = 7; b >= 0; --b) {
          if (before + c[b] >= need) {
            sm.found_digit = static_cast<unsigned>(low + b);
            sm.found_need = need - before;
            sm.found_count = c[b];
            break;
          }
          before += c[b];
        }
      }
    }
    __syncthreads();
    // found_* are rewritten only after the next pass's cluster barrier, which every reader passes first.
    // Below the first pass a digit may overlap bits already fixed: those are the same in every key of the
    // bucket, so the histogram and the prefix agree on them.
    prefix = (prefix & ~(255u << shift)) | (sm.found_digit << shift);
    mask |= 255u << shift;
    need = sm.found_need;
    if (sm.found_count == need || shift == 0) break;  // taken whole (lower digits change nothing), or exact
    shift = max(shift - 8, 0);
  }
}

template <typename Cfg>
__global__ void TFE_CLUSTER(Cfg::SPLIT) __launch_bounds__(kTopkThreads, TopkShape<Cfg>::MIN_CTAS)
    topk(const TopkParams p) {
  start_after_predecessors();
  using S = TopkShape<Cfg>;
  __shared__ TopkSmem sm;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // A cluster is the SPLIT CTAs of one row (grid.x == SPLIT): its CTA rank is blockIdx.x, and the whole
  // cluster shares r and returns together.
  const unsigned rank = blockIdx.x;
  const long long r = blockIdx.y;
  if (r >= p.rows) return;

  const long long first = rank * S::CHUNK + static_cast<long long>(tid) * S::PER_THREAD;
  ThreadKeys<S> keys;
  keys.load(p.scores + r * S::VOCAB + first, S::VOCAB - first);

  unsigned lo, hi;
  cluster_bound(keys, lo, hi, sm);
  unsigned prefix, mask, need = static_cast<unsigned>(S::CAND_K);
  cluster_radix_bucket(keys, lo, hi, prefix, mask, need, sm);

  // Keys above the bucket and in it, before this thread's first position: a scan over the CTA's warps in
  // order, then the lower-ranked CTAs' totals.
  unsigned gt = 0, eq = 0;
#pragma unroll kTopkUnroll < S>
  for (int j = 0; j < S::PER_THREAD; ++j) {
    if (j < keys.n && in_bound(keys[j], lo)) {
      const unsigned k = keys[j] & mask;
      gt += k > prefix;
      eq += k == prefix;
    }
  }
  const unsigned gt_incl = warp_inclusive_sum(gt), eq_incl = warp_inclusive_sum(eq);
  if (lane == 31) sm.warp_gt[warp] = gt_incl, sm.warp_eq[warp] = eq_incl;
  __syncthreads();
  unsigned gt_before = gt_incl - gt, eq_before = eq_incl - eq, cta_gt = 0, cta_eq = 0;
  for (int w = 0; w < kTopkWarps; ++w) {
    if (w < warp) gt_before += sm.warp_gt[w], eq_before += sm.warp_eq[w];
    cta_gt += sm.warp_gt[w];
    cta_eq += sm.warp_eq[w];
  }
  if constexpr (S::SPLIT > 1) {
    if (tid == 0) sm.cta_gt = cta_gt, sm.cta_eq = cta_eq;
    cluster_barrier();
    // Lane cc < rank reads CTA cc's totals.
    const bool lower = static_cast<unsigned>(lane) < rank;
    gt_before += __reduce_add_sync(0xffffffffu, lower ? load_peer(&sm.cta_gt, lane) : 0u);
    eq_before += __reduce_add_sync(0xffffffffu, lower ? load_peer(&sm.cta_eq, lane) : 0u);
    // This CTA has read its peers; it waits below, before it exits, until they have read it.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }

  int* out = p.cand + r * S::CAND_K;
#pragma unroll kTopkUnroll < S>
  for (int j = 0; j < S::PER_THREAD; ++j) {
    if (j < keys.n && in_bound(keys[j], lo)) {
      const unsigned k = keys[j] & mask;
      if (k > prefix) {
        out[gt_before + min(eq_before, need)] = static_cast<int>(first + j);
        ++gt_before;
      } else if (k == prefix && eq_before < need) {
        out[gt_before + eq_before] = static_cast<int>(first + j);
        ++eq_before;
      }
    }
  }
  if constexpr (S::SPLIT > 1) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace kernels
}  // namespace tfe
