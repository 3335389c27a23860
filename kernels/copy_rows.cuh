// Row gather / scatter: dst[dst_index ? dst_index[r] : r] = src[src_index ? src_index[r] : r], WIDTH bf16
// per row (a null index is the identity). One CTA per row.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct CopyRowsParams {
  const bf16* src;
  const int* src_index;  // [rows] or null
  bf16* dst;
  const int* dst_index;  // [rows] or null
  long long rows;
};
static_assert(sizeof(CopyRowsParams) == 8 * 5, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) copy_rows(const CopyRowsParams p) {
  start_after_predecessors();
  constexpr long long W = Cfg::WIDTH;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const long long s = p.src_index ? p.src_index[r] : r;
  const long long d = p.dst_index ? p.dst_index[r] : r;
  const bf16* src = p.src + s * W;
  bf16* dst = p.dst + d * W;
  // 16-byte copies when both rows start 16-byte aligned (a bound slice may start anywhere).
  const bool vec =
      W % 8 == 0 && ((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) & 15) == 0;
  if (vec) {
    for (long long c = threadIdx.x; c < W / 8; c += blockDim.x)
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
  } else {
    for (long long e = threadIdx.x; e < W; e += blockDim.x) dst[e] = src[e];
  }
}

}  // namespace kernels
}  // namespace tfe
