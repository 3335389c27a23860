// tfe-bench: what a draft head costs on this GPU, against the memory floor, in one run.
//
//   copy bandwidth  cudaMemcpyAsync device-to-device of a large buffer (bytes read + written), timed by
//                   events, median of 10: the rate the floor below is measured against.
//   open            Runtime::open, with lazy capture so that open and graph capture are timed apart; then
//                   the first draft of every (bucket, steps) captures its graph. "capture of every graph"
//                   is the sum over keys of (first call - second call), so the one replay inside each first
//                   call is not counted as capture.
//   prefix          every slot drafted takes window + 1 real rows (positions 0..W), so each draft step
//                   attends a full window of keys, as a slot deep into a sequence does.
//   draft           per (streams B, steps S): the host-side time of a whole draft() call (tables into host
//                   memory, one graph replay, the wait for its completion word, tokens and confidences read
//                   from host memory), median over --iters after
//                   --warmup; per step = call / S. The same on a second runtime with graphs off (every
//                   node launched eagerly). Per B, a least-squares line over S splits a call into a fixed
//                   cost and a marginal cost per step.
//   floor           step_bytes(h, B, fp8 in use).total() / copy bandwidth: the time one step takes if it only
//                   moved its bytes at copy speed. ratio = measured per-step time / floor.
//   extend          extend() of 1, 16 and 512 rows (the ring's rows when it is shorter) on one slot, with
//                   the synchronize that makes it complete.
//   drafts          (--drafts-out) for slots 0..B-1 after the prefix, max_steps steps: tfe's draft tokens and
//                   confidences with the exact inputs (taps, tokens, positions), in the layout of
//                   `tfe-plan reference` vectors, so that bench/torch_head.py replays them.
//
// Each part fails on its own: its error is printed and recorded in the JSON, and the parts that do not
// depend on it still run. Exit status 1 when any part failed.
//
// --profile (for `ncu --profile-from-start off`): after the prefix, one warm draft step per --streams value
// between cudaProfilerStart and cudaProfilerStop, and nothing else is timed: the profiler sees exactly the
// kernels of one graph replay of (streams, 1 step). bench/profile.sh drives it.
//
// --reference (no GPU): only the drafts file, from the same prefix through the CPU reference, to check a
// port (torch_head.py) on a machine without a device.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tools/plan_options.h"
#include "core/error.h"
#include "core/files.h"
#include <tfe/head_file.h>
#include <tfe/header.h>
#include "core/numeric.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "reference/ops.h"
#include <tfe/reference.h>
#include <tfe/runtime.h>
#include "runtime/testing.h"

namespace {

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
  int l2_resident_mb = 0;              // OpenOptions::l2_resident_weight_bytes, in MiB
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

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// "1,2,4", "1..8" or a mix ("1,4..6"): ascending, distinct, each inside [lo, hi].
std::vector<int> parse_list(std::string_view option, const std::string& text, int lo, int hi) {
  std::vector<int> out;
  auto number = [&](std::string_view s) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty())
      tfe::fail("{} `{}`: `{}` is not an integer", option, text, s);
    if (v < lo || v > hi) tfe::fail("{} `{}`: {} is outside {}..{}", option, text, v, lo, hi);
    return v;
  };
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t dots = item.find("..");
    if (dots == std::string_view::npos) {
      out.push_back(number(item));
    } else {
      const int a = number(item.substr(0, dots)), b = number(item.substr(dots + 2));
      if (a > b) tfe::fail("{} `{}`: range {}..{} is empty", option, text, a, b);
      for (int v = a; v <= b; ++v) out.push_back(v);
    }
  }
  if (out.empty()) tfe::fail("{} is empty", option);
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i] <= out[i - 1]) tfe::fail("{} `{}`: values must ascend without repeats", option, text);
  return out;
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0, min = 0;
  int n = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)]; };
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p10 = at(0.1);
  s.p90 = at(0.9);
  s.min = v.front();
  s.n = static_cast<int>(v.size());
  return s;
}

json to_json(const Stats& s) {
  return {{"median", s.median}, {"p10", s.p10}, {"p90", s.p90}, {"min", s.min}, {"n", s.n}};
}

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

CopyBandwidth copy_bandwidth(double gib, int reps) {
  namespace cuda = tfe::cuda;
  const auto bytes = static_cast<size_t>(gib * static_cast<double>(size_t{1} << 30));
  if (bytes < (size_t{1} << 20)) tfe::fail("--copy-gib {} is below 1 MiB", gib);
  const cuda::DeviceMemory src = cuda::allocate_device(bytes, "copy-bandwidth source");
  const cuda::DeviceMemory dst = cuda::allocate_device(bytes, "copy-bandwidth destination");
  const cuda::Stream stream = cuda::create_stream();
  const cuda::Event start = cuda::create_event(true), stop = cuda::create_event(true);
  TFE_CUDA(cudaMemsetAsync(src.data(), 0x3c, bytes, stream.get()));
  TFE_CUDA(cudaMemsetAsync(dst.data(), 0, bytes, stream.get()));  // first touch outside the timing
  std::vector<double> ms;
  for (int i = 0; i < reps + 2; ++i) {  // two untimed warm-up copies
    TFE_CUDA(cudaEventRecord(start.get(), stream.get()));
    TFE_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
    TFE_CUDA(cudaEventRecord(stop.get(), stream.get()));
    TFE_CUDA(cudaEventSynchronize(stop.get()));
    float t = 0;
    TFE_CUDA(cudaEventElapsedTime(&t, start.get(), stop.get()));
    if (i >= 2) ms.push_back(t);
  }
  CopyBandwidth c;
  c.ms = stats_of(ms);
  c.bytes = static_cast<int64_t>(2 * bytes);
  c.gbps = static_cast<double>(c.bytes) / (c.ms.median * 1e-3) / 1e9;
  return c;
}

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

CallFloor call_floor(size_t upload_bytes, size_t download_bytes, int reps) {
  namespace cuda = tfe::cuda;
  const cuda::PinnedMemory host = cuda::allocate_pinned(upload_bytes + download_bytes, "call-floor staging");
  const cuda::DeviceMemory dev = cuda::allocate_device(upload_bytes + download_bytes, "call-floor buffers");
  const cuda::Stream stream = cuda::create_stream();
  cudaGraph_t g = nullptr;
  TFE_CUDA(cudaGraphCreate(&g, 0));
  const cuda::Graph graph(g);
  cudaGraphNode_t node = nullptr;
  TFE_CUDA(cudaGraphAddEmptyNode(&node, graph.get(), nullptr, 0));
  cudaGraphExec_t e = nullptr;
  TFE_CUDA(cudaGraphInstantiate(&e, graph.get(), 0));
  const cuda::GraphExec exec(e);
  auto* h = static_cast<std::byte*>(host.data());
  auto* d = static_cast<std::byte*>(dev.data());
  const size_t half = download_bytes / 2;
  const auto upload = [&] { TFE_CUDA(cudaMemcpyAsync(d, h, upload_bytes, cudaMemcpyHostToDevice, stream.get())); };
  const auto launch = [&] { TFE_CUDA(cudaGraphLaunch(exec.get(), stream.get())); };
  const auto download = [&] {
    TFE_CUDA(cudaMemcpyAsync(h + upload_bytes, d + upload_bytes, half, cudaMemcpyDeviceToHost, stream.get()));
    TFE_CUDA(cudaMemcpyAsync(h + upload_bytes + half, d + upload_bytes + half, download_bytes - half,
                             cudaMemcpyDeviceToHost, stream.get()));
  };
  const auto timed = [&](const auto& work) {
    std::vector<double> us;
    for (int i = 0; i < reps + 10; ++i) {  // ten untimed
      const auto t0 = Clock::now();
      work();
      TFE_CUDA(cudaStreamSynchronize(stream.get()));
      if (i >= 10) us.push_back(ms_since(t0) * 1e3);
    }
    return stats_of(us);
  };
  CallFloor f;
  f.launch = timed(launch);
  f.upload = timed(upload);
  f.download = timed(download);
  f.with_copies = timed([&] {
    upload();
    launch();
    download();
  });
  return f;
}

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

Prefix make_prefix(const tfe::HeadHeader& h, int slots, int64_t rows, uint64_t seed) {
  Prefix p;
  p.slots = slots;
  p.rows = rows;
  p.row_width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  p.taps.resize(static_cast<size_t>(slots * rows * p.row_width));
  p.tokens.resize(static_cast<size_t>(slots * rows));
  Draws d(seed);
  d.fill(p.taps);
  for (auto& t : p.tokens) t = d.token(h.vocab);
  return p;
}

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

std::vector<int> first_slots(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

double time_draft_us(tfe::Runtime& rt, std::span<const int> slots, int steps) {
  const auto t0 = Clock::now();
  (void)rt.draft(slots, steps);
  return ms_since(t0) * 1e3;
}

Stats time_draft(tfe::Runtime& rt, std::span<const int> slots, int steps, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) (void)rt.draft(slots, steps);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) us.push_back(time_draft_us(rt, slots, steps));
  return stats_of(us);
}

// Least-squares line y = a + b x.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  const double b = sxx > 0 ? sxy / sxx : 0.0;
  return {my - b * mx, b};
}

// The linears that run in their FP8 form under the plan (the reference's rule: the mode is not `off`
// and the file holds the form).
std::vector<std::string> fp8_linears(const tfe::Plan& plan) {
  std::vector<std::string> out;
  if (!plan.fp8) return out;
  for (const auto& l : tfe::linears_in_use(plan.header))
    if (plan.options.fp8 != tfe::Fp8Mode::off && plan.header.has_fp8(l)) out.push_back(l);
  return out;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// The prefix inputs and the drafts of slots 0..B-1, in the layout of `tfe-plan reference` vectors (taps,
// tokens, positions, slots, draft_tokens, confidences), which bench/torch_head.py replays.
void write_drafts(const std::string& path, const Prefix& prefix, const tfe::DraftResult& d,
                  std::map<std::string, std::string> metadata) {
  const int64_t B = prefix.slots, N = prefix.rows, S = d.steps;
  if (d.streams != B) tfe::fail("drafts of {} slots for a prefix of {} slots", d.streams, B);
  std::vector<int32_t> positions(static_cast<size_t>(B * N)), slot_ids(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    slot_ids[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    for (int64_t i = 0; i < N; ++i) positions[static_cast<size_t>(b * N + i)] = static_cast<int32_t>(i);
  }
  const std::vector<tfe::SafetensorsEntry> entries = {
      {"taps", tfe::DType::BF16, {B, N, prefix.row_width}, bytes_of(prefix.taps)},
      {"tokens", tfe::DType::I32, {B, N}, bytes_of(prefix.tokens)},
      {"positions", tfe::DType::I32, {B, N}, bytes_of(positions)},
      {"slots", tfe::DType::I32, {B}, bytes_of(slot_ids)},
      {"draft_tokens", tfe::DType::I32, {B, S}, bytes_of(d.tokens)},
      {"confidences", tfe::DType::F32, {B, S}, bytes_of(d.confidences)},
  };
  metadata["tfe.streams"] = std::to_string(B);
  metadata["tfe.rows"] = std::to_string(N);
  metadata["tfe.steps"] = std::to_string(S);
  tfe::write_safetensors(path, metadata, entries);
}

// --reference: the same prefix and drafts through the CPU reference (no GPU): a drafts file to check a
// PyTorch port against, made by the same code as the GPU run's.
int run_reference(const Options& o, const std::vector<int>& streams) {
  if (o.drafts_out.empty()) tfe::fail("--reference writes --drafts-out and nothing else: give --drafts-out");
  const tfe::HeadFile file = tfe::HeadFile::open(o.head);
  const tfe::HeadHeader& h = file.header();
  tfe::ReferenceOptions ro;
  ro.max_slots = streams.back();
  ro.max_steps = 8;
  ro.fp8 = tfe::fp8_mode_from_name(o.fp8);
  tfe::Reference ref(file, ro);
  const Prefix prefix = make_prefix(h, streams.back(), h.window + 1, o.seed);
  const auto t0 = Clock::now();
  extend_prefix(ref, prefix);
  const tfe::DraftResult d = ref.draft(first_slots(streams.back()), ro.max_steps);
  std::vector<std::string> fp8;
  for (const auto& l : tfe::linears_in_use(h))
    if (ref.uses_fp8(l)) fp8.push_back(l);
  write_drafts(o.drafts_out, prefix, d,
               {{"tfe.source", "tfe-bench --reference: CPU reference"},
                {"tfe.head_sha256", file.header_sha256()},
                {"tfe.seed", std::to_string(o.seed)},
                {"tfe.fp8", std::string(tfe::fp8_mode_name(ro.fp8))},
                {"tfe.fp8_linears", fmt::format("{}", fmt::join(fp8, ","))},
                {"tfe.ring_rows", std::to_string(ref.ring_rows())}});
  fmt::print("{}: {} slots x {} rows, {} steps through the CPU reference in {:.0f} ms; slot 0 drafts {}\n",
             o.drafts_out, prefix.slots, prefix.rows, d.steps, ms_since(t0),
             fmt::join(std::span<const int32_t>(d.tokens).first(static_cast<size_t>(d.steps)), " "));
  return 0;
}

struct DraftRow {
  int streams = 0;
  int steps = 0;
  std::optional<Stats> graph, eager;
  double floor_us = 0;  // per step
  int64_t step_bytes = 0;
};

int run(const Options& o) {
  json out;
  json errors = json::object();
  Parts parts(errors);
  out["tool"] = "tfe-bench";
  out["head"] = o.head;

  const std::vector<int> streams = parse_list("--streams", o.streams, 1, 16);
  const std::vector<int> steps = parse_list("--steps", o.steps, 1, 16);
  if (o.iters < 1 || o.warmup < 0 || o.extend_iters < 1)
    tfe::fail("--iters {} / --warmup {} / --extend-iters {}: need iters >= 1, warmup >= 0, extend-iters >= 1", o.iters,
              o.warmup, o.extend_iters);
  const int max_streams = streams.back();

  parts.run("device", [&] {
    cudaDeviceProp prop{};
    TFE_CUDA(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    TFE_CUDA(cudaDriverGetVersion(&driver));
    TFE_CUDA(cudaRuntimeGetVersion(&runtime));
    out["device"] = {{"name", prop.name},
                     {"sm", fmt::format("sm_{}{}", prop.major, prop.minor)},
                     {"memory_gib", static_cast<double>(prop.totalGlobalMem) / double(1 << 30)},
                     {"driver", driver},
                     {"runtime", runtime}};
  });

  double bandwidth_gbps = 0;
  parts.run("copy bandwidth", [&] {
    const CopyBandwidth c = copy_bandwidth(o.copy_gib, 10);
    bandwidth_gbps = c.gbps;
    out["copy_bandwidth"] = {
        {"gbps", c.gbps}, {"bytes_per_copy", c.bytes}, {"ms", to_json(c.ms)}, {"counts", "bytes read + bytes written"}};
  });

  parts.run("call floor", [&] {
    // The sizes one draft call of the largest bucket moves: four int32 tables a stream up, and a token
    // and a confidence a stream and step down (runtime/runtime.cpp, Runtime::draft), at 16 steps, the
    // most a plan takes: 1 KB or less either way, well below what a copy's latency would notice.
    const auto up = static_cast<size_t>(4 * max_streams) * sizeof(int32_t);
    const auto down = static_cast<size_t>(max_streams * 16) * (sizeof(int32_t) + sizeof(float));
    const CallFloor f = call_floor(up, down, 200);
    out["call_floor"] = {{"empty_graph_launch_us", to_json(f.launch)},
                         {"copy_upload_us", to_json(f.upload)},
                         {"copy_download_us", to_json(f.download)},
                         {"launch_with_copies_us", to_json(f.with_copies)},
                         {"upload_bytes", up},
                         {"download_bytes", down}};
  });

  tfe::OpenOptions open;
  open.artifact_dir = o.artifact;
  if (o.artifact.empty()) {
    tfe::PlanOptions p = o.plan;
    p.fp8 = tfe::fp8_mode_from_name(o.fp8);
    open.plan = p;
  }
  open.capture = tfe::OpenOptions::Capture::lazy;
  tfe::testing::Hooks hooks;
  using Dependent = tfe::testing::Hooks::DependentLaunch;
  hooks.dependent_launch = o.dependent_launch == "all"   ? Dependent::all
                           : o.dependent_launch == "off" ? Dependent::off
                                                         : Dependent::plan;
  hooks.knock_out = o.knock_out;
  hooks.tuning = o.tuning;
  open.l2_resident_weight_bytes = static_cast<size_t>(o.l2_resident_mb) << 20;
  if (!o.knock_out.empty())
    fmt::print(
        "knock-out: {} left out of every draft pass; the drafts are wrong, the times are what the rest "
        "costs\n",
        fmt::join(o.knock_out, ", "));

  std::optional<tfe::Runtime> rt;
  parts.run("open", [&] {
    const auto t0 = Clock::now();
    rt.emplace(tfe::testing::open(o.head, open, hooks));
    out["open_ms"] = ms_since(t0);
    out["open_capture"] = "lazy";
    out["dependent_launch"] = o.dependent_launch;
    out["knock_out"] = o.knock_out;
    out["l2_resident_mb"] = o.l2_resident_mb;
    out["l2_set_aside_bytes"] = rt->stats().l2_set_aside;
    if (o.l2_resident_mb > 0)
      fmt::print(
          "L2: {:.1f} MiB set aside for weights kept from one step to the next (asked {} MiB); the floor "
          "still counts every weight byte from HBM\n",
          static_cast<double>(rt->stats().l2_set_aside) / (1 << 20), o.l2_resident_mb);
    const tfe::Tuning& t = tfe::testing::plan(*rt).tuning;
    out["dependent_streams"] = t.dependent_streams;
    out["dependent_streams_fp8"] = t.dependent_streams_fp8;
    out["dependent_safe_nodes"] = t.dependent_safe_nodes;
    out["rope_in_wqkv"] = t.rope_in_wqkv;
    out["gemv_cluster"] = t.gemv_cluster;
    out["tiled_weights"] = t.tiled_weights;
    out["attention_split"] = std::string(tfe::attention_split_name(tfe::testing::plan(*rt).options.attention_split));
  });
  if (!rt) {
    out["errors"] = errors;
    if (!o.json_out.empty()) tfe::files::write_atomic(o.json_out, out.dump(2) + "\n", "--json");
    return 1;
  }

  // Copies: the first runtime is destroyed before the second opens, and the report still needs them.
  const tfe::Plan plan = tfe::testing::plan(*rt);
  const tfe::HeadHeader& h = plan.header;
  const std::vector<std::string> fp8_in_use = fp8_linears(plan);
  out["preset"] = h.name;
  out["head_type"] = std::string(tfe::head_type_name(h.head_type));
  out["fp8_mode"] = std::string(tfe::fp8_mode_name(plan.options.fp8));
  out["fp8"] = plan.fp8;
  out["fp8_linears"] = fp8_in_use;
  out["dtype"] = plan.fp8 ? "fp8" : "bf16";
  out["window"] = h.window;
  out["ring_rows"] = rt->ring_rows();
  out["buckets"] = plan.options.buckets;
  out["max_steps"] = plan.options.max_steps;
  out["weight_bytes"] = rt->stats().weight_bytes;
  out["graphs"] = rt->graphs_enabled();

  const int max_bucket = plan.options.buckets.back();
  if (max_streams > max_bucket || max_streams + 1 > plan.options.max_slots)
    tfe::fail(
        "--streams {} exceeds the plan: largest bucket {}, max_slots {} (one more slot is used for extend timing)",
        max_streams, max_bucket, plan.options.max_slots);
  for (int s : steps)
    if (s > plan.options.max_steps) tfe::fail("--steps {} exceeds the plan's max_steps {}", s, plan.options.max_steps);

  // The window's W + 1 keys, all real: every draft step attends a full window.
  const int64_t prefix_rows = h.window + 1;
  out["prefix_rows"] = prefix_rows;
  Prefix prefix;
  parts.run("inputs", [&] { prefix = make_prefix(h, max_streams, prefix_rows, o.seed); });
  bool prefilled = parts.run("prefix extend", [&] { extend_prefix(*rt, prefix); });

  // Graph capture, key by key: the first draft of a key captures (and replays once), the second replays.
  if (prefilled && rt->graphs_enabled() && !o.profile) {
    parts.run("capture", [&] {
      const uint64_t before = rt->stats().captures;
      double first_ms = 0, capture_ms = 0;
      json keys = json::array();
      for (int b : plan.options.buckets) {
        if (b > max_streams) break;  // the prefix fills max_streams slots
        const std::vector<int> slots = first_slots(b);
        for (int s = 1; s <= plan.options.max_steps; ++s) {
          const double first = time_draft_us(*rt, slots, s) * 1e-3;
          const double second = time_draft_us(*rt, slots, s) * 1e-3;
          first_ms += first;
          capture_ms += first - second;
          keys.push_back({{"streams", b}, {"steps", s}, {"first_ms", first}, {"replay_ms", second}});
        }
      }
      out["capture"] = {{"graphs", rt->stats().captures - before},
                        {"capture_ms", capture_ms},
                        {"first_drafts_ms", first_ms},
                        {"how", "sum over keys of (first draft - second draft): capture and instantiation"},
                        {"keys", keys}};
    });
  }

  if (o.profile) {
    if (!prefilled) return 1;
    for (int b : streams) {
      const std::vector<int> slots = first_slots(b);
      for (int i = 0; i < 3; ++i) (void)rt->draft(slots, 1);  // capture and warm outside the profiled range
      TFE_CUDA(cudaProfilerStart());
      (void)rt->draft(slots, 1);
      TFE_CUDA(cudaProfilerStop());
    }
    return 0;
  }

  std::vector<DraftRow> rows;
  for (int b : streams)
    for (int s : steps) {
      DraftRow r;
      r.streams = b;
      r.steps = s;
      const tfe::StepBytes sb = tfe::step_bytes(h, b, plan.fp8);
      r.step_bytes = sb.total();
      r.floor_us = bandwidth_gbps > 0 ? static_cast<double>(sb.total()) / (bandwidth_gbps * 1e9) * 1e6 : 0.0;
      rows.push_back(r);
    }

  if (prefilled) {
    parts.run("draft (graphs)", [&] {
      for (auto& r : rows) r.graph = time_draft(*rt, first_slots(r.streams), r.steps, o.warmup, o.iters);
    });
  }

  // Extend of one slot beyond the prefix slots; positions continue call after call.
  if (prefilled) {
    parts.run("extend", [&] {
      const int slot = max_streams;
      const int64_t width = prefix.row_width;
      Draws d(o.seed + 1);
      int64_t pos = 0;
      json ext = json::array();
      const int64_t ring = rt->ring_rows();
      for (int64_t want : {int64_t{1}, int64_t{16}, int64_t{512}}) {
        const int64_t n = std::min(want, ring);
        std::vector<tfe::bf16_bits> taps(static_cast<size_t>(n * width));
        d.fill(taps);
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (auto& t : tokens) t = d.token(h.vocab);
        std::vector<double> us;
        for (int i = 0; i < o.extend_iters + 2; ++i) {  // two untimed warm-up calls
          const tfe::ExtendRequest q{slot, pos, n, taps, tokens};
          const auto t0 = Clock::now();
          rt->extend({&q, 1});
          rt->synchronize();
          if (i >= 2) us.push_back(ms_since(t0) * 1e3);
          pos += n;
        }
        json e = {{"rows", n}, {"us", to_json(stats_of(us))}};
        if (n != want)
          e["note"] = fmt::format("{} rows asked; the ring holds {} rows, the most one extend takes", want, ring);
        ext.push_back(std::move(e));
      }
      out["extend"] = ext;
    });
  }

  // Drafts for the fixed input set, and tfe's own consistency: every bucket drafts the same tokens for
  // the same slots.
  json checks = json::object();
  std::vector<int32_t> graph_tokens;
  if (prefilled) {
    parts.run("drafts", [&] {
      const int S = plan.options.max_steps < 8 ? plan.options.max_steps : 8;
      const std::vector<int> slots = first_slots(max_streams);
      const tfe::DraftResult d = rt->draft(slots, S);
      graph_tokens = d.tokens;
      // Where a bucket's drafts leave the largest bucket's: each slot's first step that differs (the steps
      // after it draft from another token), with both tokens and confidences, to judge whether it is a
      // near-tie that another order of fp32 sums moved.
      json differences = json::array();
      for (int b : streams) {
        const tfe::DraftResult db = rt->draft(first_slots(b), S);
        for (int i = 0; i < b; ++i)
          for (int s = 1; s <= S; ++s)
            if (db.token(i, s) != d.token(i, s)) {
              differences.push_back({{"streams", b},
                                     {"slot", i},
                                     {"step", s},
                                     {"token", db.token(i, s)},
                                     {"confidence", db.confidence(i, s)},
                                     {"token_at_max_streams", d.token(i, s)},
                                     {"confidence_at_max_streams", d.confidence(i, s)}});
              break;
            }
      }
      checks["drafts_same_in_every_bucket"] = differences.empty();
      if (!differences.empty()) out["bucket_draft_differences"] = std::move(differences);
      if (o.drafts_out.empty()) return;
      write_drafts(o.drafts_out, prefix, d,
                   {{"tfe.source",
                     rt->graphs_enabled() ? "tfe-bench: GPU runtime, graph replay" : "tfe-bench: GPU runtime, eager"},
                    {"tfe.head_sha256", plan.head_sha256},
                    {"tfe.seed", std::to_string(o.seed)},
                    {"tfe.fp8", std::string(tfe::fp8_mode_name(plan.options.fp8))},
                    {"tfe.fp8_linears", fmt::format("{}", fmt::join(fp8_in_use, ","))},
                    {"tfe.ring_rows", std::to_string(rt->ring_rows())}});
      out["drafts_out"] = o.drafts_out;
    });
  }
  out["stats_graph_runtime"] = {{"replays", rt->stats().replays},
                                {"captures", rt->stats().captures},
                                {"graph_updates", rt->stats().graph_updates},
                                {"extend_chunks", rt->stats().extend_chunks}};
  rt.reset();  // frees the first runtime's device memory before the second opens

  // The same passes launched node by node: what the graphs save.
  if (o.eager) {
    std::optional<tfe::Runtime> eager;
    tfe::OpenOptions eo = open;
    eo.graphs = false;
    parts.run("open (eager)", [&] {
      const auto t0 = Clock::now();
      eager.emplace(tfe::testing::open(o.head, eo, hooks));
      out["open_eager_ms"] = ms_since(t0);
    });
    if (eager && parts.run("prefix extend (eager)", [&] { extend_prefix(*eager, prefix); })) {
      parts.run("draft (eager)", [&] {
        for (auto& r : rows) r.eager = time_draft(*eager, first_slots(r.streams), r.steps, o.warmup, o.iters);
      });
      parts.run("eager drafts", [&] {
        if (graph_tokens.empty()) return;
        const int S = plan.options.max_steps < 8 ? plan.options.max_steps : 8;
        const tfe::DraftResult d = eager->draft(first_slots(max_streams), S);
        checks["eager_equals_graph"] = d.tokens == graph_tokens;
      });
    }
  }
  out["checks"] = checks;

  // Per streams: the fixed cost of a call and the marginal cost of a step, from the line over steps.
  json lines = json::array();
  for (int b : streams) {
    std::vector<double> x, yg, ye;
    for (const auto& r : rows)
      if (r.streams == b && r.graph) {
        x.push_back(r.steps);
        yg.push_back(r.graph->median);
        if (r.eager) ye.push_back(r.eager->median);
      }
    if (x.size() < 2) continue;
    const auto [g0, g1] = fit_line(x, yg);
    json l = {{"streams", b}, {"graph_call_fixed_us", g0}, {"graph_step_us", g1}};
    const tfe::StepBytes sb = tfe::step_bytes(h, b, plan.fp8);
    if (bandwidth_gbps > 0) {
      const double floor = static_cast<double>(sb.total()) / (bandwidth_gbps * 1e9) * 1e6;
      l["floor_us"] = floor;
      l["graph_step_ratio"] = g1 / floor;
    }
    if (ye.size() == x.size()) {
      const auto [e0, e1] = fit_line(x, ye);
      l["eager_call_fixed_us"] = e0;
      l["eager_step_us"] = e1;
    }
    lines.push_back(std::move(l));
  }
  out["per_streams"] = lines;

  json draft = json::array();
  for (const auto& r : rows) {
    json j = {
        {"streams", r.streams}, {"steps", r.steps}, {"step_bytes", r.step_bytes}, {"floor_us_per_step", r.floor_us}};
    if (r.graph) {
      j["graph_call_us"] = to_json(*r.graph);
      j["graph_us_per_step"] = r.graph->median / r.steps;
      if (r.floor_us > 0) j["ratio"] = r.graph->median / r.steps / r.floor_us;
    }
    if (r.eager) {
      j["eager_call_us"] = to_json(*r.eager);
      j["eager_us_per_step"] = r.eager->median / r.steps;
    }
    draft.push_back(std::move(j));
  }
  out["draft"] = draft;
  out["errors"] = errors;

  // The table.
  fmt::print("\n{} ({}, {}), copy bandwidth {:.0f} GB/s, prefix {} rows/slot, ring {} rows\n", h.name,
             out["dtype"].get<std::string>(), out["fp8_mode"].get<std::string>(), bandwidth_gbps, prefix_rows,
             out["ring_rows"].get<int>());
  if (out.contains("open_ms"))
    fmt::print("open {:.1f} ms (lazy capture); capture of every graph {} ms; open with graphs off {} ms\n",
               out["open_ms"].get<double>(),
               out.contains("capture") ? fmt::format("{:.1f}", out["capture"]["capture_ms"].get<double>()) : "-",
               out.contains("open_eager_ms") ? fmt::format("{:.1f}", out["open_eager_ms"].get<double>()) : "-");
  fmt::print("{:>7} {:>5} {:>12} {:>10} {:>10} {:>7} {:>12} {:>11}\n", "streams", "steps", "graph us", "us/step",
             "floor us", "ratio", "eager us/st", "eager/graph");
  for (const auto& r : rows) {
    const auto cell = [](const std::optional<Stats>& s, double div) {
      return s ? fmt::format("{:.1f}", s->median / div) : std::string("-");
    };
    const std::string ratio =
        r.graph && r.floor_us > 0 ? fmt::format("{:.2f}", r.graph->median / r.steps / r.floor_us) : std::string("-");
    const std::string speedup =
        r.graph && r.eager ? fmt::format("{:.2f}", r.eager->median / r.graph->median) : std::string("-");
    fmt::print("{:>7} {:>5} {:>12} {:>10} {:>10.1f} {:>7} {:>12} {:>11}\n", r.streams, r.steps, cell(r.graph, 1),
               cell(r.graph, r.steps), r.floor_us, ratio, cell(r.eager, r.steps), speedup);
  }
  for (const auto& l : lines)
    fmt::print("streams {:>2}: graph call = {:.1f} us + {:.1f} us/step{}\n", l["streams"].get<int>(),
               l["graph_call_fixed_us"].get<double>(), l["graph_step_us"].get<double>(),
               l.contains("graph_step_ratio")
                   ? fmt::format(" (marginal step / floor = {:.2f})", l["graph_step_ratio"].get<double>())
                   : std::string());
  if (out.contains("call_floor")) {
    const json& f = out["call_floor"];
    fmt::print(
        "a call without kernels (an empty graph's launch and wait): {:.1f} us; with a copy-engine upload "
        "and two downloads, which a call does not make: {:.1f} us (each alone with its wait: upload {:.1f}, "
        "downloads {:.1f})\n",
        f["empty_graph_launch_us"]["median"].get<double>(), f["launch_with_copies_us"]["median"].get<double>(),
        f["copy_upload_us"]["median"].get<double>(), f["copy_download_us"]["median"].get<double>());
  }
  if (out.contains("extend"))
    for (const auto& e : out["extend"])
      fmt::print("extend {:>4} rows: {:.1f} us{}\n", e["rows"].get<int64_t>(), e["us"]["median"].get<double>(),
                 e.contains("note") ? " (" + e["note"].get<std::string>() + ")" : std::string());
  if (!checks.empty()) fmt::print("checks: {}\n", checks.dump());
  if (out.contains("bucket_draft_differences"))
    for (const auto& e : out["bucket_draft_differences"])
      fmt::print("  bucket {} slot {} step {}: token {} (conf {:.4f}), at {} streams {} (conf {:.4f})\n",
                 e["streams"].get<int>(), e["slot"].get<int>(), e["step"].get<int>(), e["token"].get<int>(),
                 e["confidence"].get<double>(), max_streams, e["token_at_max_streams"].get<int>(),
                 e["confidence_at_max_streams"].get<double>());
  std::fflush(stdout);

  if (!o.json_out.empty()) tfe::files::write_atomic(o.json_out, out.dump(2) + "\n", "--json");
  if (!o.csv_out.empty()) {
    std::string f;
    f += "preset,dtype,streams,steps,graph_us,graph_us_per_step,eager_us,eager_us_per_step,floor_us_per_step,ratio,"
         "step_bytes\n";
    for (const auto& r : rows) {
      auto num = [](bool have, double v) { return have ? fmt::format("{:.3f}", v) : std::string(); };
      f += fmt::format(
          "{},{},{},{},{},{},{},{},{:.3f},{},{}\n", h.name, out["dtype"].get<std::string>(), r.streams, r.steps,
          num(bool(r.graph), r.graph ? r.graph->median : 0),
          num(bool(r.graph), r.graph ? r.graph->median / r.steps : 0),
          num(bool(r.eager), r.eager ? r.eager->median : 0),
          num(bool(r.eager), r.eager ? r.eager->median / r.steps : 0), r.floor_us,
          num(r.graph && r.floor_us > 0, r.graph && r.floor_us > 0 ? r.graph->median / r.steps / r.floor_us : 0),
          r.step_bytes);
    }
    tfe::files::write_atomic(o.csv_out, f, "--csv");
  }
  return parts.any_failed() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tfe-bench: draft-pass time per (streams, steps) against the memory floor, eager vs graph, extend, "
      "open and capture"};
  app.add_option("--head", o.head, "head file (.tfe)")->required();
  CLI::Option* artifact = app.add_option("--artifact", o.artifact,
                                         "deploy artifact directory (tfe-plan compile); else plan and compile now");
  app.add_option("--fp8", o.fp8, "FP8 mode without an artifact: auto, off, require")
      ->check(CLI::IsMember({"auto", "off", "require"}));
  app.add_option("--dependent-launch", o.dependent_launch,
                 "programmatic dependent launch of the draft kernels: plan (where the plan marks it), off, all")
      ->check(CLI::IsMember({"plan", "off", "all"}));
  app.add_option("--l2-resident-mb", o.l2_resident_mb,
                 "MiB of L2 set aside so that part of the draft GEMVs' weights stays in L2 from one step to the "
                 "next (0: none)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--knock-out", o.knock_out,
                 "draft nodes (names without the step prefix, e.g. post_norm,final_norm) left out of every pass, "
                 "to time what the rest costs; the drafts are then wrong")
      ->delimiter(',');
  // The attention split and the tuning as tfe-plan declares them; an artifact's plan is fixed when it is
  // compiled (tfe-plan compile --dependent-streams ...), so beside --artifact they are refused, not ignored.
  tfe::cli::add_attention_split_option(&app, o.plan)->excludes(artifact);
  for (CLI::Option* option : tfe::cli::add_plan_tuning_options(&app, o.tuning)) option->excludes(artifact);
  app.add_option("--streams", o.streams, "slots per draft call: a list (1,2,4) or range (1..4)");
  app.add_option("--steps", o.steps, "draft steps per call: a list or range");
  app.add_option("--iters", o.iters, "timed calls per (streams, steps)");
  app.add_option("--warmup", o.warmup, "untimed calls before them");
  app.add_option("--extend-iters", o.extend_iters, "timed extend calls per size");
  app.add_option("--copy-gib", o.copy_gib, "size of the device-to-device copy that measures bandwidth");
  app.add_option("--seed", o.seed, "seed of the prefix taps and tokens");
  app.add_flag("!--no-eager", o.eager, "skip the runtime with graphs off");
  app.add_option("--json", o.json_out, "write the results as JSON");
  app.add_option("--csv", o.csv_out, "write the draft rows as CSV");
  app.add_option("--drafts-out", o.drafts_out,
                 "write the prefix inputs and tfe's drafts (safetensors, tfe-plan reference layout)");
  app.add_flag("--profile", o.profile,
               "one draft step per --streams value inside cudaProfilerStart/Stop (for ncu --profile-from-start off)");
  bool reference = false;
  app.add_flag("--reference", reference,
               "no GPU: only --drafts-out, through the CPU reference (the largest --streams slots, 8 steps)");
  CLI11_PARSE(app, argc, argv);
  // The outputs follow tfe-plan's rule (core/files.h), checked before the GPU or the head is touched.
  try {
    const std::vector<std::filesystem::path> inputs = {o.head, o.artifact};
    for (const auto& [flag, path] :
         {std::pair{"--json", &o.json_out}, {"--csv", &o.csv_out}, {"--drafts-out", &o.drafts_out}})
      if (!path->empty()) tfe::files::check_output(*path, flag, inputs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-bench: %s\n", e.what());
    return 1;
  }

  if (reference) {
    try {
      return run_reference(o, parse_list("--streams", o.streams, 1, 16));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tfe-bench: %s\n", e.what());
      return 1;
    }
  }
  if (tfe::cuda::device_count() == 0) {
    std::fprintf(stderr, "tfe-bench: no CUDA device found; the benchmark needs a GPU\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-bench: %s\n", e.what());
    return 1;
  }
}
