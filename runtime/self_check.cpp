#include "runtime/self_check.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/numeric.h"
#include "reference/agreement.h"
#include "reference/ops.h"
#include <tfe/reference.h>

namespace tfe {

namespace {

constexpr uint64_t kSeed = 0x5e1fc4ec;
constexpr float kTapScale = 1.5f;  // taps uniform in [-1.5, 1.5), as the GPU tests draw them

// Uniform in [-scale, scale) from the generator's bits alone: mt19937_64 is the same everywhere, while
// std::uniform_real_distribution may differ between standard libraries.
float uniform(std::mt19937_64& rng, float scale) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>((2.0 * u - 1.0) * scale);
}

struct CaseRows {
  std::vector<std::vector<bf16_bits>> taps;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<ExtendRequest> requests;
};

CaseRows case_rows(const HeadHeader& h, int slots, int ring_rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  CaseRows c;
  c.taps.resize(static_cast<size_t>(slots));
  c.tokens.resize(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    // Slots of different lengths: 3 rows, 5 rows (at most a ring).
    const int64_t rows = std::min(3 + 2 * s, ring_rows);
    auto& taps = c.taps[static_cast<size_t>(s)];
    auto& tokens = c.tokens[static_cast<size_t>(s)];
    taps.resize(static_cast<size_t>(rows * width));
    for (auto& t : taps) t = float_to_bf16(uniform(rng, kTapScale));
    tokens.resize(static_cast<size_t>(rows));
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(h.vocab));
  }
  for (int s = 0; s < slots; ++s)
    c.requests.push_back(ExtendRequest{s, 0, static_cast<int64_t>(c.tokens[static_cast<size_t>(s)].size()),
                                       c.taps[static_cast<size_t>(s)], c.tokens[static_cast<size_t>(s)]});
  return c;
}

}  // namespace

SelfCheckReport run_self_check(Runtime& rt, const HeadFile& file) {
  const PlanOptions& po = rt.plan_options();
  const HeadHeader& h = rt.header();
  ReferenceOptions ro;
  ro.max_slots = po.max_slots;
  ro.max_steps = po.max_steps;
  ro.fp8 = po.fp8;
  ro.cand_k = po.cand_k;
  Reference ref(file, ro);

  SelfCheckReport report;
  report.slots = std::min({2, po.max_slots, po.buckets.back()});
  std::vector<int> slots(static_cast<size_t>(report.slots));
  for (int s = 0; s < report.slots; ++s) slots[static_cast<size_t>(s)] = s;
  for (int c = 0; c < kSelfCheckCases && report.compared == 0; ++c) {
    const CaseRows rows = case_rows(h, report.slots, rt.ring_rows(), kSeed + static_cast<uint64_t>(c));
    rt.extend(rows.requests);
    ref.extend(rows.requests);
    const DraftResult got = rt.draft(slots, po.max_steps);
    DraftTrace trace;
    const DraftResult want = ref.draft(slots, po.max_steps, &trace);
    for (int s : slots) {
      rt.reset(s);
      ref.reset(s);
    }
    ++report.cases;
    const DraftAgreement a = compare_with_reference(h, got, want, trace);
    report.compared += a.compared;
    if (const auto& d = a.first)
      fail(
          "self_check: case {}, slot {}, step {}: the runtime drafted token {} (confidence {:.4f}), the CPU reference "
          "token {} (confidence {:.4f}); there the reference's margin is {:.4f}, above kDraftMargin = {}, so the "
          "tokens must be equal and the confidences within kConfidenceTolerance = {}. The runtime refuses to serve "
          "past the stated bound (docs/runtime.md \"The self-check\")",
          c, slots[static_cast<size_t>(d->stream)], d->step, d->token, d->confidence, d->want_token, d->want_confidence,
          d->margin, kDraftMargin, kConfidenceTolerance);
  }
  if (report.compared == 0)
    std::fprintf(stderr,
                 "tfe: self_check: in %d cases every slot's first draft step was a near-tie in the CPU reference "
                 "(top-two gap <= kDraftMargin = %g): no step could be compared, so the check proved nothing\n",
                 report.cases, static_cast<double>(kDraftMargin));
  return report;
}

}  // namespace tfe
