// ring_attention (kernels/ring_attention.cuh): its block and shared-memory layout, which the kernel
// (AttnShape) and its launch shape both compute here, then, for the host only, its description
// (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kAttnThreads = 128;

// A CTA's share of the window and its shared memory: the ring of K/V tiles (reused for the per-warp
// partial outputs), the chunk's scores and the chunk's partial for the join.
struct AttnGeometry {
  long long g = 0;      // query heads of a kv head
  long long keys = 0;   // WINDOW + 1
  long long chunk = 0;  // keys per CTA
  long long e = 0;      // K / V elements per load (16 or 4 bytes)
  long long kc = 0;     // loads per K or V row
  long long lpk = 0;    // lanes per key (a power of two)
  long long cpl = 0;    // loads per lane per row
  long long kpp = 0;    // keys per pass
  long long passes = 0;
  long long tp = 0;          // passes a tile
  long long tiles = 0;       // K tiles; as many V tiles follow
  long long tile_slots = 0;  // 16-byte slots of one tile
  long long stages = 0;      // tiles in flight
  long long part = 0;        // one partial: m[G], l[G], o_c[G][HD]
  // Float offsets into dynamic shared memory, and its size: the per-warp outputs (at o_at) reuse the ring
  // once the last V tile is read.
  long long ring_floats = 0, o_at = 0, e_at = 0, p_at = 0, smem_floats = 0;
};

TFE_HOST_DEVICE constexpr AttnGeometry attn_geometry(long long HEADS, long long KV_HEADS, long long HEAD_DIM,
                                                     long long WINDOW, long long SPLIT) {
  AttnGeometry a;
  a.g = HEADS / KV_HEADS;
  a.keys = WINDOW + 1;
  a.chunk = ceil_div(a.keys, SPLIT);
  a.e = HEAD_DIM % 8 == 0 ? 8 : 2;
  a.kc = HEAD_DIM / a.e;
  a.lpk = min_ll(32, pow2_at_least(a.kc));
  a.cpl = ceil_div(a.kc, a.lpk);
  a.kpp = kAttnThreads / a.lpk;
  a.passes = ceil_div(a.chunk, a.kpp);
  // 8 passes a tile, or 4 where a lane's G query heads times E elements exceed 32 (a tile's scores are
  // TP * G registers a lane; 8 per GQA group at HEAD_DIM 256 would spill).
  a.tp = min_ll(a.passes, a.g * a.e > 32 ? 4 : 8);
  a.tiles = ceil_div(a.passes, a.tp);
  a.tile_slots = a.tp * a.cpl * kAttnThreads;
  // Every tile of the chunk where it is short, else as many as 32 KB holds (at least 2). 32 KB leaves five
  // CTAs an SM (with the scores and the partial, about 36 KB a CTA at 128 keys).
  a.stages = min_ll(2 * a.tiles, max_ll(2, (32 * 1024) / (a.tile_slots * 16)));
  a.part = a.g * (HEAD_DIM + 2);
  a.ring_floats = max_ll(a.stages * a.tile_slots * 4, (kAttnThreads / 32) * a.g * HEAD_DIM);
  a.o_at = 0;
  a.e_at = a.ring_floats;
  a.p_at = a.e_at + a.g * a.chunk;
  a.smem_floats = a.p_at + a.part;
  return a;
}

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// ring_attention's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(RingAttentionConstants, "ring_attention", HEADS, KV_HEADS, HEAD_DIM, WINDOW, RING, SPLIT);

// One query row per slot against keys max(first_pos, p - WINDOW) .. p of the slot's ring; GQA.
// first_pos[r] is the slot's first real position: a slot attached mid-sequence has no keys before it.
// The window is cut into SPLIT <= 8 key chunks, a CTA each, one cluster per (kv head, row) that joins
// its chunks' partials through distributed shared memory: grid (KV_HEADS x SPLIT, rows), grid.x a multiple
// of the cluster size SPLIT, which the kernel declares.
inline KernelDef ring_attention() {
  const ReachFn rows_i32 = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn heads = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("HEADS"), s.constant("HEAD_DIM"), kBf16});
  };
  const ReachFn ring = [](const KernelSpec& s, const Reach& r) {
    return product({r.slots, s.constant("RING"), s.constant("KV_HEADS"), s.constant("HEAD_DIM"), kBf16});
  };
  return {
      .name = "ring_attention",
      .source = "ring_attention.cuh",
      .function = "tfe::kernels::ring_attention",
      .constants = RingAttentionConstants::names(),
      .params = {in("q", DType::BF16, heads), state(in("ring_k", DType::BF16, ring)),
                 state(in("ring_v", DType::BF16, ring)), in("slot", DType::I32, rows_i32),
                 in("pos", DType::I32, rows_i32), in("first_pos", DType::I32, rows_i32), i64("pos_offset"),
                 out("o", DType::BF16, heads), i64("rows"), f32("scale")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            const kernels::AttnGeometry a =
                kernels::attn_geometry(s.constant("HEADS"), s.constant("KV_HEADS"), s.constant("HEAD_DIM"),
                                       s.constant("WINDOW"), s.constant("SPLIT"));
            return LaunchShape{.grid = {s.constant("KV_HEADS") * s.constant("SPLIT"), rows, 1},
                               .block = kernels::kAttnThreads,
                               .smem = 4 * a.smem_floats,
                               .rows_axis = 1};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
