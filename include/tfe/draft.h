// What an extend call takes and a draft call returns: shared by tfe::Runtime and the CPU reference.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include <tfe/dtype.h>

namespace tfe {

// n_rows real rows of one slot at positions first_pos .. first_pos + n_rows - 1.
struct ExtendRequest {
  int slot = 0;
  int64_t first_pos = 0;
  int64_t n_rows = 0;
  std::span<const bf16_bits> taps;  // [n_rows, T * Ht]: the T taps of a row side by side, in header order
  std::span<const int32_t> tokens;  // [n_rows]: the target token that follows each row
};

// The same rows with their taps and tokens in device memory (Runtime::extend's device form): nothing
// crosses to the host. Row r's T * Ht taps start at taps + r * taps_stride.
struct DeviceExtendRequest {
  int slot = 0;
  int64_t first_pos = 0;
  int64_t n_rows = 0;
  const bf16_bits* taps = nullptr;  // device memory of the runtime's device
  int64_t taps_stride = 0;          // elements from one row's taps to the next (>= T * Ht); 0: T * Ht
  const int32_t* tokens = nullptr;  // device memory: [n_rows] contiguous
};

// A draft's first step may take, per slot, the token of another rank than the best (0), the branches of a
// draft tree: ranks 0 .. kMaxFirstRank, equal logits ranked by the lower draft id as the best is.
constexpr int kMaxFirstRank = 7;

// Outputs of a draft over `streams` slots (in the order given) and `steps` steps.
struct DraftResult {
  int streams = 0;
  int steps = 0;
  int64_t width = 0;               // H
  std::vector<int32_t> tokens;     // [streams, steps] target ids
  std::vector<float> confidences;  // [streams, steps]
  std::vector<bf16_bits> hidden;   // [streams, steps, H]: each step's h2

  int32_t token(int stream, int step) const { return tokens[at(stream, step)]; }  // step: 1-based
  float confidence(int stream, int step) const { return confidences[at(stream, step)]; }
  std::span<const bf16_bits> h2(int stream, int step) const {
    return {hidden.data() + at(stream, step) * static_cast<size_t>(width), static_cast<size_t>(width)};
  }

 private:
  size_t at(int stream, int step) const { return static_cast<size_t>(stream) * steps + (step - 1); }
};

}  // namespace tfe
