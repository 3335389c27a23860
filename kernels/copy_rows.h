// copy_rows's description (kernels/kernel_def.h); the kernel is kernels/copy_rows.cuh.
#pragma once
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// copy_rows's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(CopyRowsConstants, "copy_rows", WIDTH, THREADS);

// dst[dst_index ? dst_index[r] : r] = src[src_index ? src_index[r] : r], WIDTH bf16 per row. One CTA of
// THREADS per row.
inline KernelDef copy_rows() {
  // An index table: rows ids when bound. The rows it indexes: as many as its ids may name, else rows.
  const auto index = [](std::string_view param) -> ReachFn {
    return [param](const KernelSpec&, const Reach& r) { return r.index_rows(param) ? product({r.rows, kI32}) : 0; };
  };
  const auto rows = [](std::string_view index_param) -> ReachFn {
    return [index_param](const KernelSpec& s, const Reach& r) {
      const int64_t ids = r.index_rows(index_param);
      return product({ids ? ids : r.rows, s.constant("WIDTH"), kBf16});
    };
  };
  return {
      .name = "copy_rows",
      .source = "copy_rows.cuh",
      .function = "tfe::kernels::copy_rows",
      .constants = CopyRowsConstants::names(),
      .params = {in("src", DType::BF16, rows("src_index")), in("src_index", DType::I32, index("src_index")),
                 out("dst", DType::BF16, rows("dst_index")), in("dst_index", DType::I32, index("dst_index")),
                 i64("rows")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {rows, 1, 1}, .block = s.constant("THREADS"), .rows_axis = 0};
          },
  };
}

}  // namespace tfe::kernel_desc
