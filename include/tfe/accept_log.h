// The accept log: how many of each round's drafts the target kept, by window position (docs/runtime.md
// "The accept log"). Runtime::record_accepted feeds the runtime's own; OpenOptions::accept_log (or
// TFE_ACCEPT_LOG) turns its JSON lines on. An engine that drafts otherwise keeps a tfe::AcceptLog itself.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace tfe {

// The most steps a round may report: the counts hold an entry per window position, sized by the longest
// round seen (a plan drafts at most 16 steps; this leaves room for other drafters, not for a count gone wrong).
inline constexpr int kMaxAcceptSteps = 256;

struct AcceptLogOptions {
  int every = 0;      // one JSON line every `every` rounds; 0: no lines (the totals are kept regardless)
  std::string path;   // appended to; empty: stderr
  std::string label;  // free text written in every line, e.g. the prompt class
};

// Counts over a number of rounds. Position p (1-based, index p - 1) is `asked` when the target examined
// that draft (the sequence kept at least p - 1) and `kept` when it accepted it (kept at least p).
struct AcceptCounts {
  uint64_t rounds = 0;
  uint64_t sequences = 0;    // sequences summed over the rounds
  uint64_t kept_tokens = 0;  // drafts kept, summed over the sequences
  std::vector<uint64_t> asked, kept;
  double mean_kept() const { return sequences ? static_cast<double>(kept_tokens) / sequences : 0.0; }
};

class AcceptLog {
 public:
  // Opens `path` for appending when lines are on (every > 0); refused, naming the path, when it cannot be.
  explicit AcceptLog(AcceptLogOptions options = {});
  AcceptLog(const AcceptLog&) = delete;
  AcceptLog& operator=(const AcceptLog&) = delete;
  ~AcceptLog();  // flush(); a failure is reported to stderr

  // One round: kept[i] of sequence i's `steps` drafts were accepted by the target (0..steps). A refused
  // round (steps outside 1..kMaxAcceptSteps, no sequence, a value outside 0..steps) records nothing. Writes
  // a line every `every` rounds.
  void record(std::span<const int> kept, int steps);
  // Writes a line for the rounds recorded since the last line, if any.
  void flush();

  const AcceptCounts& totals() const { return totals_; }
  const AcceptLogOptions& options() const { return options_; }

 private:
  void write_line();

  AcceptLogOptions options_;
  std::FILE* out_ = nullptr;  // owned unless it is stderr
  AcceptCounts totals_;
  AcceptCounts pending_;  // since the last line
};

}  // namespace tfe
