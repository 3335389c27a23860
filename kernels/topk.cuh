// two_stage candidates: the CAND_K highest scores of a row, ties to the lower id, as draft ids.
//
// Mapping: one CTA of 512 threads per row. Scores map to order-preserving 32-bit keys (-0 folded onto
// +0 so that they tie, as floats compare). A radix select, 8 bits per pass from the top, finds the
// threshold key T (the CAND_K-th largest) and how many keys equal to T are taken (`need`); the
// histograms use integer shared-memory atomics, whose result does not depend on order. A final pass in
// id order writes every key > T and the first `need` keys == T; an element's slot is the number of taken
// elements with a lower id, so the output order (ascending id) is the same every run.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct TopkParams {
  const float* scores;  // [rows, VOCAB]
  int* cand;            // [rows, CAND_K]
  long long rows;
};
static_assert(sizeof(TopkParams) == 8 * 3, "one 8-byte slot per registry parameter");

__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename Cfg>
__global__ void __launch_bounds__(512) topk(const TopkParams p) {
  constexpr long long V = Cfg::VOCAB, KC = Cfg::CAND_K;
  constexpr int THREADS = 512, WARPS = THREADS / 32;
  static_assert(KC >= 1 && KC <= V, "topk: CAND_K must be in 1..VOCAB");
  __shared__ unsigned hist[256];
  __shared__ unsigned warp_total[WARPS];
  __shared__ unsigned found_digit, found_need;
  __shared__ unsigned tile_gt[2][WARPS], tile_eq[2][WARPS];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const float* s = p.scores + r * V;

  unsigned prefix = 0, mask = 0, need = static_cast<unsigned>(KC);
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    for (long long i = tid; i < V; i += THREADS) {
      const unsigned k = order_key(s[i]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    // Counts from the highest digit down; the digit where the running count reaches `need` holds T.
    unsigned c = 0, incl = 0;
    if (tid < 256) {
      c = hist[255 - tid];
      incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      if (lane == 31) warp_total[warp] = incl;
    }
    __syncthreads();
    if (tid < 256) {
      for (int w = 0; w < warp; ++w) incl += warp_total[w];
      const unsigned excl = incl - c;
      if (excl < need && incl >= need) {
        found_digit = 255u - static_cast<unsigned>(tid);
        found_need = need - excl;
      }
    }
    __syncthreads();
    prefix |= found_digit << shift;
    mask |= 255u << shift;
    need = found_need;
    __syncthreads();
  }

  // Selection in id order, a tile of THREADS ids at a time; tile_* are double-buffered so one barrier
  // per tile suffices.
  const unsigned below = (1u << lane) - 1u;
  unsigned gt_base = 0, eq_base = 0;
  int* out = p.cand + r * KC;
  for (long long base = 0, tile = 0; base < V; base += THREADS, ++tile) {
    const long long i = base + tid;
    const unsigned k = i < V ? order_key(s[i]) : 0u;
    const bool gt = i < V && k > prefix, eq = i < V && k == prefix;
    const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
    const int buf = static_cast<int>(tile & 1);
    if (lane == 0) {
      tile_gt[buf][warp] = __popc(bg);
      tile_eq[buf][warp] = __popc(be);
    }
    __syncthreads();
    unsigned gt_before = gt_base + __popc(bg & below), eq_before = eq_base + __popc(be & below);
    unsigned gt_tile = 0, eq_tile = 0;
    for (int w = 0; w < WARPS; ++w) {
      if (w < warp) {
        gt_before += tile_gt[buf][w];
        eq_before += tile_eq[buf][w];
      }
      gt_tile += tile_gt[buf][w];
      eq_tile += tile_eq[buf][w];
    }
    if (gt || (eq && eq_before < need)) out[gt_before + min(eq_before, need)] = static_cast<int>(i);
    gt_base += gt_tile;
    eq_base += eq_tile;
  }
}

}  // namespace kernels
}  // namespace tfe
