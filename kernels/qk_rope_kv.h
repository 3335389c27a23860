// qk_rope_kv (kernels/qk_rope_kv.cuh): its block, which the kernel and its launch shape both read here,
// then, for the host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kQkRopeKvWarps = 4;  // heads a CTA, a warp each

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// qk_rope_kv's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(QkRopeKvConstants, "qk_rope_kv", HEADS, KV_HEADS, HEAD_DIM, QK_NORM, RING, WRITE_Q);

// qk_norm (if QK_NORM), RoPE at pos[r] + pos_offset, K/V written to the slot's ring row (pos mod RING); q
// written to q_out when WRITE_Q. Input rows: [q | k | v] if WRITE_Q else [k | v]. Grid (ceil(in_heads /
// kQkRopeKvWarps), rows): a warp per head (q, then k, then v).
inline KernelDef qk_rope_kv() {
  const auto write_q = [](const KernelSpec& s) { return s.constant("WRITE_Q") != 0; };
  const ReachFn rows_i32 = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn norm = [](const KernelSpec& s, const Reach&) {
    return s.constant("QK_NORM") ? product({s.constant("HEAD_DIM"), kBf16}) : 0;
  };
  const ReachFn inv_freq = [](const KernelSpec& s, const Reach&) {
    return product({s.constant("HEAD_DIM") / 2, kF32});
  };
  const ReachFn ring = [](const KernelSpec& s, const Reach& r) {
    return product({r.slots, s.constant("RING"), s.constant("KV_HEADS"), s.constant("HEAD_DIM"), kBf16});
  };
  return {
      .name = "qk_rope_kv",
      .source = "qk_rope_kv.cuh",
      .function = "tfe::kernels::qk_rope_kv",
      .constants = QkRopeKvConstants::names(),
      .params = {in("qkv", DType::BF16,
                    [=](const KernelSpec& s, const Reach& r) {
                      const int64_t heads = (write_q(s) ? s.constant("HEADS") : 0) + 2 * s.constant("KV_HEADS");
                      return product({r.rows, heads, s.constant("HEAD_DIM"), kBf16});
                    }),
                 weights(in("q_norm", DType::BF16, norm)), weights(in("k_norm", DType::BF16, norm)),
                 weights(in("inv_freq", DType::F32, inv_freq)), in("slot", DType::I32, rows_i32),
                 in("pos", DType::I32, rows_i32), i64("pos_offset"),
                 out("q_out", DType::BF16,
                     [=](const KernelSpec& s, const Reach& r) {
                       return write_q(s) ? product({r.rows, s.constant("HEADS"), s.constant("HEAD_DIM"), kBf16}) : 0;
                     }),
                 state(out("ring_k", DType::BF16, ring)), state(out("ring_v", DType::BF16, ring)), i64("rows"),
                 f32("eps")},
      .launch =
          [=](const KernelSpec& s, int64_t rows) {
            const int64_t in_heads = (write_q(s) ? s.constant("HEADS") : 0) + 2 * s.constant("KV_HEADS");
            return LaunchShape{.grid = {kernels::ceil_div(in_heads, kernels::kQkRopeKvWarps), rows, 1},
                               .block = 32 * kernels::kQkRopeKvWarps,
                               .rows_axis = 1};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
