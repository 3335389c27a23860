// How closely a GPU draft must agree with the CPU reference: the one statement of the bound, used by the
// runtime's self-check at open (OpenOptions::self_check, docs/runtime.md "The self-check") and by the GPU
// tests (tests/gpu/test_draft.cpp).
//
// The kernels may sum in another order than the reference (docs/head.md "Numerics"), so a bf16 value may
// differ by an ulp and the difference travels through the layer. Hence:
//  - tokens: equal wherever the reference's top two logits (dense) or top two exact candidate logits
//    (two_stage) are more than kDraftMargin apart; from a slot's first step that is closer (a near-tie) on,
//    the rest of its chain is not compared (its input may legitimately differ);
//  - confidences: within kConfidenceTolerance (absolute) at the compared steps.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include <tfe/draft.h>
#include <tfe/header.h>

#include <tfe/reference.h>

namespace tfe {

inline constexpr float kDraftMargin = 0.15f;
inline constexpr float kConfidenceTolerance = 2e-2f;

// The gap between the largest and second largest value (0 with fewer than two values).
float top_two_gap(std::span<const float> v);

// The gap between the value of rank `rank` (0: the largest) and its nearer neighbour in rank order.
float rank_gap(std::span<const float> v, int rank);

// The reference's margin at one step of one slot: the top-two gap of its logits (dense) or of its exact
// candidate logits (two_stage); at a step that took rank `rank` (a draft's first_ranks), the gap around it.
float draft_margin(const HeadHeader& h, const StepTrace& step, int rank = 0);

// The first step, by slot then step, where `got` leaves the bound around the reference's `want`.
struct DraftDisagreement {
  int stream = 0;  // index into the draft's slots
  int step = 0;    // 1-based
  int32_t token = 0, want_token = 0;
  float confidence = 0, want_confidence = 0;
  float margin = 0;  // the reference's margin at that step (> kDraftMargin)
};

struct DraftAgreement {
  int compared = 0;  // steps compared, over every slot
  std::optional<DraftDisagreement> first;
};

// Compares each slot's chain step by step up to its first near-tie (see above), and stops there at its first
// step outside the bound. `trace` is the reference's trace of `want`; `first_ranks` its draft's.
DraftAgreement compare_with_reference(const HeadHeader& h, const DraftResult& got, const DraftResult& want,
                                      const DraftTrace& trace, std::span<const int> first_ranks = {});

}  // namespace tfe
