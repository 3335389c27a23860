// The host-side check of a whole extend call, shared by the CPU reference and the GPU runtime so that both
// refuse the same calls with the same messages.
#pragma once
#include <cstdint>
#include <span>

#include <tfe/draft.h>
#include <tfe/slots.h>

namespace tfe {

// Checks a whole extend call before anything changes: one request per slot, then each request against the
// slot table (SlotTable::check_extend) and its taps against `row_width` = T * Ht values a row. Shared by
// the CPU reference and the GPU runtime so that both refuse the same calls with the same messages.
void check_extend_requests(const SlotTable& slots, std::span<const ExtendRequest> requests, int64_t row_width);
// The same for rows in device memory: positions on the host (SlotTable::check_rows); the pointers must be
// set and the stride hold a row. The runtime checks that the pointers are its device's memory; the
// tokens' values are checked on the device.
void check_extend_requests(const SlotTable& slots, std::span<const DeviceExtendRequest> requests, int64_t row_width);

// The policy for non-finite taps (docs/runtime.md): off by default, at no cost; when checks are on
// (ReferenceOptions::check_taps, the runtime's self-check: OpenOptions::self_check or TFE_CHECK=1) a host
// extend holding a NaN or an infinity in its taps is refused naming the slot, the row, its position and
// the value's index, before anything changes. Run after check_extend_requests (the sizes are checked).
void check_finite_taps(std::span<const ExtendRequest> requests, int64_t row_width);

}  // namespace tfe
