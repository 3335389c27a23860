#include "tests/gpu/gpu_test.h"

#include <cmath>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "plan/numeric.h"
#include "runtime/cuda_check.h"
#include "runtime/device_kernels.h"

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

}  // namespace tfe::test
