// topk (kernels/topk.cuh): its block, which the kernel and its launch shape both read here, then, for the
// host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kTopkThreads = 512;

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// topk's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(TopkConstants, "topk", VOCAB, CAND_K, SPLIT);

// two_stage candidates: the CAND_K highest scores of a row (ties: lower id) as draft ids ascending, into
// cand. One cluster of SPLIT <= 8 CTAs per row splits the row's scores; the CTAs agree on the selection
// through distributed shared memory.
inline KernelDef topk() {
  return {
      .name = "topk",
      .source = "topk.cuh",
      .function = "tfe::kernels::topk",
      .constants = TopkConstants::names(),
      .params = {in("scores", DType::F32,
                    [](const KernelSpec& s, const Reach& r) {
                      return product({r.rows, s.constant("VOCAB"), kF32});
                    }),
                 out("cand", DType::I32,
                     [](const KernelSpec& s, const Reach& r) {
                       return product({r.rows, s.constant("CAND_K"), kI32});
                     }),
                 i64("rows")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {s.constant("SPLIT"), rows, 1}, .block = kernels::kTopkThreads, .rows_axis = 1};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
