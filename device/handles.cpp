#include "device/handles.h"

#include "core/error.h"

namespace tfe::cuda {

void release_device_memory(void* p) noexcept { TFE_CUDA_NOEXCEPT(cudaFree(p)); }
void release_pinned_memory(void* p) noexcept { TFE_CUDA_NOEXCEPT(cudaFreeHost(p)); }
void release_stream(cudaStream_t s) noexcept { TFE_CUDA_NOEXCEPT(cudaStreamDestroy(s)); }
void release_event(cudaEvent_t e) noexcept { TFE_CUDA_NOEXCEPT(cudaEventDestroy(e)); }
void release_graph(cudaGraph_t g) noexcept { TFE_CUDA_NOEXCEPT(cudaGraphDestroy(g)); }
void release_graph_exec(cudaGraphExec_t g) noexcept { TFE_CUDA_NOEXCEPT(cudaGraphExecDestroy(g)); }
void release_library(cudaLibrary_t l) noexcept { TFE_CUDA_NOEXCEPT(cudaLibraryUnload(l)); }
void release_cublaslt(cublasLtHandle_t h) noexcept { (void)cublasLtDestroy(h); }
void release_matmul_desc(cublasLtMatmulDesc_t d) noexcept { (void)cublasLtMatmulDescDestroy(d); }
void release_matrix_layout(cublasLtMatrixLayout_t l) noexcept { (void)cublasLtMatrixLayoutDestroy(l); }
void release_matmul_preference(cublasLtMatmulPreference_t p) noexcept { (void)cublasLtMatmulPreferenceDestroy(p); }

DeviceMemory allocate_device(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    (void)cudaGetLastError();
    fail_cuda("cudaMalloc of the {} ({} bytes) failed: {} ({}); the device has {} of {} bytes free", what, bytes,
              cudaGetErrorName(e), cudaGetErrorString(e), free_bytes, total_bytes);
  }
  return DeviceMemory(p, bytes);
}

PinnedMemory allocate_pinned(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("cudaMallocHost of the {} ({} bytes) failed: {} ({})", what, bytes, cudaGetErrorName(e),
              cudaGetErrorString(e));
  }
  return PinnedMemory(p, bytes);
}

PinnedMemory allocate_mapped(size_t bytes, const char* what, std::byte** device) {
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("cudaHostAlloc (mapped) of the {} ({} bytes) failed: {} ({})", what, bytes, cudaGetErrorName(e),
              cudaGetErrorString(e));
  }
  PinnedMemory m(p, bytes);
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("cudaHostGetDevicePointer of the {} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  *device = static_cast<std::byte*>(d);
  return m;
}

Stream create_stream() {
  cudaStream_t s = nullptr;
  TFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

Event create_event(bool timing) {
  cudaEvent_t e = nullptr;
  TFE_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(e);
}

CublasLt create_cublaslt() {
  cublasLtHandle_t h = nullptr;
  TFE_CUBLASLT(cublasLtCreate(&h));
  return CublasLt(h);
}

Library load_library(const void* image, const char* what) {
  cudaLibrary_t lib = nullptr;
  const cudaError_t e = cudaLibraryLoadData(&lib, image, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("loading the cubin of {} failed: {} ({}); was it compiled for this device's architecture?", what,
              cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return Library(lib);
}

DeviceScope::DeviceScope(int device) {
  TFE_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device) TFE_CUDA(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = previous_;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) TFE_CUDA_NOEXCEPT(cudaSetDevice(previous_));
}

}  // namespace tfe::cuda
