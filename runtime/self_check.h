// The self-check at open (OpenOptions::self_check, TFE_CHECK=1; docs/runtime.md "The self-check"): the
// opened runtime drafts a fixed case and the CPU reference drafts the same; a step outside the bound of
// reference/agreement.h refuses the open.
#pragma once

#include <tfe/head_file.h>
#include <tfe/runtime.h>

namespace tfe {

struct SelfCheckReport {
  int cases = 0;     // cases drafted (a further case only when no step of the ones before could be compared)
  int slots = 0;     // slots drafted in each case
  int compared = 0;  // steps compared, over every case
};

// Drafts up to kSelfCheckCases fixed cases: in each, slots 0..n-1 (n = min(2, max_slots, the largest
// bucket)) absorb a few rows of taps and tokens from a fixed seed, then draft max_steps steps, on `rt` and on
// a CPU reference over `file` with the plan's options. Each slot is reset afterwards. Throws tfe::Error naming
// the slot, the step, both tokens, both confidences, the margin and the bound at the first step outside it.
// When no step of any case could be compared (every chain began at a near-tie), says so on stderr.
SelfCheckReport run_self_check(Runtime& rt, const HeadFile& file);
inline constexpr int kSelfCheckCases = 4;

}  // namespace tfe
