// Sliding-window GQA attention of one query row per slot against the slot's K/V ring.
//
// Mapping (compiler/launch_shapes.cpp mirrors AttnShape): one CTA of 256 threads per (kv head, row) runs
// the G = HEADS / KV_HEADS query heads that read this kv head, over keys t = max(first_pos[r], p - WINDOW) .. p
// (p = pos[r] + pos_offset; key t at ring row t % RING of slot[r]). Dynamic shared memory holds the
// group's queries (fp32), its scores / probabilities, and the partial outputs of the key groups.
//   scores: a thread per key, 16-byte loads along its K row, queries broadcast from shared memory;
//   softmax: a warp per query head;
//   o = sum_t p_t v_t: thread (key group kg, dim pair) runs keys kg, kg + KG, ... (coalesced V rows);
//   the KG partials are summed in key-group order.
// Numerics: s = (q . k) * scale in fp32, p = exp(s - max) / sum in fp32, o = bf16(sum_t p_t v_t).
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct RingAttentionParams {
  const bf16* q;     // [rows, HEADS, HEAD_DIM]
  const bf16* ring_k;  // [slots, RING, KV_HEADS, HEAD_DIM]
  const bf16* ring_v;
  const int* slot;   // [rows]
  const int* pos;    // [rows]
  const int* first_pos;  // [rows]: the slot's first real position (no keys exist before it)
  long long pos_offset;
  bf16* o;           // [rows, HEADS, HEAD_DIM]
  long long rows;
  F32Slot scale;     // usually 1 / sqrt(HEAD_DIM)
};
static_assert(sizeof(RingAttentionParams) == 8 * 10, "one 8-byte slot per registry parameter");

__host__ __device__ constexpr long long largest_divisor_upto(long long n, long long cap) {
  long long best = 1;
  for (long long d = 1; d <= cap && d <= n; ++d)
    if (n % d == 0) best = d;
  return best;
}

template <long long HEADS, long long KV_HEADS, long long HEAD_DIM, long long WINDOW>
struct AttnShape {
  static constexpr int THREADS = 256;
  static constexpr long long G = HEADS / KV_HEADS;
  static constexpr long long KEYS = WINDOW + 1;
  static constexpr long long DIM_PAIRS = HEAD_DIM / 2;
  static constexpr long long KG = THREADS / DIM_PAIRS;  // key groups of the o = p V phase
  static constexpr long long GC = largest_divisor_upto(G, 8);  // query heads per score pass
  static constexpr int KCHUNK = HEAD_DIM % 8 == 0 ? 8 : 2;    // K elements per load
  // Float offsets into dynamic shared memory (= launch_shapes.cpp attention_smem).
  static constexpr long long Q_AT = 0, P_AT = G * HEAD_DIM, PART_AT = P_AT + G * KEYS;
  static constexpr long long SMEM_FLOATS = PART_AT + KG * G * HEAD_DIM;
};

template <typename Cfg>
__global__ void __launch_bounds__(256) ring_attention(const RingAttentionParams p) {
  using S = AttnShape<Cfg::HEADS, Cfg::KV_HEADS, Cfg::HEAD_DIM, Cfg::WINDOW>;
  constexpr long long HD = Cfg::HEAD_DIM, KVH = Cfg::KV_HEADS, G = S::G;
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  float* qs = smem + S::Q_AT;       // [G][HD]
  float* ps = smem + S::P_AT;       // [G][KEYS]
  float* part = smem + S::PART_AT;  // [KG][G][HD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long kvh = blockIdx.x, r = blockIdx.y;
  if (r >= p.rows) return;
  const long long position = p.pos[r] + p.pos_offset;
  const long long window_start = position - Cfg::WINDOW;
  const long long first = window_start > p.first_pos[r] ? window_start : p.first_pos[r];
  const int keys = static_cast<int>(position - first + 1);
  const long long slot_base = static_cast<long long>(p.slot[r]) * Cfg::RING;
  const float scale = p.scale.v;

  const bf16* q = p.q + (r * Cfg::HEADS + kvh * G) * HD;  // the group's G heads are contiguous
  for (long long e = tid; e < G * HD; e += S::THREADS) qs[e] = to_float(q[e]);
  __syncthreads();

  // Scores.
  for (int i = tid; i < keys; i += S::THREADS) {
    const long long t = first + i;
    const bf16* k = p.ring_k + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD;
    for (long long g0 = 0; g0 < G; g0 += S::GC) {
      float acc[S::GC];
#pragma unroll
      for (int g = 0; g < S::GC; ++g) acc[g] = 0.0f;
      for (long long d = 0; d < HD; d += S::KCHUNK) {
        float kv[S::KCHUNK];
        if constexpr (S::KCHUNK == 8) {
          const uint4 u = *reinterpret_cast<const uint4*>(k + d);
          const unsigned wds[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            kv[2 * c] = bf16_lo(wds[c]);
            kv[2 * c + 1] = bf16_hi(wds[c]);
          }
        } else {
          const unsigned u = *reinterpret_cast<const unsigned*>(k + d);
          kv[0] = bf16_lo(u);
          kv[1] = bf16_hi(u);
        }
#pragma unroll
        for (int g = 0; g < S::GC; ++g)
#pragma unroll
          for (int c = 0; c < S::KCHUNK; ++c) acc[g] += kv[c] * qs[(g0 + g) * HD + d + c];
      }
#pragma unroll
      for (int g = 0; g < S::GC; ++g) ps[(g0 + g) * S::KEYS + i] = acc[g] * scale;
    }
  }
  __syncthreads();

  // Softmax, a warp per query head.
  for (long long g = warp; g < G; g += S::THREADS / 32) {
    float* row = ps + g * S::KEYS;
    float m = neg_inf();
    for (int i = lane; i < keys; i += 32) m = fmaxf(m, row[i]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int i = lane; i < keys; i += 32) {
      const float e = expf(row[i] - m);
      row[i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    for (int i = lane; i < keys; i += 32) row[i] = row[i] / sum;
  }
  __syncthreads();

  // o = sum_t p_t v_t: per key group, then the groups in order.
  if (tid < S::KG * S::DIM_PAIRS) {
    const long long kg = tid / S::DIM_PAIRS, d = 2 * (tid % S::DIM_PAIRS);
    float acc[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = 0.0f;
    for (long long i = kg; i < keys; i += S::KG) {
      const long long t = first + i;
      const unsigned v =
          *reinterpret_cast<const unsigned*>(p.ring_v + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD + d);
      const float v0 = bf16_lo(v), v1 = bf16_hi(v);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pt = ps[g * S::KEYS + i];
        acc[g][0] += pt * v0;
        acc[g][1] += pt * v1;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      part[(kg * G + g) * HD + d] = acc[g][0];
      part[(kg * G + g) * HD + d + 1] = acc[g][1];
    }
  }
  __syncthreads();
  bf16* o = p.o + (r * Cfg::HEADS + kvh * G) * HD;
  for (long long e = tid; e < G * HD; e += S::THREADS) {
    float sum = 0.0f;
    for (long long kg = 0; kg < S::KG; ++kg) sum += part[kg * G * HD + e];
    o[e] = to_bf16(sum);
  }
}

}  // namespace kernels
}  // namespace tfe
