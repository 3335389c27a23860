// bench_gemv: the gemv kernel alone at the llama3-8b-eagle3 linears (and, with --linears, tfe-two-stage's
// lr_a and lr_b), against the memory floor.
//
// Each specialization is compiled through tfe's compiler and kernel cache and launched as the runtime
// launches it (kernels/gemv.h, one 8-byte slot per described parameter). Per (shape, weight
// kind, ROWS), with rows = ROWS:
//   check   fresh random weights, row scales, x and residual; the output against an fp32 host computation
//           of the same epilogue: max |y - ref| / max |ref| under 1e-2 (bf16 outputs) or 1e-4 (f32 logits).
//   time    200 launches captured in one CUDA graph, rotating among enough copies of the weights that
//           together exceed twice the L2, so every launch streams its weights from HBM; events around
//           the replay, best of 5 replays, divided by 200.
//   floor   weight bytes / copy bandwidth, the copy bandwidth being a cudaMemcpyAsync device-to-device of
//           1 GiB counted as bytes read + written (median of 10).
// Per (shape, weight kind, ROWS, COLS), with --cols choosing COLS (output columns per CTA; SwiGLU runs at 16
// only). The last table sums the chosen linears per (weight kind, ROWS, COLS): for the default five, one
// draft step's gemv time against its floor. Exit status 1 when a check failed.
//
// --shape NAME:K:N:EPILOGUE adds a linear of any shape (e.g. to see how the time follows the CTA count
// against the CTAs resident at once); --dependent launches every GEMV with programmatic dependent launch,
// as the runtime launches a pass's nodes, so that a launch's ring prologue overlaps its predecessor's tail.
//
// --layout rows times the weights row-major instead of tiled (kernels/weight_layout.h), as a plan with
// tuning tiled_weights = false stores them.
//
// --source NAME=FILE replaces an embedded kernel source (e.g. gemv.cuh) with a file's text, so that a
// candidate kernel is measured without rebuilding the library (its launch shape must not change).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "compiler/cache.h"
#include "kernels/registry.h"
#include "compiler/nvrtc.h"
#include "core/error.h"
#include "core/numeric.h"
#include "kernels/weight_layout.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "device/kernels.h"

namespace {

using namespace tfe;

struct Shape {
  std::string name;
  int64_t k, n, epilogue;
};

// The linears of a llama3-8b-eagle3 draft step (N = output columns; SwiGLU reads 2N weight rows), and
// the low-rank scorer of tfe-two-stage (lr_a, lr_b), which --linears may add.
const std::vector<Shape> kCatalog = {
    {"wqkv", 8192, 6144, kc::kEpilogueBF16},         {"wo", 4096, 4096, kc::kEpilogueResidual},
    {"w_gate_up", 4096, 14336, kc::kEpilogueSwiGLU}, {"w_down", 14336, 4096, kc::kEpilogueResidual},
    {"lm_head", 4096, 32000, kc::kEpilogueF32},      {"lr_a", 4096, 512, kc::kEpilogueBF16},
    {"lr_b", 512, 32000, kc::kEpilogueF32},
};

constexpr int kLaunches = 200;
constexpr int kReplays = 5;

struct Result {
  std::string shape, weight;
  int64_t rows = 0, cols = 16;
  double us = 0, bytes = 0, err = 0, tol = 0;
  bool ok = false;
};

float elapsed_ms(const cuda::Event& a, const cuda::Event& b) {
  float ms = 0;
  TFE_CUDA(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return ms;
}

// Device-to-device copy rate of 1 GiB, bytes read + written per second, median of 10.
double copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  auto src = cuda::allocate_device(bytes, "copy source");
  auto dst = cuda::allocate_device(bytes, "copy destination");
  TFE_CUDA(cudaMemsetAsync(src.data(), 1, bytes, stream));
  auto a = cuda::create_event(true), b = cuda::create_event(true);
  std::vector<double> rates;
  for (int i = 0; i < 11; ++i) {
    TFE_CUDA(cudaEventRecord(a.get(), stream));
    TFE_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    TFE_CUDA(cudaEventRecord(b.get(), stream));
    TFE_CUDA(cudaEventSynchronize(b.get()));
    if (i > 0) rates.push_back(2.0 * static_cast<double>(bytes) / (elapsed_ms(a, b) * 1e-3));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

template <typename T>
cuda::DeviceMemory upload(const std::vector<T>& host, cudaStream_t stream, const char* what) {
  auto d = cuda::allocate_device(host.size() * sizeof(T), what);
  TFE_CUDA(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// max |y - ref| / max |ref| over every output, the reference summed in fp32 on the host's threads.
double check_error(const Shape& s, bool fp8, int64_t rows, const std::vector<float>& w, const std::vector<float>& scale,
                   const std::vector<float>& x, const std::vector<float>& residual, const std::vector<float>& y) {
  const int64_t n = s.n, k = s.k;
  std::vector<float> ref(static_cast<size_t>(rows * n));
  auto dot = [&](int64_t row, int64_t r) {
    float acc = 0;
    const float* wr = &w[static_cast<size_t>(row * k)];
    const float* xr = &x[static_cast<size_t>(r * k)];
    for (int64_t i = 0; i < k; ++i) acc += wr[i] * xr[i];
    return fp8 ? acc * scale[static_cast<size_t>(row)] : acc;
  };
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t j = t; j < n; j += threads)
        for (int64_t r = 0; r < rows; ++r) {
          const size_t at = static_cast<size_t>(r * n + j);
          const float v = dot(j, r);
          if (s.epilogue == kc::kEpilogueF32) {
            ref[at] = v;
          } else if (s.epilogue == kc::kEpilogueBF16) {
            ref[at] = round_bf16(v);
          } else if (s.epilogue == kc::kEpilogueResidual) {
            ref[at] = round_bf16(residual[at] + v);
          } else {
            const float gate = round_bf16(v), up = round_bf16(dot(n + j, r));
            ref[at] = round_bf16(round_bf16(silu(gate)) * up);
          }
        }
    });
  for (auto& th : pool) th.join();
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_err = std::max(max_err, static_cast<double>(std::fabs(y[i] - ref[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
  }
  return max_err / std::max(max_ref, 1e-30);
}

struct Bench {
  cudaStream_t stream;
  int64_t l2_bytes;
  CompileOptions options;
  KernelCache cache;
  uint64_t seed = 1;
  bool dependent = false;  // programmatic dependent launch between consecutive GEMVs
  bool tiled = true;       // weights in the tiled layout (kernels/weight_layout.h), as the planner stores them

  // Fresh random weights of one (shape, kind), shared by its ROWS values. splitmix64 rather than a normal
  // distribution: the largest head's weights are 262 MB, and the check needs values, not a distribution.
  struct Weights {
    const Shape* shape = nullptr;
    bool fp8 = false;
    std::vector<uint8_t> bytes;  // as stored: bf16 bits (little-endian) or e4m3
    std::vector<float> w, scale;
  };
  Weights weights_;

  uint64_t next() {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(static_cast<int64_t>(next() >> 40) - (int64_t{1} << 23)) * 0x1p-23f; }

  const Weights& weights(const Shape& s, bool fp8) {
    if (weights_.shape == &s && weights_.fp8 == fp8) return weights_;
    const int64_t w_rows = s.epilogue == kc::kEpilogueSwiGLU ? 2 * s.n : s.n;
    const size_t elems = static_cast<size_t>(w_rows * s.k);
    weights_.shape = &s;
    weights_.fp8 = fp8;
    weights_.w.resize(elems);
    weights_.scale.assign(static_cast<size_t>(w_rows), 1.0f);
    weights_.bytes.resize(elems * (fp8 ? 1 : 2));
    const float w_std = 1.0f / std::sqrt(static_cast<float>(s.k));  // like a trained linear's weights
    if (fp8) {
      // Codes of exponent 4..11 (|w| in 1/8 .. 30), either sign: no NaN codes.
      for (size_t i = 0; i < elems; ++i) {
        const uint64_t r = next();
        const uint8_t code = static_cast<uint8_t>((r & 0x80) | ((4 + ((r >> 8) & 7)) << 3) | ((r >> 16) & 7));
        weights_.bytes[i] = code;
        weights_.w[i] = fp8_e4m3_to_float(code);
      }
      for (auto& v : weights_.scale) v = (1.25f + 0.75f * uniform()) * w_std / 8.0f;
    } else {
      for (size_t i = 0; i < elems; ++i) {
        const bf16_bits b = float_to_bf16(1.7f * w_std * uniform());
        std::memcpy(&weights_.bytes[2 * i], &b, 2);
        weights_.w[i] = bf16_to_float(b);
      }
    }
    return weights_;
  }

  Result run(const Shape& s, int64_t weight, int64_t rows_tile, int64_t cols, const CachedKernel& compiled) {
    const bool fp8 = weight == kc::kWeightFP8;
    const KernelSpec spec = make_spec("gemv", {{"ROWS", rows_tile},
                                               {"K", s.k},
                                               {"N", s.n},
                                               {"WEIGHT", weight},
                                               {"EPILOGUE", s.epilogue},
                                               {"COLS", cols},
                                               {"TILED", tiled}});
    const int64_t rows = rows_tile;
    const Weights& host = weights(s, fp8);
    const std::vector<float>& w = host.w;
    const std::vector<float>& scale = host.scale;
    const size_t w_bytes = host.bytes.size();

    auto bf16_vector = [&](size_t count, std::vector<float>& as_float) {
      std::vector<bf16_bits> v(count);
      as_float.resize(count);
      for (size_t i = 0; i < count; ++i) {
        v[i] = float_to_bf16(2.0f * uniform());
        as_float[i] = bf16_to_float(v[i]);
      }
      return v;
    };
    std::vector<float> x, residual;
    const auto x_bits = bf16_vector(static_cast<size_t>(rows * s.k), x);
    const auto residual_bits = bf16_vector(static_cast<size_t>(rows * s.n), residual);

    // Weight copies: together more than 2x the L2, so no launch finds its weights cached.
    const int64_t copies = std::max<int64_t>(2, (2 * l2_bytes) / static_cast<int64_t>(w_bytes) + 2);
    std::vector<cuda::DeviceMemory> w_dev;
    if (tiled) {
      const int64_t row_bytes = s.k * (fp8 ? 1 : 2);
      std::vector<uint8_t> tiled_bytes(w_bytes);
      tile_rows(host.bytes.data(), static_cast<int64_t>(w_bytes) / row_bytes, row_bytes, tiled_bytes.data());
      w_dev.push_back(upload(tiled_bytes, stream, "weights"));
    } else {
      w_dev.push_back(upload(host.bytes, stream, "weights"));
    }
    for (int64_t c = 1; c < copies; ++c) {
      w_dev.push_back(cuda::allocate_device(w_bytes, "weight copy"));
      TFE_CUDA(cudaMemcpyAsync(w_dev.back().data(), w_dev[0].data(), w_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    auto scale_dev = upload(scale, stream, "scale");
    auto x_dev = upload(x_bits, stream, "x");
    auto residual_dev = upload(residual_bits, stream, "residual");
    const size_t y_bytes = static_cast<size_t>(rows * s.n) * (s.epilogue == kc::kEpilogueF32 ? 4 : 2);
    auto y_dev = cuda::allocate_device(y_bytes, "y");

    auto library = cuda::load_library(compiled.kernel.cubin.data(), compiled.kernel.uri.c_str());
    cudaKernel_t kernel = nullptr;
    TFE_CUDA(cudaLibraryGetKernel(&kernel, library.get(), compiled.kernel.lowered_name.c_str()));
    const LaunchShape shape = launch_shape(spec, rows);
    int device = 0;
    TFE_CUDA(cudaGetDevice(&device));
    cuda::allow_dynamic_smem(kernel, shape.smem, device, compiled.kernel.uri);
    const dim3 grid = cuda::grid_for_rows(shape, rows);
    auto launch = [&](int64_t copy) {
      uint64_t slots[6] = {reinterpret_cast<uint64_t>(w_dev[static_cast<size_t>(copy)].data()),
                           reinterpret_cast<uint64_t>(scale_dev.data()),
                           reinterpret_cast<uint64_t>(x_dev.data()),
                           reinterpret_cast<uint64_t>(y_dev.data()),
                           reinterpret_cast<uint64_t>(residual_dev.data()),
                           static_cast<uint64_t>(rows)};
      TFE_CUDA(cuda::launch_kernel(kernel, grid, shape, slots, stream, dependent));
    };

    // Check first: the output of one launch (y does not alias the residual here).
    launch(0);
    TFE_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> y(static_cast<size_t>(rows * s.n));
    if (s.epilogue == kc::kEpilogueF32) {
      TFE_CUDA(cudaMemcpy(y.data(), y_dev.data(), y_bytes, cudaMemcpyDeviceToHost));
    } else {
      std::vector<bf16_bits> yb(y.size());
      TFE_CUDA(cudaMemcpy(yb.data(), y_dev.data(), y_bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_to_float(yb[i]);
    }
    Result r;
    r.shape = s.name;
    r.weight = fp8 ? "fp8" : "bf16";
    r.rows = rows;
    r.cols = cols;
    r.bytes = static_cast<double>(w_bytes);
    r.err = check_error(s, fp8, rows, w, scale, x, residual, y);
    r.tol = s.epilogue == kc::kEpilogueF32 ? 1e-4 : 1e-2;
    r.ok = r.err < r.tol;

    // Time: kLaunches launches in one graph, rotating over the copies.
    cudaGraph_t raw = nullptr;
    TFE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kLaunches; ++i) launch(i % copies);
    TFE_CUDA(cudaStreamEndCapture(stream, &raw));
    cuda::Graph graph(raw);
    cudaGraphExec_t raw_exec = nullptr;
    TFE_CUDA(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
    cuda::GraphExec exec(raw_exec);
    auto a = cuda::create_event(true), b = cuda::create_event(true);
    TFE_CUDA(cudaGraphLaunch(exec.get(), stream));  // warm-up
    double best = 1e30;
    for (int i = 0; i < kReplays; ++i) {
      TFE_CUDA(cudaEventRecord(a.get(), stream));
      TFE_CUDA(cudaGraphLaunch(exec.get(), stream));
      TFE_CUDA(cudaEventRecord(b.get(), stream));
      TFE_CUDA(cudaEventSynchronize(b.get()));
      best = std::min(best, static_cast<double>(elapsed_ms(a, b)));
    }
    r.us = best * 1e3 / kLaunches;
    return r;
  }
};

// The items of a `sep`-separated option.
std::vector<std::string> split_list(const std::string& text, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

std::vector<int64_t> parse_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(text)) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      fail("--{}: `{}` is not an integer", what, item);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gemv alone at the llama3-8b-eagle3 linears: time, bandwidth against copy speed, and a check"};
  std::string rows_text = "1,2,4,8,16", weights_text = "bf16,fp8", cols_text = "16", label = "gemv";
  std::string linears_text = "wqkv,wo,w_gate_up,w_down,lm_head", layout = "tiled";
  std::vector<std::string> sources, extra_shapes;
  bool dependent = false;
  app.add_option("--rows", rows_text, "ROWS values (rows = ROWS), comma-separated");
  app.add_option("--weights", weights_text, "weight kinds: bf16, fp8, comma-separated");
  app.add_option("--cols", cols_text, "COLS values (output columns per CTA: 16, 32), comma-separated");
  app.add_option("--linears", linears_text,
                 "linears to time, comma-separated: wqkv, wo, w_gate_up, w_down, lm_head (the default: one llama3 "
                 "step), lr_a, lr_b");
  app.add_option("--shape", extra_shapes,
                 "NAME:K:N:EPILOGUE: a linear of that shape (EPILOGUE: bf16, f32, residual, swiglu), timed with "
                 "--linears'");
  app.add_flag("--dependent", dependent, "launch with programmatic dependent launch, as a pass's nodes are");
  app.add_option("--layout", layout,
                 "the weights' layout: tiled (as the planner stores a matrix only GEMVs read) "
                 "or rows (row-major)");
  app.add_option("--source", sources, "NAME=FILE: replace the embedded kernel source NAME with FILE's text");
  app.add_option("--label", label, "names this run in the summary lines");
  CLI11_PARSE(app, argc, argv);

  try {
    if (cuda::device_count() == 0) fail("bench_gemv: no CUDA device");
    if (kernel_def("gemv").params.size() != 6)
      fail("bench_gemv: packs 6 gemv parameters, the registry lists {}", kernel_def("gemv").params.size());
    const std::vector<int64_t> row_tiles = parse_list(rows_text, "rows");
    for (int64_t r : row_tiles)
      if (r < 1 || r > 16) fail("--rows: ROWS {} is outside 1..16", r);
    std::vector<Shape> shapes;
    for (const std::string& text : extra_shapes) {
      const std::vector<std::string> f = split_list(text, ':');
      const std::vector<std::pair<std::string, int64_t>> epilogues = {{"bf16", kc::kEpilogueBF16},
                                                                      {"f32", kc::kEpilogueF32},
                                                                      {"residual", kc::kEpilogueResidual},
                                                                      {"swiglu", kc::kEpilogueSwiGLU}};
      const auto e = f.size() != 4 ? epilogues.end()
                                   : std::find_if(epilogues.begin(), epilogues.end(),
                                                  [&](const auto& named) { return named.first == f[3]; });
      if (e == epilogues.end()) fail("--shape: `{}` is not NAME:K:N:EPILOGUE (bf16, f32, residual, swiglu)", text);
      const std::vector<int64_t> k = parse_list(f[1], "shape K"), n = parse_list(f[2], "shape N");
      if (k.size() != 1 || n.size() != 1 || k[0] < 1 || n[0] < 1)
        fail("--shape: `{}`: K and N must be positive integers", text);
      shapes.push_back({f[0], k[0], n[0], e->second});
    }
    for (const std::string& item : split_list(linears_text)) {
      const auto it = std::find_if(kCatalog.begin(), kCatalog.end(), [&](const Shape& s) { return s.name == item; });
      if (it == kCatalog.end())
        fail("--linears: no linear `{}` (wqkv, wo, w_gate_up, w_down, lm_head, lr_a, lr_b)", item);
      shapes.push_back(*it);
    }
    const std::vector<int64_t> col_tiles = parse_list(cols_text, "cols");
    for (int64_t c : col_tiles)
      if (c != 16 && c != 32) fail("--cols: COLS {} is neither 16 nor 32", c);
    std::vector<int64_t> weights;
    for (const std::string& item : split_list(weights_text)) {
      if (item == "bf16")
        weights.push_back(kc::kWeightBF16);
      else if (item == "fp8")
        weights.push_back(kc::kWeightFP8);
      else
        fail("--weights: `{}` is neither bf16 nor fp8", item);
    }
    if (layout != "tiled" && layout != "rows") fail("--layout: `{}` is neither tiled nor rows", layout);
    const bool tiled = layout == "tiled";
    for (const Shape& s : shapes)
      for (int64_t weight : weights) {
        const int64_t w_rows = s.epilogue == kc::kEpilogueSwiGLU ? 2 * s.n : s.n;
        const int64_t row_bytes = s.k * (weight == kc::kWeightFP8 ? 1 : 2);
        if (tiled && !tileable(w_rows, row_bytes))
          fail("--layout tiled: linear {} ({} rows of {} bytes) is not whole tiles of {} rows and {}-byte K steps",
               s.name, w_rows, row_bytes, kTileRows, kTileStepBytes);
      }

    CompileOptions options;
    for (const std::string& s : sources) {
      const size_t eq = s.find('=');
      if (eq == std::string::npos) fail("--source: `{}` is not NAME=FILE", s);
      const std::string name = s.substr(0, eq), file = s.substr(eq + 1);
      auto it = std::find_if(options.headers.begin(), options.headers.end(),
                             [&](const EmbeddedSource& e) { return e.name == name; });
      if (it == options.headers.end()) fail("--source: no embedded kernel source named `{}`", name);
      std::ifstream in(file);
      if (!in) fail("--source: cannot read `{}`", file);
      std::stringstream text;
      text << in.rdbuf();
      it->text = text.str();
    }

    TFE_CUDA(cudaSetDevice(0));
    cudaDeviceProp prop{};
    TFE_CUDA(cudaGetDeviceProperties(&prop, 0));
    auto stream = cuda::create_stream();
    Bench bench{stream.get(), prop.l2CacheSize, options, KernelCache::from_environment(), 1, dependent, tiled, {}};

    // Compile every specialization up front, in parallel (the cache is thread-safe).
    struct Job {
      const Shape* shape;
      int64_t weight, rows, cols;
      std::future<CachedKernel> compiled;
    };
    // SwiGLU runs at COLS 16 only (its two weight tiles are gate and up): in a COLS 32 summary it stands
    // for itself.
    const auto cols_of = [](const Shape& s, int64_t cols) { return s.epilogue == kc::kEpilogueSwiGLU ? 16 : cols; };
    std::vector<Job> jobs;
    for (int64_t weight : weights)
      for (const Shape& s : shapes)
        for (int64_t rows : row_tiles)
          for (int64_t cols : col_tiles) {
            if (cols != cols_of(s, cols)) continue;
            const KernelSpec spec = make_spec("gemv", {{"ROWS", rows},
                                                       {"K", s.k},
                                                       {"N", s.n},
                                                       {"WEIGHT", weight},
                                                       {"EPILOGUE", s.epilogue},
                                                       {"COLS", cols},
                                                       {"TILED", tiled}});
            jobs.push_back({&s, weight, rows, cols, std::async(std::launch::async, [&bench, spec] {
                              return bench.cache.get(make_compile_unit(spec), bench.options);
                            })});
          }

    const double copy_bw = copy_bandwidth(stream.get());
    fmt::print("{} ({} SMs, L2 {} MB), copy bandwidth {:.0f} GB/s (read + write), {}, weights {}\n", prop.name,
               prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_bw * 1e-9, label, layout);
    fmt::print("{:<10} {:>5} {:>5} {:>5} {:>9} {:>9} {:>8} {:>7} {:>9}  {}\n", "shape", "w", "rows", "cols", "us",
               "floor us", "GB/s", "% copy", "error", "check");
    std::vector<Result> results;
    bool all_ok = true;
    for (Job& job : jobs) {
      const CachedKernel compiled = job.compiled.get();
      const Result r = bench.run(*job.shape, job.weight, job.rows, job.cols, compiled);
      const double floor_us = r.bytes / copy_bw * 1e6;
      fmt::print("{:<10} {:>5} {:>5} {:>5} {:>9.2f} {:>9.2f} {:>8.0f} {:>6.1f}% {:>9.2e}  {}\n", r.shape, r.weight,
                 r.rows, r.cols, r.us, floor_us, r.bytes / (r.us * 1e-6) * 1e-9, 100.0 * floor_us / r.us, r.err,
                 r.ok ? "ok" : "FAIL");
      std::fflush(stdout);
      all_ok = all_ok && r.ok;
      results.push_back(r);
    }

    // One draft step's linears per (weight kind, rows).
    fmt::print("\n{}: the linears summed\n{:>5} {:>5} {:>5} {:>9} {:>9} {:>7}\n", label, "w", "rows", "cols", "us",
               "floor us", "ratio");
    for (int64_t weight : weights)
      for (int64_t rows : row_tiles)
        for (int64_t cols : col_tiles) {
          double us = 0, bytes = 0;
          for (const Result& r : results)
            for (const Shape& s : shapes)
              if (r.shape == s.name && r.rows == rows && r.cols == cols_of(s, cols) &&
                  r.weight == (weight == kc::kWeightFP8 ? "fp8" : "bf16"))
                us += r.us, bytes += r.bytes;
          const double floor_us = bytes / copy_bw * 1e6;
          fmt::print("{:>5} {:>5} {:>5} {:>9.1f} {:>9.1f} {:>6.2f}x\n", weight == kc::kWeightFP8 ? "fp8" : "bf16", rows,
                     cols, us, floor_us, us / floor_us);
        }
    if (!all_ok) fmt::print("{}: a check FAILED\n", label);
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gemv: {}\n", e.what());
    return 1;
  }
}
