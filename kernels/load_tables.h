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

// load_tables's specialization constants, in its config's order.
// RANKS: 1 where the plan has first_ranks (ranks and rank are then bound), else 0.
TFE_KERNEL_CONSTANTS(LoadTablesConstants, "load_tables", RANKS);

// The draft pass's first node: each row's slot id (host_tables in host memory, or draft_slots in the
// arena), then that slot's state (slot_state), into the four arena tables; with first_ranks, each row's
// rank (host_ranks or draft_ranks; ranks and rank null without) into `rank`. One CTA.
inline KernelDef load_tables() {
  const ReachFn table = [](const KernelSpec&, const Reach& r) { return product({r.rows, kI32}); };
  const ReachFn rank_table = [](const KernelSpec& s, const Reach& r) {
    return s.constant("RANKS") ? product({r.rows, kI32}) : 0;
  };
  return {
      .name = "load_tables",
      .source = "load_tables.cuh",
      .function = "tfe::kernels::load_tables",
      .constants = LoadTablesConstants::names(),
      .params = {bound_to_any(role_bit(BufferRole::host) | role_bit(BufferRole::input), in("ids", DType::I32, table)),
                 bound_to_any(role_bit(BufferRole::host) | role_bit(BufferRole::input),
                              in("ranks", DType::I32, rank_table)),
                 state(in(
                     "slot_state", DType::I32,
                     [](const KernelSpec&, const Reach& r) {
                       return product({r.slots, kc::kSlotStateColumns, kI32});
                     },
                     kc::kSlotStateColumns * kI32)),  // a slot's state is one 16-byte load
                 out("slot", DType::I32, table), out("pos", DType::I32, table), out("first_pos", DType::I32, table),
                 out("tok", DType::I32, table), out("rank", DType::I32, rank_table),
                 host(out("error", DType::I64, [](const KernelSpec&, const Reach&) { return int64_t{8}; })),
                 i64("rows"), i64("max_slots"), i64("max_rank")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            if (rows > kernels::kLoadTablesThreads)
              fail("launch_shape {}: rows is {}; load_tables fills at most {} rows", s.uri(), rows,
                   kernels::kLoadTablesThreads);
            return LaunchShape{.block = kernels::kLoadTablesThreads};
          },
  };
}

}  // namespace tfe::kernel_desc
#endif
