#include "reference/agreement.h"

#include <cmath>

#include "core/error.h"

namespace tfe {

float top_two_gap(std::span<const float> v) {
  if (v.size() < 2) return 0.0f;
  float a = -INFINITY, b = -INFINITY;
  for (float x : v) {
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

float draft_margin(const HeadHeader& h, const StepTrace& step) {
  return h.head_type == HeadType::dense ? top_two_gap(step.logits) : top_two_gap(step.exact);
}

DraftAgreement compare_with_reference(const HeadHeader& h, const DraftResult& got, const DraftResult& want,
                                      const DraftTrace& trace) {
  if (got.streams != want.streams || got.steps != want.steps)
    fail("compare_with_reference: a draft of {} slots x {} steps against the reference's {} x {}", got.streams,
         got.steps, want.streams, want.steps);
  DraftAgreement a;
  for (int i = 0; i < want.streams; ++i) {
    for (int s = 1; s <= want.steps; ++s) {
      const float margin = draft_margin(h, trace.at(i, s));
      if (margin <= kDraftMargin) break;
      ++a.compared;
      const bool same_token = got.token(i, s) == want.token(i, s);
      const bool close = std::fabs(got.confidence(i, s) - want.confidence(i, s)) < kConfidenceTolerance;
      if (same_token && close) continue;
      if (!a.first)
        a.first = DraftDisagreement{
            i, s, got.token(i, s), want.token(i, s), got.confidence(i, s), want.confidence(i, s), margin};
      break;
    }
  }
  return a;
}

}  // namespace tfe
