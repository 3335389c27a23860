// keep_state's description (kernels/kernel_def.h); the kernel is kernels/keep_state.cuh.
#pragma once
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// keep_state's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(KeepStateConstants, "keep_state");

// slot_state[last_slot[i]] = {row_pos[r], last_first[i], row_tok[r], 1} with r = last_row[i], for each slot
// an extend chunk touched. A thread a slot, in CTAs of kKeepStateThreads.
inline KernelDef keep_state() {
  const ReachFn table = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn by_row = [](const KernelSpec&, const Reach& r) { return product({r.index_rows("last_row"), kI32}); };
  return {
      .name = "keep_state",
      .source = "keep_state.cuh",
      .function = "tfe::kernels::keep_state",
      .constants = KeepStateConstants::names(),
      .params = {in("last_row", DType::I32, table), in("last_slot", DType::I32, table),
                 in("last_first", DType::I32, table), in("row_pos", DType::I32, by_row),
                 in("row_tok", DType::I32, by_row),
                 state(out("slot_state", DType::I32,
                           [](const KernelSpec&, const Reach& r) {
                             return product({r.slots, kc::kSlotStateColumns, kI32});
                           })),
                 i64("rows")},
      .launch =
          [](const KernelSpec&, int64_t) {
            return LaunchShape{.block = kc::kKeepStateThreads, .rows_axis = 0, .rows_per_block = kc::kKeepStateThreads};
          },
  };
}

}  // namespace tfe::kernel_desc
