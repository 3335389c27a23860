// tfe-bench's pieces (what it measures: bench/tfe_bench.cpp, beside its arguments and main): the
// measurements (tfe_bench_measure.cpp), the run of every part in order (tfe_bench_run.cpp) and the report
// (tfe_bench_report.cpp).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tfe/draft.h>
#include <tfe/header.h>
#include <tfe/runtime.h>

#include "core/numeric.h"
#include "runtime/testing.h"

namespace tfe::bench {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

struct Options {
  std::string head;
  std::string artifact;
  std::string fp8 = "auto";
  std::string dependent_launch = "plan";
  tfe::PlanOptions plan;               // when planning here (no --artifact): its attention split; fp8 from --fp8
  tfe::Tuning tuning;                  // when planning here (testing::Hooks::tuning)
  std::vector<std::string> knock_out;  // draft nodes left out (testing::Hooks::knock_out): timing only
  int l2_resident_mb = 0;              // testing::Hooks::l2_resident_weight_bytes, in MiB
  std::string streams = "1,2,4,8,16";
  std::string steps = "1..8";
  int iters = 50;
  int warmup = 5;
  int extend_iters = 20;
  double copy_gib = 2.0;
  uint64_t seed = 1;
  bool eager = true;
  std::string json_out;
  std::string csv_out;
  std::string drafts_out;
  bool profile = false;
};

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// "1,2,4", "1..8" or a mix ("1,4..6"): ascending, distinct, each inside [lo, hi].
std::vector<int> parse_list(std::string_view option, const std::string& text, int lo, int hi);

struct Stats {
  double median = 0, p10 = 0, p90 = 0, min = 0;
  int n = 0;
};

Stats stats_of(std::vector<double> v);
json to_json(const Stats& s);

// Runs one part of the benchmark; a failure is printed and recorded, and the run goes on.
class Parts {
 public:
  explicit Parts(json& errors) : errors_(errors) {}
  bool run(const std::string& name, const std::function<void()>& part) {
    const auto t0 = Clock::now();
    try {
      part();
      std::fprintf(stderr, "tfe-bench: %-22s %8.1f ms\n", name.c_str(), ms_since(t0));
      return true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tfe-bench: %s failed after %.1f ms: %s\n", name.c_str(), ms_since(t0), e.what());
      errors_[name] = e.what();
      return false;
    }
  }
  bool any_failed() const { return !errors_.empty(); }

 private:
  json& errors_;
};

// Device-to-device copy rate in GB/s (1e9 bytes), counting each byte read and written.
struct CopyBandwidth {
  double gbps = 0;
  Stats ms;
  int64_t bytes = 0;
};

CopyBandwidth copy_bandwidth(double gib, int reps);

// What a draft call costs with no kernel in it: the launch of a graph of one empty node and the wait for
// it, on a stream of its own (a call writes its tables into host memory and reads its outputs there, so
// it makes no copy). Beside it, for comparison, the copy-engine round trips a call would otherwise make:
// an upload of the tables and two downloads of the outputs, each alone with its wait, and all three with
// the launch in a row (one wait). Host wall time, median of `reps`. An empty node gives the GPU nothing to
// run, so `launch` is the host's side of a launch and a wait only: a graph of one kernel costs more (6.4-7
// us on the H200, BENCHMARKS.md "A draft call without copies"), and a call's fixed term (the line over
// steps) is read against that.
struct CallFloor {
  Stats launch, upload, download, with_copies;
};

CallFloor call_floor(size_t upload_bytes, size_t download_bytes, int reps);

// Fast, roughly unit-normal bf16 values (Irwin-Hall of four 16-bit uniforms): the benchmark needs
// plausible activations, not a particular distribution; the inputs are written out when they matter.
class Draws {
 public:
  explicit Draws(uint64_t seed) : rng_(seed) {}
  void fill(std::span<tfe::bf16_bits> out) {
    constexpr float kScale = 1.7320508f / 65536.0f;  // sum of 4 uniforms on [0, 65535]: sd 65536 / sqrt(3)
    for (auto& x : out) {
      const uint64_t r = rng_();
      const float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
      x = tfe::float_to_bf16((s - 131070.0f) * kScale);
    }
  }
  int32_t token(int64_t vocab) { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab)); }

 private:
  std::mt19937_64 rng_;
};

// Real rows for `slots` slots, `rows` each at positions 0..rows-1: [slot][row] taps and tokens.
struct Prefix {
  int slots = 0;
  int64_t rows = 0;
  int64_t row_width = 0;
  std::vector<tfe::bf16_bits> taps;
  std::vector<int32_t> tokens;

  std::span<const tfe::bf16_bits> slot_taps(int s, int64_t first, int64_t n) const {
    return std::span(taps).subspan(static_cast<size_t>((s * rows + first) * row_width),
                                   static_cast<size_t>(n * row_width));
  }
  std::span<const int32_t> slot_tokens(int s, int64_t first, int64_t n) const {
    return std::span(tokens).subspan(static_cast<size_t>(s * rows + first), static_cast<size_t>(n));
  }
};

Prefix make_prefix(const tfe::HeadHeader& h, int slots, int64_t rows, uint64_t seed);

// Extends every slot of the prefix, all slots side by side in each call, in ring-sized pieces (a longer
// extend is refused). `Engine`: tfe::Runtime, or tfe::Reference (--reference), which share the call.
template <typename Engine>
void extend_prefix(Engine& engine, const Prefix& p) {
  for (int64_t first = 0; first < p.rows; first += engine.ring_rows()) {
    const int64_t n = std::min<int64_t>(engine.ring_rows(), p.rows - first);
    std::vector<tfe::ExtendRequest> requests;
    for (int s = 0; s < p.slots; ++s)
      requests.push_back({s, first, n, p.slot_taps(s, first, n), p.slot_tokens(s, first, n)});
    engine.extend(requests);
  }
  if constexpr (requires { engine.synchronize(); }) engine.synchronize();
}

// Slot ids 0..n-1.
std::vector<int> first_slots(int n);
// The host time of one whole draft() call, in microseconds; over `iters` calls after `warmup` untimed ones.
double time_draft_us(tfe::Runtime& rt, std::span<const int> slots, int steps);
Stats time_draft(tfe::Runtime& rt, std::span<const int> slots, int steps, int warmup, int iters);

// Least-squares line y = a + b x.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y);

// The linears that run in their FP8 form under the plan (the reference's rule: the mode is not `off`
// and the file holds the form).
std::vector<std::string> fp8_linears(const tfe::Plan& plan);

// The prefix inputs and the drafts of slots 0..B-1, in the layout of `tfe-plan reference` vectors (taps,
// tokens, positions, slots, draft_tokens, confidences), which bench/torch_head.py replays.
void write_drafts(const std::string& path, const Prefix& prefix, const tfe::DraftResult& d,
                  std::map<std::string, std::string> metadata);

struct DraftRow {
  int streams = 0;
  int steps = 0;
  std::optional<Stats> graph, eager;
  double floor_us = 0;  // per step
  int64_t step_bytes = 0;
};

// What the report reads beside the JSON it completes.
struct Measured {
  const tfe::HeadHeader& header;
  bool fp8 = false;  // the plan runs FP8 linears
  const std::vector<int>& streams;
  const std::vector<DraftRow>& rows;
  double bandwidth_gbps = 0;
  int64_t prefix_rows = 0;
  int max_streams = 0;
};

// Completes `out` (the line over steps per streams, the draft rows, the errors), prints the table and writes
// --json and --csv.
void report(const Options& o, const Measured& m, const json& checks, const json& errors, json& out);

// --reference: the same prefix and drafts through the CPU reference (no GPU): a drafts file to check a
// PyTorch port against, made by the same code as the GPU run's.
int run_reference(const Options& o, const std::vector<int>& streams);

// Every part on the GPU, in order; exit status 1 when any part failed.
int run(const Options& o);

}  // namespace tfe::bench
