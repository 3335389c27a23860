#include "tests/gpu/fixture.h"

#include <algorithm>
#include <cstring>

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

}  // namespace tfe::test
