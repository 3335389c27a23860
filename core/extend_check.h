// The host-side checks of a whole extend call and of a draft's first ranks, shared by the CPU reference and
// the GPU runtime so that both refuse the same calls with the same messages.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

#include <tfe/draft.h>
#include <tfe/header.h>
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

// The highest rank a draft's first step may take on a head of `header`: kMaxFirstRank, below draft_vocab.
int max_first_rank(const HeadHeader& header);
// A draft's first_ranks (empty: every slot its best): one a slot, each 0..max_first_rank, and above 0 only
// for a dense head (a two_stage head drafts its best token only). `call` begins the message.
void check_first_ranks(std::string_view call, std::span<const int> first_ranks, size_t slots, const HeadHeader& header);

}  // namespace tfe
