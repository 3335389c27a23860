// Slot bookkeeping on the host, shared by the CPU reference and the GPU runtime: which slots hold a
// sequence, where each one stands, and every check an extend or a draft call must pass before any
// state (host or device) changes. Both sides refuse the same calls with the same messages.
//
// Positions. A fresh (or reset) slot may start at any position >= 0: an engine can attach a head in the
// middle of a sequence. The head then attends only what it has seen: keys at positions
// key_begin(slot, p) = max(first position of the slot, p - window) .. p. Ring rows outside that range
// (never written, or left by the slot's previous sequence) are never read.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace tfe {

// Rows of a slot's K/V ring: the window's W + 1 keys plus a row for each draft step, so that no draft
// step overwrites a key that a later step of the same pass still reads. The planner uses the same value.
constexpr int ring_rows(int window, int max_steps) { return window + 1 + max_steps; }

// The ring row that holds position `pos`.
constexpr int ring_row(int32_t pos, int ring_rows) { return static_cast<int>(pos % ring_rows); }

// Largest position a real row may take: a draft pass of max_steps steps must still fit in int32.
constexpr int32_t max_position(int max_steps) { return std::numeric_limits<int32_t>::max() - max_steps; }

struct SlotLimits {
  int max_slots = 0;    // slots 0 .. max_slots-1 (the GPU runtime's scratch slot is not counted)
  int ring_rows = 0;    // R
  int64_t vocab = 0;    // V: tokens are target ids in [0, V)
  int max_steps = 0;    // draft steps 1 .. max_steps
  int max_streams = 0;  // slots per draft call (the largest streams bucket)
  int window = 0;       // W
};

class SlotTable {
 public:
  // Throws tfe::Error naming a limit that is out of range.
  explicit SlotTable(const SlotLimits& limits);

  const SlotLimits& limits() const { return limits_; }

  // Refuses an extend of `n_rows` real rows at positions first_pos .. first_pos + n_rows - 1 whose
  // following tokens are `tokens` (one per row): an unknown slot, n_rows == 0 or > R, a mismatched token
  // count, a position that does not continue the slot (a gap or a step back), a position past
  // max_position, a token outside [0, V). Changes nothing.
  void check_extend(int slot, int64_t first_pos, int64_t n_rows, std::span<const int32_t> tokens) const;
  // check_extend, then records the slot's new last position and token.
  void commit_extend(int slot, int64_t first_pos, int64_t n_rows, std::span<const int32_t> tokens);
  // The same for rows whose tokens are in device memory (checked there): every check but the tokens'; the
  // slot's last token is then unknown to the host (last_token throws).
  void check_rows(int slot, int64_t first_pos, int64_t n_rows) const;
  void commit_rows(int slot, int64_t first_pos, int64_t n_rows);
  // Empties a slot; its next extend may start at any position.
  void reset(int slot);

  // Refuses a draft over `slots` for `steps` steps: no slots, more than max_streams, an unknown,
  // duplicated or empty slot, steps outside 1 .. max_steps. Changes nothing.
  void check_draft(std::span<const int> slots, int steps) const;

  bool empty(int slot) const;
  // Position where the slot's current sequence started, its last real position, and the token that
  // follows it. Each throws naming the slot when the slot is unknown or empty (last_token also when its
  // last extend handed device tokens).
  int32_t first_pos(int slot) const;
  int32_t last_pos(int slot) const;
  int32_t last_token(int slot) const;
  // First key position a row of this slot at `pos` attends: max(first_pos, pos - W).
  int32_t key_begin(int slot, int32_t pos) const;

 private:
  struct State {
    int32_t first_pos = 0;
    int32_t last_pos = 0;
    int32_t last_token = 0;
    bool token_known = true;
  };
  void check_slot(int slot) const;
  const State& filled(int slot) const;

  SlotLimits limits_;
  std::vector<std::optional<State>> slots_;
};

}  // namespace tfe
