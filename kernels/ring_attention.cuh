// Sliding-window GQA attention of one query row per slot against the slot's K/V ring, split over keys
// across the CTAs of a thread-block cluster.
//
// A step attends up to WINDOW + 1 keys for a handful of rows: one CTA per (kv head, row) would leave the
// GPU nearly idle and walk the window serially, so the keys are cut into SPLIT chunks (SPLIT <= 8, the
// portable cluster size) and each chunk gets a CTA of one cluster; the cluster joins its partials through
// distributed shared memory, with no global scratch and no second launch.
//
// Mapping (AttnShape, from ring_attention.h as the launch shape): grid (KV_HEADS * SPLIT, rows), clusters of
// (SPLIT, 1, 1), 128 threads. CTA rank c of cluster (kvh, r) runs the G = HEADS / KV_HEADS query heads of
// kv head kvh over keys first + c * CHUNK .., where first = max(first_pos[r], p - WINDOW),
// p = pos[r] + pos_offset, key t at ring row t % RING of slot[r]:
//   loads: thread (key lane kq = tid / LPK, column li = tid % LPK) copies K and V of keys kq, kq + KPP, ..
//     in 16-byte columns li, li + LPK, .. by cp.async into its own slots of a ring of STAGES tiles in
//     shared memory (a tile: TP passes of K, or of V), in the order K tiles, then V tiles; STAGES tiles are
//     in flight at once, and a slot is refilled with the tile STAGES further on as soon as it is read. A
//     thread reads back only its own slots, so the ring needs no barrier, only cp.async.wait_group. Its
//     columns of the G queries are in registers;
//   scores: the LPK lanes of a key sum their products by a fixed transposing xor butterfly (each lane ends
//     with whole sums of some (key, head) pairs);
//   per head (a warp each): m = max of the chunk's scores, e = exp(s - m), l = sum e;
//   o_c = sum e v: each thread over its keys, then the key lanes of a warp (xor over the lane bits at and
//     above LPK) and the warps in order through shared memory.
// Join: after a cluster barrier, CTA c computes the outputs c, c + SPLIT, .. of the G * HEAD_DIM from every
// CTA's (m, l, o_c) in chunk order:
//   M = max_c m_c, w_c = exp(m_c - M), L = sum_c l_c w_c, o = bf16((sum_c o_c w_c) / L),
// then a second barrier keeps every CTA's shared memory alive until its peers have read it. Every sum has a
// fixed order, so eager launches and graph replays agree bit for bit.
// Why a ring in shared memory rather than registers: a CTA that loads its whole chunk before using it must
// hold the chunk, and the register file of the GPU holds about half of the 16 windows of a 16-stream
// llama3 step, so such a grid runs in two waves, each a whole chain of loads, scores and join. Streamed
// through the ring, a chunk of any length keeps STAGES tiles in flight, and the planner takes fewer, longer
// chunks until the grid is one wave.
// Under dependent launch the first STAGES tiles go out before the wait for the predecessor: it writes only
// the newest key (and the queries), and every other key was written two or more nodes back, which a
// kernel that has started may read (every kernel releases its successor only after its own wait). The
// lanes that own the newest key store it over their slots once the wait returns.
// Numerics: s = (q . k) * scale in fp32; exponentials and sums in fp32; o rounded to bf16 once.
#pragma once
#include "common.cuh"
#include "ring_attention.h"

namespace tfe {
namespace kernels {

struct RingAttentionParams {
  const bf16* q;       // [rows, HEADS, HEAD_DIM]
  const bf16* ring_k;  // [slots, RING, KV_HEADS, HEAD_DIM]
  const bf16* ring_v;
  const int* slot;       // [rows]
  const int* pos;        // [rows]
  const int* first_pos;  // [rows]: the slot's first real position (no keys exist before it)
  long long pos_offset;
  bf16* o;  // [rows, HEADS, HEAD_DIM]
  long long rows;
  F32Slot scale;  // usually 1 / sqrt(HEAD_DIM)
};
static_assert(sizeof(RingAttentionParams) == 8 * 10, "one 8-byte slot per registry parameter");

template <long long HEADS, long long KV_HEADS, long long HEAD_DIM, long long WINDOW, long long SPLIT>
struct AttnShape {
  static_assert(SPLIT >= 1 && SPLIT <= 8, "SPLIT is a portable cluster size");
  static constexpr AttnGeometry GEOMETRY = attn_geometry(HEADS, KV_HEADS, HEAD_DIM, WINDOW, SPLIT);
  static constexpr int THREADS = kAttnThreads, WARPS = THREADS / 32;
  static constexpr long long G = GEOMETRY.g;
  static constexpr long long KEYS = GEOMETRY.keys;
  static constexpr long long CHUNK = GEOMETRY.chunk;  // keys per CTA
  static constexpr long long E = GEOMETRY.e;          // K / V elements per load (16 or 4 bytes)
  static constexpr long long KC = GEOMETRY.kc;        // loads per K or V row
  static constexpr long long LPK = GEOMETRY.lpk;      // lanes per key (a power of two)
  static constexpr long long CPL = GEOMETRY.cpl;      // loads per lane per row
  static constexpr long long KPP = GEOMETRY.kpp;      // keys per pass
  static constexpr long long PASSES = GEOMETRY.passes;
  static constexpr long long TP = GEOMETRY.tp;                  // passes a tile
  static constexpr long long TILES = GEOMETRY.tiles;            // K tiles; as many V tiles follow
  static constexpr long long TILE_SLOTS = GEOMETRY.tile_slots;  // 16-byte slots of one tile
  static constexpr long long STAGES = GEOMETRY.stages;          // tiles in flight
  // Five CTAs an SM (at most 102 registers a thread) where the queries leave room for it and there is a
  // cluster (at SPLIT 1 a chunk is the whole window, and 102 registers spill). A cluster must fit within
  // one GPC: at four CTAs an SM an H200 holds only 124 clusters of 4 at once (496 CTAs, not 528), which
  // ran the 512 CTAs of a 16-stream llama3 step in two waves; at five, 512 are one wave.
  static constexpr int MIN_CTAS = G * E <= 32 && SPLIT > 1 ? 5 : 1;
  static constexpr long long PART = GEOMETRY.part;  // one partial: m[G], l[G], o_c[G][HD]
  // Float offsets into dynamic shared memory, and its size (the launch's). The per-warp outputs os reuse
  // the ring once the last V tile is read.
  static constexpr long long RING_FLOATS = GEOMETRY.ring_floats;
  static constexpr long long O_AT = GEOMETRY.o_at, E_AT = GEOMETRY.e_at, P_AT = GEOMETRY.p_at;
  static constexpr long long SMEM_FLOATS = GEOMETRY.smem_floats;
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
__device__ __forceinline__ void copy_kv_async(uint4* slot, const bf16* at, bool live) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(slot));
  if constexpr (E == 8)
    copy_async_16<false>(dst, at, live ? 16u : 0u);
  else
    copy_async_4(dst, at, live ? 4u : 0u);
}
template <long long E>
__device__ __forceinline__ uint4 load_kv(const bf16* at) {
  if constexpr (E == 8)
    return *reinterpret_cast<const uint4*>(at);
  else
    return make_uint4(*reinterpret_cast<const unsigned*>(at), 0u, 0u, 0u);
}

template <typename Cfg>
__global__ void TFE_CLUSTER(Cfg::SPLIT)
    __launch_bounds__(kAttnThreads,
                      (AttnShape<Cfg::HEADS, Cfg::KV_HEADS, Cfg::HEAD_DIM, Cfg::WINDOW, Cfg::SPLIT>::MIN_CTAS))
        ring_attention(const RingAttentionParams p) {
  using S = AttnShape<Cfg::HEADS, Cfg::KV_HEADS, Cfg::HEAD_DIM, Cfg::WINDOW, Cfg::SPLIT>;
  constexpr long long HD = Cfg::HEAD_DIM, KVH = Cfg::KV_HEADS, G = S::G, SPLIT = Cfg::SPLIT;
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  uint4* ring = reinterpret_cast<uint4*>(smem_raw) + S::O_AT / 4;  // [STAGES][TP][CPL][THREADS]
  float* os = smem + S::O_AT;    // [WARPS][G][HD], over the ring once its last tile is read
  float* es = smem + S::E_AT;    // [G][CHUNK]: scores, then exp(s - m)
  float* part = smem + S::P_AT;  // this chunk's m[G], l[G], o_c[G][HD], read by the cluster's join

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // A cluster is SPLIT consecutive CTAs along x, so its CTA rank is blockIdx.x % SPLIT; a whole cluster
  // shares r and returns together.
  const long long kvh = blockIdx.x / SPLIT, c = blockIdx.x % SPLIT, r = blockIdx.y;
  if (r >= p.rows) {
    start_after_predecessors();  // every CTA waits before it exits: its successor may rely on the wait
    return;
  }
  // Before the wait: the tables come from load_tables, and every key but the newest from earlier steps or
  // the extend, all written two or more nodes back. A kernel releases its successor only after its own
  // wait, so those writes are visible here. The newest key (`newest`) is the predecessor's output: its
  // slots are loaded again after the wait.
  const long long position = p.pos[r] + p.pos_offset;
  const long long window_start = position - Cfg::WINDOW;
  const long long first = window_start > p.first_pos[r] ? window_start : p.first_pos[r];
  const long long keys = position - first + 1;
  const long long begin = c * S::CHUNK;  // this chunk's keys: begin .. begin + n - 1
  const int n = static_cast<int>(max_ll(0, min_ll(S::CHUNK, keys - begin)));
  const long long slot_base = static_cast<long long>(p.slot[r]) * Cfg::RING;
  const float scale = p.scale.v;
  const int li = tid % S::LPK, kq = tid / static_cast<int>(S::LPK);
  const int newest = static_cast<int>(position - first - begin);  // the newest key's index here, if it is here
  const bool owns_newest = newest >= 0 && newest < n && kq == newest % static_cast<int>(S::KPP);
  const int newest_pass = owns_newest ? newest / static_cast<int>(S::KPP) : -1;  // -1: not this thread's

  // Ring item `it` (K tile it, then V tile it - TILES) into stage it % STAGES, one cp.async group; past the
  // last item an empty group, so that every wait below leaves the same count of groups pending. Slots of
  // keys past the chunk and columns past HEAD_DIM are zeros: they join the sums of live keys' lanes.
  auto issue = [&](int it) {
    if (it < 2 * S::TILES) {
      const bf16* base = it < S::TILES ? p.ring_k : p.ring_v;
      const long long pass0 = (it % S::TILES) * S::TP;
      uint4* stage = ring + (it % S::STAGES) * S::TILE_SLOTS;
#pragma unroll
      for (int b = 0; b < S::TP; ++b) {
        const long long i = (pass0 + b) * S::KPP + kq;
        const bool key = pass0 + b < S::PASSES && i < n;
        const long long row = key ? ((slot_base + (first + begin + i) % Cfg::RING) * KVH + kvh) * HD : 0;
#pragma unroll
        for (int j = 0; j < S::CPL; ++j) {
          const long long ch = li + j * S::LPK;
          const bool live = key && ch < S::KC;
          copy_kv_async<S::E>(stage + (b * S::CPL + j) * S::THREADS + tid, live ? base + row + ch * S::E : base, live);
        }
      }
    }
    copy_async_commit();
  };
  // The first STAGES tiles go out before anything else, before the wait: the chunk's K/V is most of what the
  // CTA waits for.
#pragma unroll
  for (int it = 0; it < S::STAGES; ++it) issue(it);
  start_after_predecessors();
  // The newest key's slots of those tiles hold what its ring row held before the predecessor wrote it. The
  // lanes that own them wait for their copies to land (their other slots land with them), then store the
  // key the predecessor wrote over them, through L2; the thread reads back only its own slots.
  if (newest_pass >= 0) {
    const int pass = newest_pass, tile = pass / static_cast<int>(S::TP), b = pass % static_cast<int>(S::TP);
    const long long row = ((slot_base + (first + begin + newest) % Cfg::RING) * KVH + kvh) * HD;
    if (tile < S::STAGES) copy_async_wait<0>();
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const long long it = tile + kv * S::TILES;
      if (it < S::STAGES) {
        uint4* stage = ring + (it % S::STAGES) * S::TILE_SLOTS;
#pragma unroll
        for (int j = 0; j < S::CPL; ++j) {
          const long long ch = li + j * S::LPK;
          const bf16* at = (kv ? p.ring_v : p.ring_k) + row + ch * S::E;
          if (ch < S::KC) stage[(b * S::CPL + j) * S::THREADS + tid] = load_kv<S::E>(at);
        }
      }
    }
  }

  const bf16* q = p.q + (r * Cfg::HEADS + kvh * G) * HD;  // the group's G heads are contiguous
  // This thread's columns of the group's queries, in registers: the score loop reads only the ring.
  float qf[G][S::CPL][S::E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < S::CPL; ++j) {
      const long long ch = li + j * S::LPK;
      unpack<S::E>(ch < S::KC ? load_kv<S::E>(q + g * HD + ch * S::E) : make_uint4(0u, 0u, 0u, 0u), qf[g][j]);
    }

    // Scores, a K tile at a time: per (pass b, head g) this lane's partial dot product over its columns.
    // Tile loops unroll up to 4 tiles (fewer registers: the ring stages become constants), else stay rolled.
#pragma unroll(S::TILES <= 4 ? S::TILES : 1)
  for (int tile = 0; tile < S::TILES; ++tile) {
    copy_async_wait<S::STAGES - 1>();  // this thread's slots of item `tile` have landed
    const uint4* kt = ring + (tile % S::STAGES) * S::TILE_SLOTS;
    const long long p0 = tile * S::TP;
    float acc[S::TP * G];
#pragma unroll
    for (int b = 0; b < S::TP; ++b) {
      float kv[S::CPL][S::E];
#pragma unroll
      for (int j = 0; j < S::CPL; ++j) unpack<S::E>(kt[(b * S::CPL + j) * S::THREADS + tid], kv[j]);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < S::CPL; ++j)
#pragma unroll
          for (int e = 0; e < S::E; ++e) a += kv[j][e] * qf[g][j][e];
        acc[b * G + g] = a;
      }
    }
    issue(tile + S::STAGES);  // the slots are read (the values are in registers): refill them
    // Sum over the LPK lanes of a key. When the TP * G partials divide among them, a transposing
    // butterfly: at each step a lane keeps half of its values and adds the partner's copy of that half, so
    // the steps move N/2 + N/4 + .. values instead of N per step; lane li ends with the full sums of
    // partials li * N/LPK .. (li + 1) * N/LPK - 1. Otherwise a plain butterfly per value.
    constexpr long long N = S::TP * G;
    if constexpr (N % S::LPK == 0) {
      long long half = N;
#pragma unroll
      for (int o = static_cast<int>(S::LPK) / 2; o > 0; o >>= 1) {
        half /= 2;
        const bool upper = (li & o) != 0;
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
          if (k >= half) break;
          const float send = upper ? acc[k] : acc[k + half];
          const float keep = upper ? acc[k + half] : acc[k];
          acc[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
      }
#pragma unroll
      for (int k = 0; k < N / S::LPK; ++k) {
        const long long idx = li * (N / S::LPK) + k, b = idx / G, g = idx % G;
        const long long i = (p0 + b) * S::KPP + kq;
        if (p0 + b < S::PASSES && i < n) es[g * S::CHUNK + i] = acc[k] * scale;
      }
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k)
#pragma unroll
        for (int o = static_cast<int>(S::LPK) / 2; o > 0; o >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
      if (li == 0)
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const long long b = k / G, g = k % G, i = (p0 + b) * S::KPP + kq;
          if (p0 + b < S::PASSES && i < n) es[g * S::CHUNK + i] = acc[k] * scale;
        }
    }
  }
  __syncthreads();

  // Per head: the chunk's max and sum of exp(s - max); an empty chunk has m = -inf, l = 0.
  for (long long g = warp; g < G; g += S::WARPS) {
    float* row = es + g * S::CHUNK;
    float mx = neg_inf();
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, row[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float e = expf(row[i] - mx);
      row[i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      part[g] = mx;
      part[G + g] = sum;
    }
  }
  __syncthreads();

  // o_c, a V tile at a time: each thread over its keys, in key order, its columns weighted by each head's e.
  float acc_o[G][S::CPL][S::E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < S::CPL; ++j)
#pragma unroll
      for (int x = 0; x < S::E; ++x) acc_o[g][j][x] = 0.0f;
#pragma unroll(S::TILES <= 4 ? S::TILES : 1)
  for (int tile = 0; tile < S::TILES; ++tile) {
    copy_async_wait<S::STAGES - 1>();
    const uint4* vt = ring + ((S::TILES + tile) % S::STAGES) * S::TILE_SLOTS;
#pragma unroll
    for (int b = 0; b < S::TP; ++b) {
      const long long pass = tile * S::TP + b, i = pass * S::KPP + kq;
      if (pass >= S::PASSES || i >= n) break;
#pragma unroll
      for (int j = 0; j < S::CPL; ++j) {
        if (li + j * S::LPK >= S::KC) continue;
        float v[S::E];
        unpack<S::E>(vt[(b * S::CPL + j) * S::THREADS + tid], v);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float e = es[g * S::CHUNK + i];
#pragma unroll
          for (int x = 0; x < S::E; ++x) acc_o[g][j][x] += e * v[x];
        }
      }
    }
    issue(S::TILES + tile + S::STAGES);
  }
  __syncthreads();  // os overwrites the ring: every thread is done with its last V tile

  // o_c: the key lanes of a warp (xor over the kq bits inside the warp), then the warps in order.
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < S::CPL; ++j)
#pragma unroll
      for (int x = 0; x < S::E; ++x)
#pragma unroll
        for (int o = 16; o >= static_cast<int>(S::LPK); o >>= 1)
          acc_o[g][j][x] += __shfl_xor_sync(0xffffffffu, acc_o[g][j][x], o);
  if (lane < S::LPK)
#pragma unroll
    for (int j = 0; j < S::CPL; ++j) {
      const long long ch = li + j * S::LPK;
      if (ch >= S::KC) continue;
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int x = 0; x < S::E; ++x) os[(warp * G + g) * HD + ch * S::E + x] = acc_o[g][j][x];
    }
  __syncthreads();
  for (long long e = tid; e < G * HD; e += S::THREADS) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < S::WARPS; ++w) sum += os[w * G * HD + e];
    part[2 * G + e] = sum;
  }

  bf16* o = p.o + (r * Cfg::HEADS + kvh * G) * HD;
  if constexpr (SPLIT == 1) {
    __syncthreads();
    for (long long e = tid; e < G * HD; e += S::THREADS) {
      const float l1 = part[G + e / HD];
      o[e] = to_bf16(l1 > 0.0f ? part[2 * G + e] / l1 : 0.0f);
    }
  } else {
    cluster_barrier();  // every chunk's partial is complete and visible to the cluster
    // Each head's chunk weights, computed by every thread that needs them (SPLIT peers' m and l).
    for (long long e = c + SPLIT * tid; e < G * HD; e += SPLIT * S::THREADS) {
      const long long g = e / HD;
      float mc[SPLIT], mx = neg_inf();
#pragma unroll
      for (int cc = 0; cc < SPLIT; ++cc) {
        mc[cc] = load_peer(part + g, cc);
        mx = fmaxf(mx, mc[cc]);
      }
      float sum = 0.0f, lsum = 0.0f;
#pragma unroll
      for (int cc = 0; cc < SPLIT; ++cc) {
        const float w = mc[cc] == neg_inf() ? 0.0f : expf(mc[cc] - mx);
        sum += load_peer(part + 2 * G + e, cc) * w;
        lsum += load_peer(part + G + g, cc) * w;
      }
      o[e] = to_bf16(lsum > 0.0f ? sum / lsum : 0.0f);
    }
    cluster_barrier();  // peers may still be reading this CTA's partial
  }
}

}  // namespace kernels
}  // namespace tfe
