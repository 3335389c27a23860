// The tap dump: every real row an extend call hands the runtime (its taps, the token that follows it, its slot
// and position) kept in memory and written as one safetensors file (docs/runtime.md "The tap dump").
// OpenOptions::tap_dump (or TFE_TAP_DUMP=FILE) turns it on. A diagnostic: the rows of a real run, to replay
// through the CPU reference or to train against.
#pragma once
#include <cstdint>
#include <string>

namespace tfe {

struct TapDumpOptions {
  std::string path;  // the safetensors file written at close (and by Runtime::write_tap_dump); empty: off
  // Rows kept in memory; the rows of later calls are counted (the file's `dropped_rows`), not kept. A row is
  // taps x target_hidden bf16 values: 24 KiB for a 3 x 4096 head, so the default holds up to 1.5 GiB.
  int64_t max_rows = int64_t{1} << 16;
};

// Refuses, naming the field and the value: an empty path, max_rows outside 1..2^31-1, a path that is a
// directory, and a directory that does not exist or cannot be written (checked at open, so that a run does
// not learn at its close that its rows cannot be written).
void check_tap_dump_options(const TapDumpOptions& o);

}  // namespace tfe
