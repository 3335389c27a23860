// rmsnorm's description (kernels/kernel_def.h); the kernel is kernels/rmsnorm.cuh.
#pragma once
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// rmsnorm's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(RmsnormConstants, "rmsnorm", WIDTH, THREADS);

// y[r] = rms(x[r]) with weights w; y may alias x. One CTA of THREADS per row.
inline KernelDef rmsnorm() {
  // rows rows of WIDTH bf16, `stride` elements apart: up to the end of the last.
  const auto strided_rows = [](std::string_view stride) -> ReachFn {
    return [stride](const KernelSpec& s, const Reach& r) -> int64_t {
      if (r.rows < 1) return 0;
      const int64_t last = product({r.rows - 1, r.i64(stride)});
      return product({saturating_add(last, s.constant("WIDTH")), kBf16});
    };
  };
  return {
      .name = "rmsnorm",
      .source = "rmsnorm.cuh",
      .function = "tfe::kernels::rmsnorm",
      .constants = RmsnormConstants::names(),
      .params = {in("x", DType::BF16, strided_rows("x_stride")), i64("x_stride"),
                 weights(in("w", DType::BF16,
                            [](const KernelSpec& s, const Reach&) {
                              return product({s.constant("WIDTH"), kBf16});
                            })),
                 out("y", DType::BF16, strided_rows("y_stride")), i64("y_stride"), i64("rows"), f32("eps")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {rows, 1, 1}, .block = s.constant("THREADS"), .rows_axis = 0};
          },
  };
}

}  // namespace tfe::kernel_desc
