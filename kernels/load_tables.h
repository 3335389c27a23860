// load_tables (kernels/load_tables.cuh): its block, which the kernel and its launch shape both read here,
// then, for the host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kLoadTablesThreads = 128;  // a row a thread: the most rows a launch copies

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "core/error.h"
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// The draft pass's first node: the call's tables (host_tables [rows <= 128, 4], a row's slot, pos,
// first_pos and tok side by side) from host memory, where the host wrote them, into the four arena tables.
// One CTA.
inline KernelDef load_tables() {
  const ReachFn table = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  return {
      .name = "load_tables",
      .source = "load_tables.cuh",
      .function = "tfe::kernels::load_tables",
      .constants = {},
      .params = {host(in(
                     "host_tables", DType::I32,
                     [](const KernelSpec&, const Reach& r) {
                       return product({r.rows, kc::kHostTableColumns, kI32});
                     },
                     kc::kHostTableColumns * kI32)),  // a row is one 16-byte load
                 out("slot", DType::I32, table), out("pos", DType::I32, table), out("first_pos", DType::I32, table),
                 out("tok", DType::I32, table), i64("rows")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            if (rows > kernels::kLoadTablesThreads)
              fail("launch_shape {}: rows is {}; load_tables copies at most {} rows a table", s.uri(), rows,
                   kernels::kLoadTablesThreads);
            return LaunchShape{.block = kernels::kLoadTablesThreads};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
