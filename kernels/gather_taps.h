// gather_taps's description (kernels/kernel_def.h); the kernel is kernels/gather_taps.cuh.
#pragma once
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// gather_taps's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(GatherTapsConstants, "gather_taps", WIDTH, THREADS);

// An extend chunk of device rows: taps[r] = WIDTH bf16 at address row_taps_src[r], row_tok[r] = the int32
// at row_tok_src[r] (a token outside 0..vocab-1 becomes 0 and is recorded in `error`). One CTA of THREADS
// per row. The source addresses are the caller's device memory, checked by the runtime, not the plan.
inline KernelDef gather_taps() {
  const ReachFn addresses = [](const KernelSpec&, const Reach& r) { return product({r.rows, int64_t{8}}); };
  const ReachFn table = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  return {
      .name = "gather_taps",
      .source = "gather_taps.cuh",
      .function = "tfe::kernels::gather_taps",
      .constants = GatherTapsConstants::names(),
      .params = {in("row_taps_src", DType::I64, addresses), in("row_tok_src", DType::I64, addresses),
                 out("taps", DType::BF16,
                     [](const KernelSpec& s, const Reach& r) {
                       return product({r.rows, s.constant("WIDTH"), kBf16});
                     }),
                 out("row_tok", DType::I32, table), in("row_slot", DType::I32, table),
                 host(out("error", DType::I64, [](const KernelSpec&, const Reach&) { return int64_t{8}; })),
                 i64("rows"), i64("vocab")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {rows, 1, 1}, .block = s.constant("THREADS"), .rows_axis = 0};
          },
  };
}

}  // namespace tfe::kernel_desc
