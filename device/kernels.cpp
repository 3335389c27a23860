#include "device/kernels.h"

#include <array>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "plan/plan.h"

namespace tfe::cuda {

std::byte* ArenaBases::address(const std::string& buffer, int64_t byte_offset, const std::string& node) const {
  const Buffer* b = plan->weights.find(buffer);
  std::byte* base = weights;
  if (!b) {
    b = plan->arena.find(buffer);
    base = arena;
  }
  if (!b) {
    b = plan->host.find(buffer);
    base = host;
  }
  if (!b) fail("node {}: buffer `{}` is in none of the weights arena, the arena and the host arena", node, buffer);
  if (byte_offset < 0 || byte_offset >= b->bytes)
    fail("node {}: byte offset {} into buffer `{}` is outside its {} bytes", node, byte_offset, buffer, b->bytes);
  return base + b->offset + byte_offset;
}

dim3 grid_for_rows(const LaunchShape& shape, int64_t rows) {
  int64_t g[3] = {shape.grid[0], shape.grid[1], shape.grid[2]};
  if (shape.rows_axis >= 0) g[shape.rows_axis] = (rows + shape.rows_per_block - 1) / shape.rows_per_block;
  return dim3(static_cast<unsigned>(g[0]), static_cast<unsigned>(g[1]), static_cast<unsigned>(g[2]));
}

cudaError_t launch_kernel(cudaKernel_t kernel, dim3 grid, const LaunchShape& shape, uint64_t* slots,
                          cudaStream_t stream, bool dependent, const L2Window& window) {
  void* args[] = {slots};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(shape.block));
  config.dynamicSmemBytes = static_cast<size_t>(shape.smem);
  config.stream = stream;
  std::array<cudaLaunchAttribute, 2> attributes{};
  unsigned count = 0;
  if (dependent) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (window.bytes > 0) {
    cudaAccessPolicyWindow& w = attributes[count].val.accessPolicyWindow;
    attributes[count++].id = cudaLaunchAttributeAccessPolicyWindow;
    w.base_ptr = const_cast<void*>(window.base);
    w.num_bytes = window.bytes;
    w.hitRatio = window.hit_ratio;
    w.hitProp = cudaAccessPropertyPersisting;
    w.missProp = cudaAccessPropertyStreaming;
  }
  config.attrs = count > 0 ? attributes.data() : nullptr;
  config.numAttrs = count;
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), args);
}

void allow_dynamic_smem(cudaKernel_t kernel, int64_t dynamic, int device, const std::string& name) {
  constexpr int64_t kWithoutOptIn = 48 * 1024;
  if (dynamic <= 0) return;
  cudaFuncAttributes attr{};
  TFE_CUDA(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)));
  const auto static_smem = static_cast<int64_t>(attr.sharedSizeBytes);
  int optin = 0;
  TFE_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (dynamic + static_smem > optin)
    fail("kernel {} needs {} bytes of dynamic and {} of static shared memory; device {} allows {} a block", name,
         dynamic, static_smem, device, optin);
  if (dynamic + static_smem > kWithoutOptIn)
    TFE_CUDA(cudaKernelSetAttributeForDevice(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(dynamic), device));
}

namespace {
constexpr size_t kMaxParams = 16;  // the largest registry kernel has 12 slots
}

KernelLaunch::KernelLaunch(const Node& node, const LoadedKernel& kernel, const ArenaBases& bases, int64_t max_rows,
                           bool dependent, L2Window window)
    : node_(node.name),
      kernel_(kernel.kernel),
      shape_(node.launch),
      max_rows_(max_rows),
      dependent_(dependent),
      window_(window) {
  if (node.kind != Node::Kind::kernel) fail("node {}: not a kernel node", node.name);
  const KernelSpec& spec = bases.plan->spec(node.spec);
  const KernelDef& def = kernel_def(spec.kernel);
  if (node.args.size() != def.params.size())
    fail("node {}: {} arguments for kernel {}, which takes {}", node.name, node.args.size(), spec.kernel,
         def.params.size());
  if (def.params.size() > kMaxParams)
    fail("node {}: kernel {} has {} parameters, the launcher packs at most {}", node.name, spec.kernel,
         def.params.size(), kMaxParams);
  params_.resize(def.params.size(), 0);
  for (size_t i = 0; i < def.params.size(); ++i) {
    const KernelParam& p = def.params[i];
    const Arg& a = node.args[i];
    if (a.param != p.name)
      fail("node {}: argument {} binds `{}`, kernel {} expects `{}` there", node.name, i, a.param, spec.kernel, p.name);
    auto kind_error = [&] {
      fail("node {}: parameter `{}` of kind {} cannot take an argument of kind {}", node.name, p.name,
           param_kind_name(p.kind), static_cast<int>(a.kind));
    };
    switch (p.kind) {
      case ParamKind::ptr:
        if (a.kind == Arg::Kind::buffer)
          params_[i] = reinterpret_cast<uint64_t>(bases.address(a.buffer, a.byte_offset, node.name));
        else if (a.kind != Arg::Kind::null)
          kind_error();
        break;
      case ParamKind::i64:
        if (a.kind == Arg::Kind::i64)
          params_[i] = static_cast<uint64_t>(a.i);
        else if (a.kind == Arg::Kind::rows)
          rows_slots_.push_back(i);
        else
          kind_error();
        break;
      case ParamKind::f32: {
        if (a.kind != Arg::Kind::f32) kind_error();
        uint32_t bits;
        std::memcpy(&bits, &a.f, sizeof(bits));
        params_[i] = bits;  // low 4 bytes on a little-endian device; the high half stays 0
        break;
      }
    }
  }

  if (max_rows < 1) fail("node {}: planned for {} rows", node.name, max_rows);
  if (shape_.rows_axis > 2 || shape_.rows_per_block < 1)
    fail("node {}: rows_axis {} / rows_per_block {} out of range", node.name, shape_.rows_axis, shape_.rows_per_block);
  LaunchShape widest = shape_;
  if (widest.rows_axis >= 0)
    widest.grid[widest.rows_axis] = (max_rows + shape_.rows_per_block - 1) / shape_.rows_per_block;
  const int64_t grid_limit[3] = {std::numeric_limits<int32_t>::max(), 65535, 65535};
  for (int d = 0; d < 3; ++d)
    if (widest.grid[d] < 1 || widest.grid[d] > grid_limit[d])
      fail("node {}: grid[{}] = {} for {} rows, the device allows 1..{}", node.name, d, widest.grid[d], max_rows,
           grid_limit[d]);
  if (shape_.block < 1 || shape_.block > kernel.max_threads_per_block)
    fail("node {}: block of {} threads; kernel {} allows at most {} on this device", node.name, shape_.block,
         kernel.uri, kernel.max_threads_per_block);
  if (shape_.smem < 0) fail("node {}: negative shared memory {}", node.name, shape_.smem);
}

void KernelLaunch::launch(int64_t rows, cudaStream_t stream) const {
  if (rows < 1 || rows > max_rows_) fail("node {}: launched for {} rows, planned for 1..{}", node_, rows, max_rows_);
  std::array<uint64_t, kMaxParams> slots{};
  std::memcpy(slots.data(), params_.data(), params_.size() * sizeof(uint64_t));
  for (size_t i : rows_slots_) slots[i] = static_cast<uint64_t>(rows);
  const dim3 grid = grid_for_rows(shape_, rows);
  const cudaError_t e = launch_kernel(kernel_, grid, shape_, slots.data(), stream, dependent_, window_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("launching node {} ({} x {} x {} blocks of {}, {} B shared, {} rows) failed: {} ({})", node_, grid.x,
              grid.y, grid.z, shape_.block, shape_.smem, rows, cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

}  // namespace tfe::cuda
