#include "tests/gpu/gpu_test.h"

#include <algorithm>
#include <cmath>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "core/numeric.h"
#include "device/cuda_check.h"
#include "device/kernels.h"

namespace tfe::test {

namespace {
struct Probe {
  bool none = true;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorName(e));
    } else if (n == 0) {
      r.reason = "0 devices";
    } else {
      r.none = false;
    }
    return r;
  }();
  return p;
}
}  // namespace

bool no_gpu() { return probe().none; }
const std::string& no_gpu_reason() { return probe().reason; }

TestKernel load_test_kernel(const KernelSpec& spec) {
  int device = 0;
  cudaDeviceProp prop{};
  TFE_CUDA(cudaGetDevice(&device));
  TFE_CUDA(cudaGetDeviceProperties(&prop, device));
  CompileOptions options;
  options.arch = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  const CachedKernel compiled = KernelCache::from_environment().get(make_compile_unit(spec), options);
  TestKernel t{cuda::load_library(compiled.kernel.cubin.data(), compiled.kernel.uri.c_str()), nullptr};
  TFE_CUDA(cudaLibraryGetKernel(&t.kernel, t.library.get(), compiled.kernel.lowered_name.c_str()));
  cuda::allow_dynamic_smem(t.kernel, launch_shape(spec, 1).smem, device, spec.uri());
  return t;
}

std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

Bf16Diff compare_bf16(std::span<const uint16_t> got, std::span<const uint16_t> want) {
  Bf16Diff r;
  r.n = want.size();
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const float g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    num += (static_cast<double>(g) - w) * (static_cast<double>(g) - w);
    den += static_cast<double>(w) * w;
    // One bf16 ulp at w's magnitude: 2^(exponent - 7).
    int e = 0;
    std::frexp(w == 0.0f ? 1e-30f : w, &e);
    const double ulp = std::ldexp(1.0, e - 8);
    if (!(std::fabs(static_cast<double>(g) - w) <= ulp)) {
      if (r.first_bad == SIZE_MAX) r.first_bad = i;
      ++r.beyond_one_ulp;
    }
  }
  if (got.size() != want.size()) r.beyond_one_ulp += r.n;
  r.normalized_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return r;
}

double f32_error(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(i < got.size() ? got[i] : NAN) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  if (got.size() != want.size()) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

namespace {

// The largest value (first index at it), and how far it stands above the next smaller value (infinite
// when every value equals it).
struct Best {
  int64_t id = 0;
  float value = 0;
  float gap = INFINITY;
};
Best best_of(std::span<const float> v) {
  Best b;
  b.value = v[0];
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > b.value) b.value = v[i], b.id = static_cast<int64_t>(i);
  float next = -INFINITY;
  for (float x : v)
    if (x < b.value && x > next) next = x;
  b.gap = b.value - next;
  return b;
}
bool clear_winner(const Best& b) { return b.gap > 1e-3f * std::fabs(b.value); }

}  // namespace

void check_top1(std::span<const float> logits, int64_t rows, int64_t vocab, int64_t cols,
                std::span<const Top1Record> parts, std::span<const int32_t> d2t, std::span<const int32_t> token,
                std::span<const float> conf, int64_t stride) {
  const int64_t n_parts = (vocab + cols - 1) / cols;
  REQUIRE(parts.size() >= static_cast<size_t>(rows * n_parts));
  std::vector<float> got_max, want_max, got_sum, want_sum;
  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    const std::span<const float> l = logits.subspan(static_cast<size_t>(r * vocab), static_cast<size_t>(vocab));
    const std::span<const Top1Record> rp =
        parts.subspan(static_cast<size_t>(r * n_parts), static_cast<size_t>(n_parts));
    for (int64_t p = 0; p < n_parts; ++p) {
      CAPTURE(p);
      const int64_t begin = p * cols, len = std::min(cols, vocab - begin);
      const Top1Record& rec = rp[static_cast<size_t>(p)];
      REQUIRE(rec.idx >= begin);  // a record left unwritten holds -1
      REQUIRE(rec.idx < begin + len);
      CHECK(rec.pad == 0.0f);
      const Best b = best_of(l.subspan(static_cast<size_t>(begin), static_cast<size_t>(len)));
      if (clear_winner(b)) CHECK(rec.idx == begin + b.id);
      double sum = 0;
      for (int64_t j = begin; j < begin + len; ++j)
        sum += std::exp(static_cast<double>(l[static_cast<size_t>(j)]) - b.value);
      got_max.push_back(rec.max);
      want_max.push_back(b.value);
      got_sum.push_back(rec.sum);
      want_sum.push_back(static_cast<float>(sum));
    }
    // The join on the GPU's partials.
    int64_t best = 0;
    for (int64_t p = 1; p < n_parts; ++p) {
      const Top1Record &q = rp[static_cast<size_t>(p)], &c = rp[static_cast<size_t>(best)];
      if (q.max > c.max || (q.max == c.max && q.idx < c.idx)) best = p;
    }
    const Top1Record& m = rp[static_cast<size_t>(best)];
    double total = 0;
    for (const Top1Record& q : rp) total += static_cast<double>(q.sum) * std::exp(static_cast<double>(q.max) - m.max);
    const float got_conf = conf[static_cast<size_t>(r * stride)];
    const int32_t got_token = token[static_cast<size_t>(r * stride)];
    CHECK(got_token == m.idx + d2t[static_cast<size_t>(m.idx)]);
    CHECK(std::fabs(got_conf - 1.0 / total) <= 1e-5 / total);
    // End to end, against the reference logits.
    const Best b = best_of(l);
    if (clear_winner(b)) CHECK(got_token == static_cast<int32_t>(b.id) + d2t[static_cast<size_t>(b.id)]);
    double want_total = 0;
    for (float x : l) want_total += std::exp(static_cast<double>(x) - b.value);
    CHECK(std::fabs(got_conf - 1.0 / want_total) <= 1e-3 / want_total);
  }
  CHECK(f32_error(got_max, want_max) < 1e-4);
  CHECK(f32_error(got_sum, want_sum) < 1e-4);
}

}  // namespace tfe::test
