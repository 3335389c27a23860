#include "tests/gpu/fixture.h"

#include <algorithm>
#include <cstring>

#include "device/cuda_check.h"
#include "head/presets.h"
#include "head/random_head.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {

std::unique_ptr<HeadImage> random_head_image(const std::string& preset, uint64_t seed, bool fp8) {
  return random_head_image(preset_header(preset), seed, fp8);
}

std::unique_ptr<HeadImage> random_head_image(const HeadHeader& header, uint64_t seed, bool fp8) {
  const HeadWriter w = random_head(header, seed, fp8);
  std::vector<std::byte> bytes = w.serialize();
  HeadFile file = HeadFile::from_bytes(bytes);
  // The file views `bytes`: moving the vector keeps its buffer in place.
  return std::unique_ptr<HeadImage>(new HeadImage{std::move(bytes), std::move(file)});
}

PlanOptions test_plan_options(Fp8Mode fp8) {
  PlanOptions p;
  p.buckets = {1, 2, 4, 8, 16};
  p.max_steps = 8;
  p.max_slots = 20;
  p.extend_rows = 16;
  p.fp8 = fp8;
  return p;
}

OpenOptions test_open_options(const PlanOptions& plan, bool graphs) {
  OpenOptions o;
  o.plan = plan;
  o.graphs = graphs;
  return o;
}

ReferenceOptions reference_options(const PlanOptions& plan) {
  ReferenceOptions r;
  r.max_slots = plan.max_slots;
  r.max_steps = plan.max_steps;
  r.cand_k = plan.cand_k;
  r.fp8 = plan.fp8;
  return r;
}

std::vector<bf16_bits> random_taps(std::mt19937_64& rng, const HeadHeader& h, int64_t rows) {
  return random_bf16(rng, static_cast<size_t>(rows * static_cast<int64_t>(h.taps.size()) * h.target_hidden), 1.5f);
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, const HeadHeader& h, int64_t rows) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(h.vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (auto& x : t) x = d(rng);
  return t;
}

Rows random_rows(std::mt19937_64& rng, const HeadHeader& h, int slot, int64_t first_pos, int64_t n) {
  return Rows{slot, first_pos, random_taps(rng, h, n), random_tokens(rng, h, n)};
}

std::vector<ExtendRequest> requests(const std::vector<Rows>& rows) {
  std::vector<ExtendRequest> r;
  for (const auto& x : rows) r.push_back(x.request());
  return r;
}

int64_t row_width(const HeadHeader& h) { return static_cast<int64_t>(h.taps.size()) * h.target_hidden; }

DeviceRows to_device(const std::vector<Rows>& rows, int64_t width, int64_t stride) {
  int64_t total = 0;
  for (const Rows& r : rows) total += static_cast<int64_t>(r.tokens.size());
  std::vector<bf16_bits> taps(static_cast<size_t>(total * stride), bf16_bits{0x7fc1});
  std::vector<int32_t> tokens;
  int64_t at = 0;
  for (const Rows& r : rows) {
    for (size_t i = 0; i < r.tokens.size(); ++i)
      std::memcpy(&taps[static_cast<size_t>((at + static_cast<int64_t>(i)) * stride)], &r.taps[i * width],
                  static_cast<size_t>(width) * sizeof(bf16_bits));
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    at += static_cast<int64_t>(r.tokens.size());
  }
  DeviceRows d;
  d.taps = cuda::allocate_device(taps.size() * sizeof(bf16_bits), "test taps");
  d.tokens = cuda::allocate_device(tokens.size() * sizeof(int32_t), "test tokens");
  TFE_CUDA(cudaMemcpy(d.taps.data(), taps.data(), taps.size() * sizeof(bf16_bits), cudaMemcpyHostToDevice));
  TFE_CUDA(cudaMemcpy(d.tokens.data(), tokens.data(), tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  at = 0;
  for (const Rows& r : rows) {
    const auto n = static_cast<int64_t>(r.tokens.size());
    d.requests.push_back(DeviceExtendRequest{r.slot, r.first_pos, n,
                                             reinterpret_cast<const bf16_bits*>(d.taps.data()) + at * stride, stride,
                                             reinterpret_cast<const int32_t*>(d.tokens.data()) + at});
    at += n;
  }
  return d;
}

}  // namespace tfe::test
