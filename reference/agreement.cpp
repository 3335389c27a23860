#include "reference/agreement.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

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

float rank_gap(std::span<const float> v, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) + 1 >= v.size()) return 0.0f;
  std::vector<float> top(v.begin(), v.end());
  std::partial_sort(top.begin(), top.begin() + rank + 2, top.end(), std::greater<>());
  const float below = top[static_cast<size_t>(rank)] - top[static_cast<size_t>(rank) + 1];
  return rank == 0 ? below : std::min(below, top[static_cast<size_t>(rank) - 1] - top[static_cast<size_t>(rank)]);
}

float draft_margin(const HeadHeader& h, const StepTrace& step, int rank) {
  if (h.head_type != HeadType::dense) return top_two_gap(step.exact);
  return rank == 0 ? top_two_gap(step.logits) : rank_gap(step.logits, rank);
}

DraftAgreement compare_with_reference(const HeadHeader& h, const DraftResult& got, const DraftResult& want,
                                      const DraftTrace& trace, std::span<const int> first_ranks) {
  if (got.streams != want.streams || got.steps != want.steps)
    fail("compare_with_reference: a draft of {} slots x {} steps against the reference's {} x {}", got.streams,
         got.steps, want.streams, want.steps);
  DraftAgreement a;
  for (int i = 0; i < want.streams; ++i) {
    for (int s = 1; s <= want.steps; ++s) {
      const int rank = s == 1 && !first_ranks.empty() ? first_ranks[static_cast<size_t>(i)] : 0;
      const float margin = draft_margin(h, trace.at(i, s), rank);
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
