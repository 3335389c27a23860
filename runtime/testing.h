// Hooks for tests and measurement, apart from the engine's API (<tfe/runtime.h> does not include this):
// opening with test hooks (knock-out, forced dependent launch, binding checks, the tuning, lazy capture, the
// graph cache's capacity, the L2 set-aside, injected faults; TestHooks in runtime/impl.h), the plan a runtime
// runs, and peeks into its buffers. Not installed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tfe/runtime.h>

#include "plan/plan.h"
#include "runtime/impl.h"

namespace tfe::testing {

using Hooks = TestHooks;

Runtime open(const std::string& head_path, const OpenOptions& options, const Hooks& hooks);
Runtime open(const HeadFile& file, const OpenOptions& options, const Hooks& hooks);

// The plan the runtime runs.
const Plan& plan(const Runtime& rt);

// A host copy of a buffer of the arena (state, table, activation or output) or of the host arena, taken
// after the stream is idle.
std::vector<std::byte> read_buffer(const Runtime& rt, std::string_view name);
// Fills a buffer with one byte value (e.g. 0xFF: NaN in bf16 and fp32) to prove that a pass writes what
// it is said to: a host-arena buffer once the stream is idle, an arena buffer in stream order.
void fill_buffer(Runtime& rt, std::string_view name, uint8_t byte);

// Makes the runtime's next call that does device work fail as a CUDA call returning `error` would: that call
// throws CudaError, and every later call is refused, naming it (<tfe/runtime.h>).
void inject_cuda_error(Runtime& rt, cudaError_t error);

// What the self-check at open compared (OpenOptions::self_check); cases 0 where it did not run.
const SelfCheckReport& self_check_report(const Runtime& rt);

}  // namespace tfe::testing
