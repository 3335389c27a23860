// libFuzzer target: the extend call's checks (SlotTable, check_extend_requests for host and device rows,
// check_finite_taps) on arbitrary slots, positions, row counts, strides and taps, as a library caller or
// the Python package hands them over. Every refusal must be a tfe::Error; an accepted call must hold
// rows inside 0..max_position (checked here in 128-bit arithmetic) and leave the slot where the rows end.
// UBSan (the fuzz build's) reports any overflow inside the checks themselves.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/extend_check.h"
#include <tfe/slots.h>

namespace {

// Reads little-endian integers from the input; zeros once it runs out.
struct Input {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T take() {
    T v{};
    const size_t k = n < sizeof(T) ? n : sizeof(T);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
  bool empty() const { return n == 0; }
};

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  tfe::SlotLimits limits;
  limits.max_slots = 1 + in.take<uint8_t>() % 8;
  limits.max_steps = 1 + in.take<uint8_t>() % 16;
  limits.window = 1 + in.take<uint8_t>() % 32;
  limits.ring_rows = tfe::ring_rows(limits.window, limits.max_steps);
  limits.vocab = 1 + in.take<uint16_t>();
  limits.max_streams = limits.max_slots;
  const int64_t row_width = 1 + in.take<uint8_t>() % 4;
  tfe::SlotTable slots(limits);
  std::vector<tfe::bf16_bits> taps(static_cast<size_t>(limits.ring_rows * row_width + 8));
  std::vector<int32_t> tokens(static_cast<size_t>(limits.ring_rows + 8));
  while (!in.empty()) {
    const uint8_t op = in.take<uint8_t>();
    const int slot = in.take<int32_t>() % (limits.max_slots + 2);  // some outside, some negative
    int64_t first = in.take<int64_t>();
    if (op & 1) first = static_cast<int64_t>(in.take<int32_t>());  // near the int32 positions too
    const int64_t n_rows = (op & 2) ? in.take<int64_t>() : in.take<uint8_t>() % (limits.ring_rows + 2);
    const int64_t stride = in.take<int64_t>();
    for (auto& t : taps) t = in.take<uint16_t>();
    for (auto& t : tokens) t = in.take<int32_t>() % static_cast<int32_t>(limits.vocab + 1);
    const size_t rows = n_rows > 0 && n_rows <= limits.ring_rows ? static_cast<size_t>(n_rows) : 0;
    try {
      if (op & 4) {
        const tfe::DeviceExtendRequest r{slot, first, n_rows, taps.data(), stride, tokens.data()};
        tfe::check_extend_requests(slots, std::span(&r, 1), row_width);
      } else {
        const tfe::ExtendRequest r{slot, first, n_rows,
                                   std::span<const tfe::bf16_bits>(taps).first(rows * static_cast<size_t>(row_width)),
                                   std::span<const int32_t>(tokens).first(rows)};
        tfe::check_extend_requests(slots, std::span(&r, 1), row_width);
        tfe::check_finite_taps(std::span(&r, 1), row_width);
      }
      // Accepted: the rows lie inside the positions a draft may still follow.
      const __int128 last = static_cast<__int128>(first) + n_rows - 1;
      require(first >= 0 && n_rows >= 1 && n_rows <= limits.ring_rows && last <= tfe::max_position(limits.max_steps));
      if (op & 8) {
        slots.commit_rows(slot, first, n_rows);
        require(slots.last_pos(slot) == static_cast<int32_t>(last));
      }
    } catch (const tfe::Error&) {
    }
    if (op & 16) {
      try {
        slots.reset(slot);
      } catch (const tfe::Error&) {
      }
    }
  }
  return 0;
}
