// ranked (kernels/ranked.cuh): its block, which the kernel and its launch shape both read here, then, for
// the host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kRankedThreads = 256;

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// ranked's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(RankedConstants, "ranked", VOCAB, MAX_STEPS);

// Step 1 of a plan with first_ranks: one CTA per row takes, of the row's VOCAB fp32 logits, the one of the
// row's rank (`rank`, which load_tables filled) and its softmax confidence; writes the target id (d2t) and
// confidence of `step` into out_token/out_conf [rows, MAX_STEPS], and the target id into next_token[r].
inline KernelDef ranked() {
  const ReachFn steps = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("MAX_STEPS"), kI32});
  };
  const ReachFn table = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  return {
      .name = "ranked",
      .source = "ranked.cuh",
      .function = "tfe::kernels::ranked",
      .constants = RankedConstants::names(),
      .params = {in("logits", DType::F32,
                    [](const KernelSpec& s, const Reach& r) {
                      return product({r.rows, s.constant("VOCAB"), kF32});
                    }),
                 in("rank", DType::I32, table),
                 weights(in("d2t", DType::I32,
                            [](const KernelSpec&, const Reach& r) {
                              return product({r.draft_vocab, kI32});
                            })),
                 output(out("out_token", DType::I32, steps)), output(out("out_conf", DType::F32, steps)),
                 out("next_token", DType::I32, table), i64("step"), i64("rows")},
      .launch =
          [](const KernelSpec&, int64_t rows) {
            return LaunchShape{.grid = {rows, 1, 1}, .block = kernels::kRankedThreads, .rows_axis = 0};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
