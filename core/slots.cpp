// SlotTable (<tfe/slots.h>) and the extend call's check: the host-side state model that the CPU
// reference and the GPU runtime share.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/extend_check.h"
#include <tfe/slots.h>

namespace tfe {

namespace {
template <typename Request>
void check_one_per_slot(std::span<const Request> requests) {
  for (size_t i = 0; i < requests.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (requests[j].slot == requests[i].slot)
        fail("extend: slot {} appears in requests[{}] and requests[{}] (one request per slot and call)",
             requests[i].slot, j, i);
}
}  // namespace

void check_extend_requests(const SlotTable& slots, std::span<const DeviceExtendRequest> requests, int64_t row_width) {
  check_one_per_slot(requests);
  for (const auto& r : requests) {
    slots.check_rows(r.slot, r.first_pos, r.n_rows);
    if (!r.taps) fail("extend of slot {}: taps is null", r.slot);
    if (!r.tokens) fail("extend of slot {}: tokens is null", r.slot);
    if (r.taps_stride != 0 && r.taps_stride < row_width)
      fail("extend of slot {}: taps_stride = {} is below a row's {} values (T x Ht)", r.slot, r.taps_stride, row_width);
    // The last row's address, taps + (n_rows - 1) * stride values, must be a byte offset that int64 holds.
    const int64_t max_stride = std::numeric_limits<int64_t>::max() / int64_t{sizeof(bf16_bits)} / r.n_rows;
    if (r.taps_stride > max_stride)
      fail("extend of slot {}: taps_stride = {} values puts {} rows past any address (at most {})", r.slot,
           r.taps_stride, r.n_rows, max_stride);
  }
}

void check_extend_requests(const SlotTable& slots, std::span<const ExtendRequest> requests, int64_t row_width) {
  check_one_per_slot(requests);
  for (const auto& r : requests) {
    slots.check_extend(r.slot, r.first_pos, r.n_rows, r.tokens);
    if (static_cast<int64_t>(r.taps.size()) != r.n_rows * row_width)
      fail("extend of slot {}: {} tap values for {} rows of {} values (= {})", r.slot, r.taps.size(), r.n_rows,
           row_width, r.n_rows * row_width);
  }
}

void check_finite_taps(std::span<const ExtendRequest> requests, int64_t row_width) {
  for (const auto& r : requests)
    for (size_t i = 0; i < r.taps.size(); ++i)
      if ((r.taps[i] & 0x7F80) == 0x7F80) {  // bf16 exponent all ones: an infinity or a NaN
        const int64_t row = static_cast<int64_t>(i) / row_width;
        fail(
            "extend of slot {}: taps row {} (position {}) holds {} at value {} of the row; non-finite taps are "
            "refused while checks are on (this call changed nothing)",
            r.slot, row, r.first_pos + row, (r.taps[i] & 0x7F) != 0 ? "NaN" : "an infinity",
            static_cast<int64_t>(i) % row_width);
      }
}

int max_first_rank(const HeadHeader& header) {
  return static_cast<int>(std::min<int64_t>(kMaxFirstRank, header.draft_vocab - 1));
}

void check_first_ranks(std::string_view call, std::span<const int> first_ranks, size_t slots,
                       const HeadHeader& header) {
  if (first_ranks.empty()) return;
  if (first_ranks.size() != slots)
    fail("{}: first_ranks has {} entries for {} slots (one a slot, or none)", call, first_ranks.size(), slots);
  const int highest = max_first_rank(header);
  for (size_t i = 0; i < first_ranks.size(); ++i) {
    if (first_ranks[i] < 0 || first_ranks[i] > highest)
      fail("{}: first_ranks[{}] = {} is outside 0..{} (kMaxFirstRank = {}, draft_vocab = {})", call, i, first_ranks[i],
           highest, kMaxFirstRank, header.draft_vocab);
    if (first_ranks[i] > 0 && header.head_type != HeadType::dense)
      fail("{}: first_ranks[{}] = {}: a two_stage head drafts its best token only", call, i, first_ranks[i]);
  }
}

SlotTable::SlotTable(const SlotLimits& limits) : limits_(limits) {
  if (limits.max_slots < 1) fail("slot table: max_slots = {} must be >= 1", limits.max_slots);
  if (limits.max_steps < 1) fail("slot table: max_steps = {} must be >= 1", limits.max_steps);
  if (limits.window < 1) fail("slot table: window = {} must be >= 1", limits.window);
  if (limits.ring_rows < ring_rows(limits.window, limits.max_steps))
    fail("slot table: ring_rows = {} is below window + 1 + max_steps = {}", limits.ring_rows,
         ring_rows(limits.window, limits.max_steps));
  if (limits.vocab < 1) fail("slot table: vocab = {} must be >= 1", limits.vocab);
  if (limits.max_streams < 1) fail("slot table: max_streams = {} must be >= 1", limits.max_streams);
  slots_.resize(static_cast<size_t>(limits.max_slots));
}

void SlotTable::check_slot(int slot) const {
  if (slot < 0 || slot >= limits_.max_slots)
    fail("slot {} is outside 0..{} (max_slots = {})", slot, limits_.max_slots - 1, limits_.max_slots);
}

const SlotTable::State& SlotTable::filled(int slot) const {
  check_slot(slot);
  const auto& s = slots_[static_cast<size_t>(slot)];
  if (!s) fail("slot {} is empty (no extend since it was created or reset)", slot);
  return *s;
}

void SlotTable::check_extend(int slot, int64_t first_pos, int64_t n_rows, std::span<const int32_t> tokens) const {
  check_rows(slot, first_pos, n_rows);
  if (static_cast<int64_t>(tokens.size()) != n_rows)
    fail("extend of slot {}: {} tokens for {} rows (one token per row)", slot, tokens.size(), n_rows);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= limits_.vocab)
      fail("extend of slot {}: tokens[{}] = {} is outside [0, {})", slot, i, tokens[i], limits_.vocab);
}

void SlotTable::check_rows(int slot, int64_t first_pos, int64_t n_rows) const {
  check_slot(slot);
  if (n_rows < 1) fail("extend of slot {}: a span of {} rows (at least 1 is needed)", slot, n_rows);
  if (n_rows > limits_.ring_rows)
    fail("extend of slot {}: span of {} rows exceeds the ring of {} rows (extend in chunks)", slot, n_rows,
         limits_.ring_rows);
  if (first_pos < 0) fail("extend of slot {}: first position {} is negative", slot, first_pos);
  // Compared as first_pos > max - (n_rows - 1): first_pos + n_rows - 1 overflows for a first_pos near
  // INT64_MAX (n_rows is at most R here, so the right side cannot).
  const int64_t max_pos = max_position(limits_.max_steps);
  if (first_pos > max_pos - (n_rows - 1))
    fail("extend of slot {}: last position {} + {} exceeds {} (int32 positions with {} draft steps after it)", slot,
         first_pos, n_rows - 1, max_pos, limits_.max_steps);
  const auto& s = slots_[static_cast<size_t>(slot)];
  if (s && first_pos != int64_t{s->last_pos} + 1)
    fail(
        "extend of slot {}: first position {} does not continue the slot (expected {}; {}reset the slot to "
        "start over)",
        slot, first_pos, int64_t{s->last_pos} + 1, first_pos <= s->last_pos ? "a step back; " : "a gap; ");
}

void SlotTable::commit_extend(int slot, int64_t first_pos, int64_t n_rows, std::span<const int32_t> tokens) {
  check_extend(slot, first_pos, n_rows, tokens);
  commit_rows(slot, first_pos, n_rows);
  auto& s = slots_[static_cast<size_t>(slot)];
  s->last_token = tokens.back();
  s->token_known = true;
}

void SlotTable::commit_rows(int slot, int64_t first_pos, int64_t n_rows) {
  check_rows(slot, first_pos, n_rows);
  auto& s = slots_[static_cast<size_t>(slot)];
  if (!s) s = State{static_cast<int32_t>(first_pos), 0, 0};
  s->last_pos = static_cast<int32_t>(first_pos + n_rows - 1);
  s->last_token = 0;
  s->token_known = false;
}

void SlotTable::reset(int slot) {
  check_slot(slot);
  slots_[static_cast<size_t>(slot)].reset();
}

void SlotTable::check_draft(std::span<const int> slots, int steps) const {
  if (slots.empty()) fail("draft: no slots given (at least 1 is needed)");
  if (static_cast<int64_t>(slots.size()) > limits_.max_streams)
    fail("draft: {} slots exceed the largest streams bucket of {}", slots.size(), limits_.max_streams);
  if (steps < 1 || steps > limits_.max_steps)
    fail("draft: steps = {} is outside 1..{} (max_steps)", steps, limits_.max_steps);
  for (size_t i = 0; i < slots.size(); ++i) {
    check_slot(slots[i]);
    for (size_t j = 0; j < i; ++j)
      if (slots[j] == slots[i]) fail("draft: slot {} appears twice (slots[{}] and slots[{}])", slots[i], j, i);
    if (!slots_[static_cast<size_t>(slots[i])]) fail("draft: slot {} is empty (extend it before drafting)", slots[i]);
  }
}

bool SlotTable::empty(int slot) const {
  check_slot(slot);
  return !slots_[static_cast<size_t>(slot)].has_value();
}

int32_t SlotTable::first_pos(int slot) const { return filled(slot).first_pos; }
int32_t SlotTable::last_pos(int slot) const { return filled(slot).last_pos; }
int32_t SlotTable::last_token(int slot) const {
  const State& s = filled(slot);
  if (!s.token_known) fail("slot {}: its last token is in device memory (its last extend handed device tokens)", slot);
  return s.last_token;
}

int32_t SlotTable::key_begin(int slot, int32_t pos) const {
  return std::max(filled(slot).first_pos, pos - limits_.window);
}

}  // namespace tfe
