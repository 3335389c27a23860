// Kernel launches of a plan. A node's arguments are packed once, at open, into the kernel's parameter
// struct: one 8-byte slot per registry parameter (a pointer = arena or weights base + buffer offset + the
// argument's byte_offset; an int64; an f32 in the low 4 bytes; 0 for null). Only the `rows` slots and the
// grid axis that scales with rows change per launch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "device/handles.h"

namespace tfe {
struct Plan;
struct Node;
}  // namespace tfe

namespace tfe::cuda {

// Device addresses of a plan's buffers: the weights arena, the arena and the host arena (mapped host
// memory, by its device address) are each one contiguous range.
struct ArenaBases {
  const Plan* plan = nullptr;
  std::byte* weights = nullptr;
  std::byte* arena = nullptr;
  std::byte* host = nullptr;
  // Base + the buffer's offset + byte_offset; throws naming the node and the buffer when the buffer is
  // in no arena or the offset falls outside it.
  std::byte* address(const std::string& buffer, int64_t byte_offset, const std::string& node) const;
};

// A loaded specialization: its kernel handle and attributes.
struct LoadedKernel {
  std::string uri;
  cudaKernel_t kernel = nullptr;
  int max_threads_per_block = 0;
  int64_t static_smem = 0;
};

// An L2 access-policy window of a launch: `hit_ratio` of the lines of [base, base + bytes) persist in the
// L2's set-aside part (cudaLimitPersistingL2CacheSize), the others stream (evicted first). bytes 0: none.
struct L2Window {
  const void* base = nullptr;
  size_t bytes = 0;
  float hit_ratio = 0.0f;
};

// A kernel node ready to launch.
class KernelLaunch {
 public:
  // Packs `node` (kind kernel) against the registry's parameter list for up to `max_rows` rows; checks
  // names, kinds and the launch shape against the kernel's limits.
  // `dependent`: launch with programmatic stream serialization (the kernel may start before its
  // predecessor completes; it waits in-kernel). `window`: an L2 access-policy window for every launch.
  KernelLaunch(const Node& node, const LoadedKernel& kernel, const ArenaBases& bases, int64_t max_rows,
               bool dependent = false, L2Window window = {});

  // Enqueues the kernel for `rows` rows (1..max_rows).
  void launch(int64_t rows, cudaStream_t stream) const;
  const std::string& node() const { return node_; }
  int64_t max_rows() const { return max_rows_; }
  const std::vector<uint64_t>& params() const { return params_; }

 private:
  std::string node_;
  cudaKernel_t kernel_ = nullptr;
  LaunchShape shape_;
  int64_t max_rows_ = 0;
  bool dependent_ = false;
  L2Window window_;
  std::vector<uint64_t> params_;
  std::vector<size_t> rows_slots_;
};

// Grid of `shape` for `rows` rows: grid[rows_axis] = ceil(rows / rows_per_block).
dim3 grid_for_rows(const LaunchShape& shape, int64_t rows);

// Enqueues `kernel` on `grid` with the block and dynamic shared memory of `shape`, its parameter slots
// packed in `slots` (one 8-byte slot per registry parameter); `dependent`: with programmatic stream
// serialization (the kernel may start before its predecessor completes; it waits in-kernel); `window`, where
// its bytes are not 0: the launch's L2 access-policy window.
cudaError_t launch_kernel(cudaKernel_t kernel, dim3 grid, const LaunchShape& shape, uint64_t* slots,
                          cudaStream_t stream, bool dependent, const L2Window& window = {});

// Lets `kernel` launch on `device` with `dynamic` bytes of dynamic shared memory: where that and its static
// shared memory exceed 48 KB a block, the kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize).
// Throws naming `name` when the device allows less a block.
void allow_dynamic_smem(cudaKernel_t kernel, int64_t dynamic, int device, const std::string& name);

}  // namespace tfe::cuda
