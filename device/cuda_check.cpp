#include "device/cuda_check.h"

#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace tfe::cuda {

namespace {
// Paths in messages are relative to the source tree: the rest is build-machine noise.
const char* short_path(const char* file) {
  for (const char* dir : {"/runtime/", "/graphs/", "/tests/", "/examples/"})
    if (const char* p = std::strstr(file, dir)) return p + 1;
  return file;
}
}  // namespace

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  // Clear a non-sticky error so that the next call does not report it again.
  (void)cudaGetLastError();
  throw CudaError(fmt::format("{} failed at {}:{}: {} ({})", call, short_path(file), line, cudaGetErrorName(e),
                              cudaGetErrorString(e)));
}

void throw_cublaslt_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw CudaError(fmt::format("{} failed at {}:{}: {} ({})", call, short_path(file), line, cublasLtGetStatusName(s),
                              cublasLtGetStatusString(s)));
}

void report_cuda_error(cudaError_t e, const char* call, const char* file, int line) noexcept {
  if (e == cudaErrorCudartUnloading) return;  // at process exit the driver has already released everything
  (void)cudaGetLastError();
  std::fprintf(stderr, "tfe: %s failed at %s:%d while releasing: %s (%s)\n", call, short_path(file), line,
               cudaGetErrorName(e), cudaGetErrorString(e));
}

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace tfe::cuda
