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

// One row's RMSNorm by one CTA of THREADS threads; shared by rmsnorm and prepare_x. In two parts, so that
// a kernel can issue the weights' loads before it waits for its predecessors: norm weights are written at
// upload and never by a node, so their L2 round trip then overlaps the wait instead of following the
// row's reduction on the kernel's chain. A row of whole 16-byte chunks, at most 8 a thread, stays in
// registers between its statistic and the apply; the same sums in the same order as the streaming loop
// below, so the bits do not depend on which form ran.
template <long long WIDTH, int THREADS>
struct RmsRow {
  static constexpr long long CHUNKS = WIDTH / 8;                                  // 16-byte chunks of a row
  static constexpr int PER = static_cast<int>((CHUNKS + THREADS - 1) / THREADS);  // a thread's chunks
  static constexpr bool HOLD = WIDTH % 8 == 0 && PER <= 8;
  uint4 w[HOLD ? PER : 1];

  // Before the wait: the weights are not an earlier node's output.
  __device__ __forceinline__ void load_weights(const bf16* weights) {
    if constexpr (HOLD) {
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const long long c = threadIdx.x + static_cast<long long>(k) * THREADS;
        if (c < CHUNKS) w[k] = reinterpret_cast<const uint4*>(weights)[c];
      }
    }
  }

  // After the wait. `weights` is the pointer load_weights read (the streaming form reads it again).
  // `scratch`: 32 floats of shared memory.
  __device__ __forceinline__ void run(const bf16* x, const bf16* weights, bf16* y, float eps, float* scratch) {
    const auto address = [](const void* q) { return reinterpret_cast<unsigned long long>(q); };
    const bool aligned = ((address(x) | address(y)) & 15) == 0;
    if constexpr (HOLD) {
      if (aligned) {
        uint4 xs[PER];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const long long c = threadIdx.x + static_cast<long long>(k) * THREADS;
          if (c < CHUNKS) {
            xs[k] = reinterpret_cast<const uint4*>(x)[c];
            ss = add_squares(ss, xs[k]);
          }
        }
        const float inv = rms_inv(block_sum<THREADS>(ss, scratch), WIDTH, eps);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const long long c = threadIdx.x + static_cast<long long>(k) * THREADS;
          if (c < CHUNKS) reinterpret_cast<uint4*>(y)[c] = apply(xs[k], w[k], inv);
        }
        return;
      }
    }
    streamed(x, weights, y, eps, scratch, aligned && WIDTH % 8 == 0);
  }

 private:
  static __device__ __forceinline__ float add_squares(float ss, const uint4 u) {
    const unsigned a[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = bf16_lo(a[i]), hi = bf16_hi(a[i]);
      ss += lo * lo + hi * hi;
    }
    return ss;
  }
  static __device__ __forceinline__ uint4 apply(const uint4 u, const uint4 g, float inv) {
    const unsigned a[4] = {u.x, u.y, u.z, u.w}, b[4] = {g.x, g.y, g.z, g.w};
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[i] = pack_bf16x2(rms_apply(bf16_lo(a[i]), inv, bf16_lo(b[i])), rms_apply(bf16_hi(a[i]), inv, bf16_hi(b[i])));
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
  // Rows too wide to hold, or not 16-byte aligned: x is read twice and the weights after the statistic.
  static __device__ __forceinline__ void streamed(const bf16* x, const bf16* weights, bf16* y, float eps,
                                                  float* scratch, bool vec) {
    float ss = 0.0f;
    if (vec) {
      for (long long c = threadIdx.x; c < CHUNKS; c += THREADS)
        ss = add_squares(ss, reinterpret_cast<const uint4*>(x)[c]);
    } else {
      for (long long e = threadIdx.x; e < WIDTH; e += THREADS) {
        const float v = to_float(x[e]);
        ss += v * v;
      }
    }
    const float inv = rms_inv(block_sum<THREADS>(ss, scratch), WIDTH, eps);
    if (vec) {
      for (long long c = threadIdx.x; c < CHUNKS; c += THREADS)
        reinterpret_cast<uint4*>(y)[c] =
            apply(reinterpret_cast<const uint4*>(x)[c], reinterpret_cast<const uint4*>(weights)[c], inv);
    } else {
      for (long long e = threadIdx.x; e < WIDTH; e += THREADS)
        y[e] = to_bf16(rms_apply(to_float(x[e]), inv, to_float(weights[e])));
    }
  }
};

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) rmsnorm(const RmsnormParams p) {
  RmsRow<Cfg::WIDTH, Cfg::THREADS> row;
  row.load_weights(p.w);
  start_after_predecessors();
  __shared__ float scratch[32];
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  row.run(p.x + r * p.x_stride, p.w, p.y + r * p.y_stride, p.eps.v, scratch);
}

}  // namespace kernels
}  // namespace tfe
