// RoPE as every kernel that applies it computes it (qk_rope_kv, and gemv_rope_kv's epilogue), so that the
// two paths give the same bits: cos / sin of float(position) * inv_freq[i] evaluated in double and rounded
// to float (a correctly rounded fp32 cos / sin in all but vanishingly rare cases), then the rotate-half
// pair (lo, hi) = (x[i], x[i + HEAD_DIM/2]) rotated in fp32 with each product rounded as the CPU reference
// rounds it, and rounded once to bf16.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct RopeAngle {
  float cos, sin;
};

__device__ __forceinline__ RopeAngle rope_angle(long long position, float inv_freq) {
  const float angle = static_cast<float>(position) * inv_freq;
  // sincospi reduces its argument exactly (no Payne-Hanek path, no local memory); the 1/pi factor costs
  // ~1e-16 relative, far below the float rounding of the result.
  double s, c;
  sincospi(static_cast<double>(angle) * 0.318309886183790671537767526745028724, &s, &c);
  return RopeAngle{static_cast<float>(c), static_cast<float>(s)};
}

// The rotated pair: out[i] = lo cos - hi sin, out[i + HEAD_DIM/2] = hi cos + lo sin. Explicit roundings:
// no FMA contraction.
__device__ __forceinline__ bf16 rope_lo(float lo, float hi, RopeAngle a) {
  return to_bf16(__fsub_rn(__fmul_rn(lo, a.cos), __fmul_rn(hi, a.sin)));
}
__device__ __forceinline__ bf16 rope_hi(float lo, float hi, RopeAngle a) {
  return to_bf16(__fadd_rn(__fmul_rn(hi, a.cos), __fmul_rn(lo, a.sin)));
}

}  // namespace kernels
}  // namespace tfe
