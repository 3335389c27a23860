// top1 (kernels/top1.cuh): its block, which the kernel and its launch shape both read here, then, for the
// host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kTop1Threads = 256;

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// top1's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(Top1Constants, "top1", VOCAB, COLS, MAX_STEPS);

// Vocabulary top-1 and its softmax confidence: one CTA per row joins the row's PARTS = ceil(VOCAB / COLS)
// Top1Part records in `part`, which the lm_head gemv (EPILOGUE kc::kEpilogueTop1, the same COLS) left, one
// per CTA and row; writes the target id (d2t) and confidence of `step` into out_token/out_conf [rows,
// MAX_STEPS], and the target id into next_token[r].
inline KernelDef top1() {
  const ReachFn steps = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("MAX_STEPS"), kI32});
  };
  return {
      .name = "top1",
      .source = "top1.cuh",
      .function = "tfe::kernels::top1",
      .constants = Top1Constants::names(),
      .params = {in("part", DType::F32,
                    [](const KernelSpec& s, const Reach& r) {  // the lm_head gemv's records
                      const int64_t parts = kernels::ceil_div(s.constant("VOCAB"), s.constant("COLS"));
                      return product({r.rows, parts, kc::kTop1PartBytes});
                    }),
                 weights(in("d2t", DType::I32,
                            [](const KernelSpec&, const Reach& r) {
                              return product({r.draft_vocab, kI32});
                            })),
                 output(out("out_token", DType::I32, steps)), output(out("out_conf", DType::F32, steps)),
                 out("next_token", DType::I32,
                     [](const KernelSpec&, const Reach& r) {
                       return product({r.rows, kI32});
                     }),
                 i64("step"), i64("rows")},
      .launch =
          [](const KernelSpec&, int64_t rows) {
            return LaunchShape{.grid = {rows, 1, 1}, .block = kernels::kTop1Threads, .rows_axis = 0};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
