// Sliding-window GQA attention of one query row per slot against the slot's K/V ring, split over keys.
//
// A step attends up to WINDOW + 1 keys for a handful of rows: one CTA per (kv head, row) would leave the
// GPU nearly idle and walk the window serially, so the keys are cut into SPLIT chunks of CHUNK keys and
// every (chunk, kv head, row) gets a CTA.
//
// Mapping (compiler/launch_shapes.cpp mirrors AttnShape): grid (KV_HEADS * SPLIT, rows), 128 threads.
// CTA (kvh, c) runs the G = HEADS / KV_HEADS query heads of kv head kvh over keys first + c * CHUNK ..,
// where first = max(first_pos[r], p - WINDOW), p = pos[r] + pos_offset, key t at ring row t % RING of
// slot[r]:
//   scores: LPK lanes per key, one 16-byte K chunk each, summed by a fixed xor butterfly over those lanes;
//   per head (a warp each): m = max of the chunk's scores, e = exp(s - m), l = sum e;
//   o_c = sum e v: thread (key group, dim pair) over keys kg, kg + KG, ..; key groups summed in order.
// SPLIT = 1: o = bf16(o_c / l) directly. Otherwise the CTA stores (m, l, o_c) in `part`, and the last CTA
// of (row, kv head) to take a ticket from `arrivals` joins the SPLIT partials in chunk order and returns
// the counter to zero for the next pass:
//   M = max_c m_c, w_c = exp(m_c - M), L = sum_c l_c w_c, o = bf16((sum_c o_c w_c) / L).
// Every sum has a fixed order, so the result does not depend on which CTA joins: eager launches and graph
// replays agree bit for bit.
// Numerics: s = (q . k) * scale in fp32; exponentials and sums in fp32; o rounded to bf16 once.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct RingAttentionParams {
  const bf16* q;         // [rows, HEADS, HEAD_DIM]
  const bf16* ring_k;    // [slots, RING, KV_HEADS, HEAD_DIM]
  const bf16* ring_v;
  const int* slot;       // [rows]
  const int* pos;        // [rows]
  const int* first_pos;  // [rows]: the slot's first real position (no keys exist before it)
  long long pos_offset;
  bf16* o;               // [rows, HEADS, HEAD_DIM]
  float* part;           // SPLIT > 1: [rows, KV_HEADS, SPLIT, G * (HEAD_DIM + 2)]: m[G], l[G], o_c[G][HEAD_DIM]
  int* arrivals;         // SPLIT > 1: [rows, KV_HEADS], zero between passes
  long long rows;
  F32Slot scale;         // usually 1 / sqrt(HEAD_DIM)
};
static_assert(sizeof(RingAttentionParams) == 8 * 12, "one 8-byte slot per registry parameter");

__host__ __device__ constexpr long long pow2_at_least(long long n) {
  long long p = 1;
  while (p < n) p *= 2;
  return p;
}

template <long long HEADS, long long KV_HEADS, long long HEAD_DIM, long long WINDOW, long long SPLIT>
struct AttnShape {
  static constexpr int THREADS = 128;
  static constexpr long long G = HEADS / KV_HEADS;
  static constexpr long long KEYS = WINDOW + 1;
  static constexpr long long CHUNK = ceil_div(KEYS, SPLIT);      // keys per CTA
  static constexpr long long E = HEAD_DIM % 8 == 0 ? 8 : 2;      // K elements per load (16 or 4 bytes)
  static constexpr long long KC = HEAD_DIM / E;                  // loads per K row
  static constexpr long long LPK = min_ll(32, pow2_at_least(KC));  // lanes per key (a power of two)
  static constexpr long long KPP = THREADS / LPK;                // keys per pass
  static constexpr long long DP = HEAD_DIM / 2;                  // dim pairs
  static constexpr long long KG = max_ll(1, THREADS / DP);       // key groups of the o_c = e V phase
  static constexpr long long PART = G * (HEAD_DIM + 2);          // floats of one partial
  // Float offsets into dynamic shared memory (= launch_shapes.cpp attention_smem).
  static constexpr long long Q_AT = 0, E_AT = G * HEAD_DIM, O_AT = E_AT + G * CHUNK, W_AT = O_AT + KG * G * HEAD_DIM;
  static constexpr long long SMEM_FLOATS = W_AT + (SPLIT > 1 ? SPLIT * G + G : 0);
};

template <typename Cfg>
__global__ void __launch_bounds__(128) ring_attention(const RingAttentionParams p) {
  using S = AttnShape<Cfg::HEADS, Cfg::KV_HEADS, Cfg::HEAD_DIM, Cfg::WINDOW, Cfg::SPLIT>;
  constexpr long long HD = Cfg::HEAD_DIM, KVH = Cfg::KV_HEADS, G = S::G, SPLIT = Cfg::SPLIT;
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  float* qs = smem + S::Q_AT;  // [G][HD]
  float* es = smem + S::E_AT;  // [G][CHUNK]: scores, then exp(s - m)
  float* os = smem + S::O_AT;  // [KG][G][HD]
  __shared__ float ms[G], ls[G];
  __shared__ bool joins;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long kvh = blockIdx.x / SPLIT, c = blockIdx.x % SPLIT, r = blockIdx.y;
  if (r >= p.rows) return;
  const long long position = p.pos[r] + p.pos_offset;
  const long long window_start = position - Cfg::WINDOW;
  const long long first = window_start > p.first_pos[r] ? window_start : p.first_pos[r];
  const long long keys = position - first + 1;
  const long long begin = c * S::CHUNK;                                 // this chunk's keys: begin .. begin + n - 1
  const int n = static_cast<int>(max_ll(0, min_ll(S::CHUNK, keys - begin)));
  const long long slot_base = static_cast<long long>(p.slot[r]) * Cfg::RING;
  const float scale = p.scale.v;

  const bf16* q = p.q + (r * Cfg::HEADS + kvh * G) * HD;  // the group's G heads are contiguous
  for (long long e = tid; e < G * HD; e += S::THREADS) qs[e] = to_float(q[e]);
  __syncthreads();

  // Scores: LPK lanes per key; lanes past KC (HEAD_DIM / E not a power of two) add zeros.
  const int li = tid % S::LPK;
  for (int i0 = 0; i0 < n; i0 += S::KPP) {
    const int i = i0 + tid / static_cast<int>(S::LPK);
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    if (i < n) {
      const long long t = first + begin + i;
      const bf16* k = p.ring_k + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD;
      for (long long ch = li; ch < S::KC; ch += S::LPK) {
        float kv[S::E];
        if constexpr (S::E == 8) {
          const uint4 u = *reinterpret_cast<const uint4*>(k + ch * 8);
          const unsigned wds[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            kv[2 * w] = bf16_lo(wds[w]);
            kv[2 * w + 1] = bf16_hi(wds[w]);
          }
        } else {
          const unsigned u = *reinterpret_cast<const unsigned*>(k + ch * 2);
          kv[0] = bf16_lo(u);
          kv[1] = bf16_hi(u);
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int e = 0; e < S::E; ++e) acc[g] += kv[e] * qs[g * HD + ch * S::E + e];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int o = static_cast<int>(S::LPK) / 2; o > 0; o >>= 1) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], o);
    if (li == 0 && i < n)
#pragma unroll
      for (int g = 0; g < G; ++g) es[g * S::CHUNK + i] = acc[g] * scale;
  }
  __syncthreads();

  // Per head: the chunk's max and sum of exp(s - max); an empty chunk has m = -inf, l = 0.
  for (long long g = warp; g < G; g += S::THREADS / 32) {
    float* row = es + g * S::CHUNK;
    float m = neg_inf();
    for (int i = lane; i < n; i += 32) m = fmaxf(m, row[i]);
    m = warp_max(m);
    float l = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float e = expf(row[i] - m);
      row[i] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ms[g] = m;
      ls[g] = l;
    }
  }
  __syncthreads();

  // o_c = sum e v per key group, then the groups in order.
  for (long long item = tid; item < S::KG * S::DP; item += S::THREADS) {
    const long long kg = item / S::DP, d = 2 * (item % S::DP);
    float acc[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = 0.0f;
#pragma unroll 4
    for (int i = static_cast<int>(kg); i < n; i += static_cast<int>(S::KG)) {
      const long long t = first + begin + i;
      const unsigned v =
          *reinterpret_cast<const unsigned*>(p.ring_v + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD + d);
      const float v0 = bf16_lo(v), v1 = bf16_hi(v);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float e = es[g * S::CHUNK + i];
        acc[g][0] += e * v0;
        acc[g][1] += e * v1;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      os[(kg * G + g) * HD + d] = acc[g][0];
      os[(kg * G + g) * HD + d + 1] = acc[g][1];
    }
  }
  __syncthreads();

  bf16* o = p.o + (r * Cfg::HEADS + kvh * G) * HD;
  if constexpr (SPLIT == 1) {
    for (long long e = tid; e < G * HD; e += S::THREADS) {
      float sum = 0.0f;
      for (long long kg = 0; kg < S::KG; ++kg) sum += os[kg * G * HD + e];
      const float l = ls[e / HD];
      o[e] = to_bf16(l > 0.0f ? sum / l : 0.0f);
    }
  } else {
    // This chunk's partial, then a ticket; the last of the SPLIT CTAs of (row, kv head) joins.
    const long long rk = r * KVH + kvh;
    float* mine = p.part + (rk * SPLIT + c) * S::PART;
    if (tid < G) {
      mine[tid] = ms[tid];
      mine[G + tid] = ls[tid];
    }
    for (long long e = tid; e < G * HD; e += S::THREADS) {
      float sum = 0.0f;
      for (long long kg = 0; kg < S::KG; ++kg) sum += os[kg * G * HD + e];
      mine[2 * G + e] = sum;
    }
    __threadfence();  // the partial is visible device-wide before the ticket that announces it
    __syncthreads();
    if (tid == 0) {
      const int ticket = atomicAdd(p.arrivals + rk, 1);
      joins = ticket == SPLIT - 1;
      if (joins) p.arrivals[rk] = 0;  // every CTA of this (row, kv head) has its ticket: ready for the next pass
    }
    __syncthreads();
    if (!joins) return;
    __threadfence();

    const float* all = p.part + rk * SPLIT * S::PART;
    float* w = smem + S::W_AT;  // [SPLIT][G] chunk weights exp(m_c - M), then [G] 1 / L
    if (tid < G) {
      float m = neg_inf();
      for (long long cc = 0; cc < SPLIT; ++cc) m = fmaxf(m, __ldcg(all + cc * S::PART + tid));
      float l = 0.0f;
      for (long long cc = 0; cc < SPLIT; ++cc) {
        const float mc = __ldcg(all + cc * S::PART + tid);
        const float wc = mc == neg_inf() ? 0.0f : expf(mc - m);
        w[cc * G + tid] = wc;
        l += __ldcg(all + cc * S::PART + G + tid) * wc;
      }
      w[SPLIT * G + tid] = l;
    }
    __syncthreads();
    for (long long e = tid; e < G * HD; e += S::THREADS) {
      const long long g = e / HD;
      float sum = 0.0f;
      for (long long cc = 0; cc < SPLIT; ++cc) sum += __ldcg(all + cc * S::PART + 2 * G + e) * w[cc * G + g];
      const float l = w[SPLIT * G + g];
      o[e] = to_bf16(l > 0.0f ? sum / l : 0.0f);
    }
  }
}

}  // namespace kernels
}  // namespace tfe
