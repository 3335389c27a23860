// Per row: qk_norm (if QK_NORM) and RoPE at position pos[r] + pos_offset on the q and k heads, then k
// and v into the slot's ring row (position mod RING), q into q_out when WRITE_Q.
//
// Mapping: grid (ceil(IN_HEADS / kQkRopeKvWarps), rows), kQkRopeKvWarps warps (qk_rope_kv.h); a warp per head
// (q heads, then k heads, then v heads), so a row's heads run side by side on many SMs. A lane holds
// rotate-half pairs (i, i + HEAD_DIM/2) for i = lane, lane + 32, ... so the norm's sum of squares is one
// warp reduction and the rotation needs no exchange.
// Numerics: qk_norm is rms() (two bf16 roundings); RoPE on those bf16 values as kernels/rope.cuh
// computes it (cos / sin in double rounded to float, the rotation in fp32, rounded once).
// Draft passes of heads without qk_norm run this in the wqkv GEMV's epilogue instead (gemv_rope_kv in
// kernels/gemv.cuh), with the same bits.
#pragma once
#include "common.cuh"
#include "qk_rope_kv.h"
#include "rope.cuh"

namespace tfe {
namespace kernels {

struct QkRopeKvParams {
  const bf16* qkv;        // [rows, (WRITE_Q ? HEADS : 0) + 2 * KV_HEADS, HEAD_DIM]: [q | k | v]
  const bf16* q_norm;     // [HEAD_DIM] when QK_NORM
  const bf16* k_norm;     // [HEAD_DIM] when QK_NORM
  const float* inv_freq;  // [HEAD_DIM / 2]
  const int* slot;        // [rows]
  const int* pos;         // [rows]
  long long pos_offset;
  bf16* q_out;   // [rows, HEADS, HEAD_DIM] when WRITE_Q
  bf16* ring_k;  // [slots, RING, KV_HEADS, HEAD_DIM]
  bf16* ring_v;
  long long rows;
  F32Slot eps;
};
static_assert(sizeof(QkRopeKvParams) == 8 * 12, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(32 * kQkRopeKvWarps) qk_rope_kv(const QkRopeKvParams p) {
  start_after_predecessors();
  constexpr long long HD = Cfg::HEAD_DIM, HALF = HD / 2, KVH = Cfg::KV_HEADS;
  constexpr long long QH = Cfg::WRITE_Q ? Cfg::HEADS : 0;
  constexpr long long IN_HEADS = QH + 2 * KVH;
  constexpr int PAIRS = static_cast<int>(ceil_div(HALF, 32));  // pairs per lane
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const long long h = static_cast<long long>(blockIdx.x) * warps + warp, r = blockIdx.y;
  if (r >= p.rows || h >= IN_HEADS) return;

  const long long position = p.pos[r] + p.pos_offset;
  const long long ring_row = position % Cfg::RING;
  const long long ring_base = ((static_cast<long long>(p.slot[r]) * Cfg::RING + ring_row) * KVH) * HD;
  const bf16* in = p.qkv + r * IN_HEADS * HD;

  const bf16* src = in + h * HD;
  if (h >= QH + KVH) {  // v: copied unchanged
    bf16* dst = p.ring_v + ring_base + (h - QH - KVH) * HD;
    for (long long e = lane; e < HD; e += 32) dst[e] = src[e];
    return;
  }
  // cos / sin of this lane's pairs: the same for every head of the row.
  RopeAngle angle[PAIRS];
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    const long long i = lane + 32 * k;
    angle[k] = i < HALF ? rope_angle(position, p.inv_freq[i]) : RopeAngle{1.0f, 0.0f};
  }

  const bool is_q = h < QH;
  float lo[PAIRS], hi[PAIRS];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    const long long i = lane + 32 * k;
    lo[k] = i < HALF ? to_float(src[i]) : 0.0f;
    hi[k] = i < HALF ? to_float(src[i + HALF]) : 0.0f;
    ss += lo[k] * lo[k] + hi[k] * hi[k];
  }
  if constexpr (Cfg::QK_NORM != 0) {
    const float inv = rms_inv(warp_sum(ss), HD, p.eps.v);
    const bf16* nw = is_q ? p.q_norm : p.k_norm;
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) {
      const long long i = lane + 32 * k;
      if (i < HALF) {
        lo[k] = rms_apply(lo[k], inv, to_float(nw[i]));
        hi[k] = rms_apply(hi[k], inv, to_float(nw[i + HALF]));
      }
    }
  }
  bf16* dst = is_q ? p.q_out + (r * Cfg::HEADS + h) * HD : p.ring_k + ring_base + (h - QH) * HD;
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    const long long i = lane + 32 * k;
    if (i < HALF) {
      dst[i] = rope_lo(lo[k], hi[k], angle[k]);
      dst[i + HALF] = rope_hi(lo[k], hi[k], angle[k]);
    }
  }
}

}  // namespace kernels
}  // namespace tfe
