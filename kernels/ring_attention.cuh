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
//   scores: LPK lanes per key, 16-byte K loads, summed by a fixed xor butterfly over those lanes;
//   per head (a warp each): m = max of the chunk's scores, e = exp(s - m), l = sum e;
//   o_c = sum e v: thread (key group, 16-byte column of V) over keys kg, kg + KG, ..; key groups summed in
//   order.
// Loads are issued BATCH at a time before their first use: the kernel is latency-bound at few rows, and
// at 16 rows its K/V window comes from HBM.
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

__host__ __device__ constexpr long long largest_divisor_upto(long long n, long long cap) {
  long long best = 1;
  for (long long d = 1; d <= cap && d <= n; ++d)
    if (n % d == 0) best = d;
  return best;
}

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
  static constexpr long long CHUNK = ceil_div(KEYS, SPLIT);        // keys per CTA
  static constexpr long long E = HEAD_DIM % 8 == 0 ? 8 : 2;        // K / V elements per load (16 or 4 bytes)
  static constexpr long long KC = HEAD_DIM / E;                    // loads per K or V row
  static constexpr long long LPK = min_ll(32, pow2_at_least(KC));  // scores: lanes per key (a power of two)
  static constexpr long long CPL = ceil_div(KC, LPK);              // scores: loads per lane per key
  static constexpr long long KPP = THREADS / LPK;                  // scores: keys per pass
  static constexpr long long PASSES = ceil_div(CHUNK, KPP);
  static constexpr long long KG = max_ll(1, THREADS / KC);         // e V: key groups (a thread per (group, load))
  static constexpr long long KPG = ceil_div(CHUNK, KG);            // e V: keys per key group
  static constexpr int BATCH = 4;                                  // loads issued before their first use
  static constexpr long long GC = largest_divisor_upto(G, 4);      // e V: query heads per accumulator set
  static constexpr long long PART = G * (HEAD_DIM + 2);            // floats of one partial
  // Float offsets into dynamic shared memory (= launch_shapes.cpp attention_smem).
  static constexpr long long Q_AT = 0, E_AT = G * HEAD_DIM, O_AT = E_AT + G * CHUNK, W_AT = O_AT + KG * G * HEAD_DIM;
  static constexpr long long SMEM_FLOATS = W_AT + (SPLIT > 1 ? 3 * SPLIT * G + G : 0);
};

// The E elements of one K or V load, as floats.
template <long long E>
__device__ __forceinline__ void unpack(const uint4 u, float (&out)[E]) {
  if constexpr (E == 8) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bf16_lo(w[i]);
      out[2 * i + 1] = bf16_hi(w[i]);
    }
  } else {
    out[0] = bf16_lo(u.x);
    out[1] = bf16_hi(u.x);
  }
}
template <long long E>
__device__ __forceinline__ uint4 load_kv(const bf16* at) {
  if constexpr (E == 8) return *reinterpret_cast<const uint4*>(at);
  else return make_uint4(*reinterpret_cast<const unsigned*>(at), 0u, 0u, 0u);
}

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

  // Scores: LPK lanes per key, CPL loads each; lanes past KC (HEAD_DIM / E not a power of two) add zeros.
  // BATCH passes' loads are issued before the first of them is used.
  const int li = tid % S::LPK, kq = tid / static_cast<int>(S::LPK);
  for (long long p0 = 0; p0 < S::PASSES; p0 += S::BATCH) {
    uint4 kr[S::BATCH][S::CPL];
#pragma unroll
    for (int b = 0; b < S::BATCH; ++b) {
      const long long i = (p0 + b) * S::KPP + kq;
#pragma unroll
      for (int j = 0; j < S::CPL; ++j) {
        const long long ch = li + j * S::LPK;
        kr[b][j] = make_uint4(0u, 0u, 0u, 0u);
        if (p0 + b < S::PASSES && i < n && ch < S::KC) {
          const long long t = first + begin + i;
          kr[b][j] = load_kv<S::E>(p.ring_k + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD + ch * S::E);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < S::BATCH; ++b) {
      if (p0 + b >= S::PASSES) break;
      const long long i = (p0 + b) * S::KPP + kq;
      float acc[G];
#pragma unroll
      for (int g = 0; g < G; ++g) acc[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < S::CPL; ++j) {
        const long long ch = li + j * S::LPK;
        if (ch >= S::KC) continue;
        float kv[S::E];
        unpack<S::E>(kr[b][j], kv);
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int e = 0; e < S::E; ++e) acc[g] += kv[e] * qs[g * HD + ch * S::E + e];
      }
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int o = static_cast<int>(S::LPK) / 2; o > 0; o >>= 1) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], o);
      if (li == 0 && i < n)
#pragma unroll
        for (int g = 0; g < G; ++g) es[g * S::CHUNK + i] = acc[g] * scale;
    }
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

  // o_c = sum e v: thread (key group kg, load ch) takes keys kg, kg + KG, .. of elements ch * E ..; BATCH
  // keys' V loads in flight; GC heads per accumulator set. Then the key groups are summed in order.
  for (long long item = tid; item < S::KG * S::KC; item += S::THREADS) {
    const long long kg = item / S::KC, ch = item % S::KC;
    for (long long g0 = 0; g0 < G; g0 += S::GC) {
      float acc[S::GC][S::E];
#pragma unroll
      for (int g = 0; g < S::GC; ++g)
#pragma unroll
        for (int e = 0; e < S::E; ++e) acc[g][e] = 0.0f;
      for (long long k0 = 0; k0 < S::KPG; k0 += S::BATCH) {
        uint4 vr[S::BATCH];
#pragma unroll
        for (int b = 0; b < S::BATCH; ++b) {
          const long long i = kg + (k0 + b) * S::KG;
          vr[b] = make_uint4(0u, 0u, 0u, 0u);
          if (k0 + b < S::KPG && i < n) {
            const long long t = first + begin + i;
            vr[b] = load_kv<S::E>(p.ring_v + ((slot_base + t % Cfg::RING) * KVH + kvh) * HD + ch * S::E);
          }
        }
#pragma unroll
        for (int b = 0; b < S::BATCH; ++b) {
          const long long i = kg + (k0 + b) * S::KG;
          if (k0 + b >= S::KPG || i >= n) break;
          float v[S::E];
          unpack<S::E>(vr[b], v);
#pragma unroll
          for (int g = 0; g < S::GC; ++g) {
            const float e = es[(g0 + g) * S::CHUNK + i];
#pragma unroll
            for (int x = 0; x < S::E; ++x) acc[g][x] += e * v[x];
          }
        }
      }
#pragma unroll
      for (int g = 0; g < S::GC; ++g)
#pragma unroll
        for (int x = 0; x < S::E; ++x) os[(kg * G + g0 + g) * HD + ch * S::E + x] = acc[g][x];
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

    // Every chunk's m and l into shared memory at once, the chunk weights from there, then each output
    // element's SPLIT partial values with their loads in flight together.
    const float* all = p.part + rk * SPLIT * S::PART;
    float* ml = smem + S::W_AT;       // [SPLIT][2G]: m[G], l[G] of each chunk
    float* w = ml + 2 * SPLIT * G;    // [SPLIT][G]: exp(m_c - M), then [G]: L
    for (long long e = tid; e < SPLIT * 2 * G; e += S::THREADS) ml[e] = __ldcg(all + (e / (2 * G)) * S::PART + e % (2 * G));
    __syncthreads();
    if (tid < G) {
      float m = neg_inf();
      for (long long cc = 0; cc < SPLIT; ++cc) m = fmaxf(m, ml[cc * 2 * G + tid]);
      float l = 0.0f;
      for (long long cc = 0; cc < SPLIT; ++cc) {
        const float mc = ml[cc * 2 * G + tid];
        const float wc = mc == neg_inf() ? 0.0f : expf(mc - m);
        w[cc * G + tid] = wc;
        l += ml[cc * 2 * G + G + tid] * wc;
      }
      w[SPLIT * G + tid] = l;
    }
    __syncthreads();
    for (long long e = tid; e < G * HD; e += S::THREADS) {
      const long long g = e / HD;
      float sum = 0.0f;
#pragma unroll 8
      for (long long cc = 0; cc < SPLIT; ++cc) sum += __ldcg(all + cc * S::PART + 2 * G + e) * w[cc * G + g];
      const float l = w[SPLIT * G + g];
      o[e] = to_bf16(l > 0.0f ? sum / l : 0.0f);
    }
  }
}

}  // namespace kernels
}  // namespace tfe
