// rescore (kernels/rescore.cuh): its block, which the kernel and its launch shape both read here, then, for
// the host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kRescoreWarps = 4;  // candidates a CTA, a warp each

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// rescore's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(RescoreConstants, "rescore", HIDDEN, CAND_K, WEIGHT, MAX_STEPS);

// two_stage: exact fp32 logits target_head[d2t(c)] . n of the candidates into exact, in candidate order;
// the last CTA of a row to arrive (a ticket in `arrivals`) takes their argmax (ties: lower target id) and
// softmax confidence, and writes like top1. Grid (ceil(CAND_K / kRescoreWarps), rows).
inline KernelDef rescore() {
  const auto fp8 = [](const KernelSpec& s) { return s.constant("WEIGHT") == kc::kWeightFP8; };
  const DTypeFn weight_dtype = [=](const KernelSpec& s) { return fp8(s) ? DType::F8_E4M3 : DType::BF16; };
  const ReachFn rows_i32 = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn candidates = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("CAND_K"), kI32});
  };
  const ReachFn steps = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("MAX_STEPS"), kI32});
  };
  return {
      .name = "rescore",
      .source = "rescore.cuh",
      .function = "tfe::kernels::rescore",
      .constants = RescoreConstants::names(),
      .params = {weights(in("target_head", weight_dtype,
                            [=](const KernelSpec& s, const Reach& r) {
                              return product({r.vocab, s.constant("HIDDEN"), fp8(s) ? 1 : kBf16});
                            })),
                 weights(in("scale", DType::F32,
                            [=](const KernelSpec& s, const Reach& r) {
                              return fp8(s) ? product({r.vocab, kF32}) : 0;
                            })),
                 in("n", DType::BF16,
                    [](const KernelSpec& s, const Reach& r) {
                      return product({r.rows, s.constant("HIDDEN"), kBf16});
                    }),
                 in("cand", DType::I32, candidates),
                 weights(in("d2t", DType::I32,
                            [](const KernelSpec&, const Reach& r) {
                              return product({r.draft_vocab, kI32});
                            })),
                 out("exact", DType::F32, candidates), out("arrivals", DType::I32, rows_i32),
                 output(out("out_token", DType::I32, steps)), output(out("out_conf", DType::F32, steps)),
                 out("next_token", DType::I32, rows_i32), i64("step"), i64("rows")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {kernels::ceil_div(s.constant("CAND_K"), kernels::kRescoreWarps), rows, 1},
                               .block = 32 * kernels::kRescoreWarps,
                               .rows_axis = 1};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
