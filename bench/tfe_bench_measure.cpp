// tfe-bench's measurements: statistics, copy bandwidth, the floor of a call, the prefix, draft timing, the
// line over steps and the drafts file.
#include <algorithm>
#include <charconv>
#include <numeric>

#include <fmt/format.h>

#include "bench/tfe_bench.h"
#include "core/error.h"
#include "core/files.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "reference/ops.h"

namespace tfe::bench {

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

std::vector<std::string> fp8_linears(const tfe::Plan& plan) {
  std::vector<std::string> out;
  if (!plan.fp8) return out;
  for (const auto& l : tfe::linears_in_use(plan.header))
    if (plan.options.fp8 != tfe::Fp8Mode::off && plan.header.has_fp8(l)) out.push_back(l);
  return out;
}

namespace {
template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}
}  // namespace

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

}  // namespace tfe::bench
