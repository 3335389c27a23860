// tfe::AcceptLog: the accept log's counts and its JSON lines (<tfe/accept_log.h>, docs/runtime.md).
#pragma once
#include <cstdio>
#include <span>
#include <string>

#include <tfe/accept_log.h>

namespace tfe {

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

// `o` with TFE_ACCEPT_LOG=N (every N rounds) and TFE_ACCEPT_LOG_FILE=PATH applied where they are set; a
// malformed TFE_ACCEPT_LOG is refused naming it.
AcceptLogOptions accept_log_options_from_environment(AcceptLogOptions o);

}  // namespace tfe
