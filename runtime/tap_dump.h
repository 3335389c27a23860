// tfe::TapDump: the tap dump's rows and its file (<tfe/tap_dump.h>, docs/runtime.md "The tap dump").
// Host only: Runtime::extend hands it each call's rows (device rows copied to the host first).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tfe/draft.h>
#include <tfe/dtype.h>
#include <tfe/tap_dump.h>

namespace tfe {

class TapDump {
 public:
  // Refused as check_tap_dump_options (<tfe/tap_dump.h>) refuses, and for taps or target_hidden below 1.
  TapDump(TapDumpOptions options, int taps, int64_t target_hidden, std::string head_sha256 = {});
  TapDump(const TapDump&) = delete;
  TapDump& operator=(const TapDump&) = delete;
  ~TapDump();  // write(); a failure is reported to stderr

  // Rows still kept before max_rows is reached.
  int64_t room() const { return options_.max_rows - rows(); }
  // One extend call: its requests' rows in order (taps [n_rows, taps * target_hidden], tokens [n_rows]), kept
  // up to max_rows and counted as dropped past it. `left_out`: rows of the same call the caller did not copy
  // because they were past room(), counted as dropped too. Every request is checked first; a refused call
  // records nothing, not even its index.
  void record(std::span<const ExtendRequest> call, int64_t left_out = 0);
  // Writes every row kept so far, atomically (a temporary beside the file, renamed over it). Throws naming
  // the path.
  void write() const;

  int64_t rows() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t dropped() const { return dropped_; }
  int64_t calls() const { return calls_; }  // extend calls recorded (the next call's index)
  int64_t row_width() const { return row_width_; }
  const TapDumpOptions& options() const { return options_; }

 private:
  TapDumpOptions options_;
  int taps_;
  int64_t target_hidden_;
  int64_t row_width_;
  std::string head_sha256_;
  std::vector<bf16_bits> taps_data_;  // [rows, row_width]
  std::vector<int32_t> tokens_, slots_, positions_, call_of_row_;
  int64_t calls_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace tfe
