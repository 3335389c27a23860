// Checked CUDA and cuBLASLt calls. Every runtime call goes through TFE_CUDA / TFE_CUBLASLT so that a
// failure becomes a tfe::Error naming the call, the error and the source line, never an abort.
// Destructors use the *_noexcept forms: they report to stderr and carry on.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

namespace tfe::cuda {

// Throws tfe::CudaError: "<call> failed at <file>:<line>: <error name> (<error string>)".
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublaslt_error(cublasStatus_t s, const char* call, const char* file, int line);
// For destructors: prints the failure to stderr (unless the process is already unloading CUDA).
void report_cuda_error(cudaError_t e, const char* call, const char* file, int line) noexcept;

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_cuda_error(e, call, file, line);
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublaslt_error(s, call, file, line);
}
inline void check_noexcept(cudaError_t e, const char* call, const char* file, int line) noexcept {
  if (e != cudaSuccess) report_cuda_error(e, call, file, line);
}

// Number of CUDA devices, 0 when there is no driver or no device (never throws).
int device_count() noexcept;

}  // namespace tfe::cuda

#define TFE_CUDA(call) ::tfe::cuda::check((call), #call, __FILE__, __LINE__)
#define TFE_CUBLASLT(call) ::tfe::cuda::check((call), #call, __FILE__, __LINE__)
#define TFE_CUDA_NOEXCEPT(call) ::tfe::cuda::check_noexcept((call), #call, __FILE__, __LINE__)
