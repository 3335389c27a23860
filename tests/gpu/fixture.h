// A random head in memory (never on disk), and the runtime and CPU reference opened on it with the same
// limits, for the GPU tests.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include <tfe/head_file.h>
#include "core/numeric.h"
#include "device/handles.h"
#include "plan/plan.h"
#include "reference/agreement.h"
#include "reference/ops.h"
#include <tfe/reference.h>
#include <tfe/runtime.h>
#include "runtime/testing.h"

namespace tfe::test {

struct HeadImage {
  std::vector<std::byte> bytes;  // the whole .tfe image; `file` views it
  HeadFile file;
};
// A random head of `preset`, or of any header (with FP8 forms of every linear when `fp8`), built in memory.
std::unique_ptr<HeadImage> random_head_image(const HeadHeader& header, uint64_t seed, bool fp8);
std::unique_ptr<HeadImage> random_head_image(const std::string& preset, uint64_t seed, bool fp8);

// Small limits that still cover every bucket and step: 20 slots, extend chunks of 16 rows (so a
// 40-row prefix runs in three chunks).
PlanOptions test_plan_options(Fp8Mode fp8 = Fp8Mode::automatic);
OpenOptions test_open_options(const PlanOptions& plan, bool graphs = true);
ReferenceOptions reference_options(const PlanOptions& plan);

std::vector<bf16_bits> random_taps(std::mt19937_64& rng, const HeadHeader& h, int64_t rows);
std::vector<int32_t> random_tokens(std::mt19937_64& rng, const HeadHeader& h, int64_t rows);

// Rows for one slot, owning the spans an ExtendRequest points into.
struct Rows {
  int slot = 0;
  int64_t first_pos = 0;
  std::vector<bf16_bits> taps;
  std::vector<int32_t> tokens;
  ExtendRequest request() const {
    return ExtendRequest{slot, first_pos, static_cast<int64_t>(tokens.size()), taps, tokens};
  }
};
Rows random_rows(std::mt19937_64& rng, const HeadHeader& h, int slot, int64_t first_pos, int64_t n);
std::vector<ExtendRequest> requests(const std::vector<Rows>& rows);

// T x Ht: the bf16 values of one row's taps.
int64_t row_width(const HeadHeader& h);

// Rows of several slots copied into one device buffer, each row `stride` values apart (the gap filled with
// NaN bits, which a read past a row's taps would carry into what it feeds), and the tokens after them.
struct DeviceRows {
  cuda::DeviceMemory taps, tokens;
  std::vector<DeviceExtendRequest> requests;
};
DeviceRows to_device(const std::vector<Rows>& rows, int64_t width, int64_t stride);

template <typename T>
std::vector<T> as_vector(const std::vector<std::byte>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace tfe::test
