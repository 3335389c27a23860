// RMSNorm of rows: y[r] = bf16(w * bf16(x[r] * rsqrt(mean(x[r]^2) + eps))). One CTA per row.
// y may alias x: every element is read and then written by the same thread, after the row's statistic
// is complete.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct RmsnormParams {
  const bf16* x;
  long long x_stride;  // elements between rows of x
  const bf16* w;
  bf16* y;
  long long y_stride;
  long long rows;
  F32Slot eps;
};
static_assert(sizeof(RmsnormParams) == 8 * 7, "one 8-byte slot per registry parameter");

// Normalizes one row of WIDTH elements with THREADS threads; shared by rmsnorm and prepare_x.
// `scratch`: 32 floats of shared memory.
template <long long WIDTH>
__device__ __forceinline__ void rms_row(const bf16* x, const bf16* w, bf16* y, float eps, float* scratch) {
  // 16-byte chunks when every row start is 16-byte aligned; the weights are a whole buffer (aligned).
  const bool vec = WIDTH % 8 == 0 && ((reinterpret_cast<unsigned long long>(x) |
                                       reinterpret_cast<unsigned long long>(y)) & 15) == 0;
  float ss = 0.0f;
  if (vec) {
    for (long long c = threadIdx.x; c < WIDTH / 8; c += blockDim.x) {
      const uint4 u = reinterpret_cast<const uint4*>(x)[c];
      const unsigned a[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float lo = bf16_lo(a[i]), hi = bf16_hi(a[i]);
        ss += lo * lo + hi * hi;
      }
    }
  } else {
    for (long long e = threadIdx.x; e < WIDTH; e += blockDim.x) {
      const float v = to_float(x[e]);
      ss += v * v;
    }
  }
  const float inv = rms_inv(block_sum(ss, scratch), WIDTH, eps);
  if (vec) {
    for (long long c = threadIdx.x; c < WIDTH / 8; c += blockDim.x) {
      const uint4 u = reinterpret_cast<const uint4*>(x)[c];
      const uint4 g = reinterpret_cast<const uint4*>(w)[c];
      const unsigned a[4] = {u.x, u.y, u.z, u.w}, b[4] = {g.x, g.y, g.z, g.w};
      unsigned o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o[i] = pack_bf16x2(rms_apply(bf16_lo(a[i]), inv, bf16_lo(b[i])), rms_apply(bf16_hi(a[i]), inv, bf16_hi(b[i])));
      reinterpret_cast<uint4*>(y)[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  } else {
    for (long long e = threadIdx.x; e < WIDTH; e += blockDim.x) y[e] = to_bf16(rms_apply(to_float(x[e]), inv, to_float(w[e])));
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) rmsnorm(const RmsnormParams p) {
  start_after_predecessors();
  __shared__ float scratch[32];
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  rms_row<Cfg::WIDTH>(p.x + r * p.x_stride, p.w, p.y + r * p.y_stride, p.eps.v, scratch);
}

}  // namespace kernels
}  // namespace tfe
