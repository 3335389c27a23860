// Limits on the counts a caller gives (threads, slots), shared by every door that takes them, so that a
// huge or negative value is refused by name before anything is allocated.
#pragma once
#include <string_view>

#include "core/error.h"

namespace tfe {

// Worker threads of the CPU paths (0: one per hardware thread).
inline constexpr int kMaxThreads = 1024;
// Slots of a slot table (the planner's max_slots has the same bound).
inline constexpr int kMaxSlots = 4096;

inline void check_threads(int threads, std::string_view what) {
  if (threads < 0 || threads > kMaxThreads)
    fail("{}: threads = {} is outside 0..{} (0: one per hardware thread)", what, threads, kMaxThreads);
}

}  // namespace tfe
