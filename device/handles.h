// One owner per CUDA handle. Each wrapper is move-only, releases in its destructor without throwing
// (a failure is reported to stderr), and is created through a function that checks the call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "device/cuda_check.h"

namespace tfe::cuda {

// A handle `T` released by `Release` (a noexcept function taking the handle).
template <typename T, void (*Release)(T) noexcept>
class Unique {
 public:
  Unique() = default;
  explicit Unique(T h) : h_(h) {}
  Unique(Unique&& o) noexcept : h_(std::exchange(o.h_, T{})) {}
  Unique& operator=(Unique&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, T{});
    }
    return *this;
  }
  Unique(const Unique&) = delete;
  Unique& operator=(const Unique&) = delete;
  ~Unique() { reset(); }

  T get() const { return h_; }
  explicit operator bool() const { return h_ != T{}; }
  void reset() noexcept {
    if (h_ != T{}) Release(std::exchange(h_, T{}));
  }

 private:
  T h_{};
};

void release_device_memory(void* p) noexcept;
void release_pinned_memory(void* p) noexcept;
void release_stream(cudaStream_t s) noexcept;
void release_event(cudaEvent_t e) noexcept;
void release_graph(cudaGraph_t g) noexcept;
void release_graph_exec(cudaGraphExec_t g) noexcept;
void release_library(cudaLibrary_t l) noexcept;
void release_cublaslt(cublasLtHandle_t h) noexcept;
void release_matmul_desc(cublasLtMatmulDesc_t d) noexcept;
void release_matrix_layout(cublasLtMatrixLayout_t l) noexcept;
void release_matmul_preference(cublasLtMatmulPreference_t p) noexcept;

using Stream = Unique<cudaStream_t, release_stream>;
using Event = Unique<cudaEvent_t, release_event>;
using Graph = Unique<cudaGraph_t, release_graph>;
using GraphExec = Unique<cudaGraphExec_t, release_graph_exec>;
using Library = Unique<cudaLibrary_t, release_library>;
using CublasLt = Unique<cublasLtHandle_t, release_cublaslt>;
using MatmulDesc = Unique<cublasLtMatmulDesc_t, release_matmul_desc>;
using MatrixLayout = Unique<cublasLtMatrixLayout_t, release_matrix_layout>;
using MatmulPreference = Unique<cublasLtMatmulPreference_t, release_matmul_preference>;

// Bytes of device or pinned host memory with their size.
template <void (*Release)(void*) noexcept>
class Memory {
 public:
  Memory() = default;
  Memory(void* p, size_t bytes) : p_(p), bytes_(bytes) {}
  std::byte* data() const { return static_cast<std::byte*>(p_.get()); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return static_cast<bool>(p_); }

 private:
  Unique<void*, Release> p_;
  size_t bytes_ = 0;
};
using DeviceMemory = Memory<release_device_memory>;
using PinnedMemory = Memory<release_pinned_memory>;

// Checked constructors. `what` names the allocation in the error (e.g. "arena").
DeviceMemory allocate_device(size_t bytes, const char* what);
PinnedMemory allocate_pinned(size_t bytes, const char* what);
// Pinned host memory that kernels read and write through `*device` (cudaHostAllocMapped).
PinnedMemory allocate_mapped(size_t bytes, const char* what, std::byte** device);
Stream create_stream();  // non-blocking: never synchronizes with the legacy default stream
Event create_event(bool timing = false);
CublasLt create_cublaslt();
// Loads a cubin image (copied by the driver); `what` names it in the error.
Library load_library(const void* image, const char* what);

// Makes `device` current for the scope and restores the caller's device after it: an engine thread may
// drive several GPUs.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace tfe::cuda
