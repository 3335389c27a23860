// store_outputs (kernels/store_outputs.cuh): its block, which the kernel and its launch shape both read
// here, then, for the host only, its description (kernels/kernel_def.h).
#pragma once
#include "constants.h"

namespace tfe {
namespace kernels {

constexpr int kStoreOutputsThreads = 128;

}  // namespace kernels
}  // namespace tfe

#ifndef __CUDACC__
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// store_outputs's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(StoreOutputsConstants, "store_outputs", MAX_STEPS);

// The draft pass's last node: out_token / out_conf [rows, MAX_STEPS] copied into host memory (host_token /
// host_conf), where the host reads them once host_done, set last, is 1. One CTA, striding over the entries.
inline KernelDef store_outputs() {
  const ReachFn table = [](const KernelSpec& s, const Reach& r) {
    return product({r.rows, s.constant("MAX_STEPS"), kI32});
  };
  return {
      .name = "store_outputs",
      .source = "store_outputs.cuh",
      .function = "tfe::kernels::store_outputs",
      .constants = StoreOutputsConstants::names(),
      .params = {output(in("out_token", DType::I32, table)), output(in("out_conf", DType::F32, table)),
                 host(out("host_token", DType::I32, table)), host(out("host_conf", DType::F32, table)),
                 host(out("host_done", DType::I32, [](const KernelSpec&, const Reach&) { return kI32; })),  // one word
                 i64("rows")},
      .launch = [](const KernelSpec&, int64_t) { return LaunchShape{.block = kernels::kStoreOutputsThreads}; },
  };
}

}  // namespace tfe::kernel_desc
#endif
