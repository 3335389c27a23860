#include "runtime/testing.h"

#include <cstring>

namespace tfe::testing {

Runtime open(const std::string& head_path, const OpenOptions& o, const Hooks& hooks) {
  HeadFile::Options fo;
  fo.verify_sha256 = o.verify_sha256;
  return open_runtime(HeadFile::open(head_path, fo), o, hooks);
}

Runtime open(const HeadFile& file, const OpenOptions& o, const Hooks& hooks) { return open_runtime(file, o, hooks); }

const Plan& plan(const Runtime& rt) { return RuntimeAccess::impl(rt).plan; }

std::vector<std::byte> read_buffer(const Runtime& rt, std::string_view name) {
  RuntimeAccess::Impl& r = RuntimeAccess::impl(rt);
  DeviceScope scope(r.device);
  if (const Buffer* h = r.plan.host.find(name)) {
    r.device_work([&] { TFE_CUDA(cudaStreamSynchronize(r.stream)); });
    const std::byte* at = r.host + h->offset;
    return std::vector<std::byte>(at, at + h->bytes);
  }
  const Buffer& b = r.plan.arena.at(name);
  std::vector<std::byte> host(static_cast<size_t>(b.bytes));
  r.device_work([&] {
    TFE_CUDA(cudaStreamSynchronize(r.stream));
    TFE_CUDA(cudaMemcpy(host.data(), r.arena + b.offset, host.size(), cudaMemcpyDeviceToHost));
  });
  r.stats.bytes_downloaded += host.size();
  return host;
}

void fill_buffer(Runtime& rt, std::string_view name, uint8_t byte) {
  RuntimeAccess::Impl& r = RuntimeAccess::impl(rt);
  r.check_usable();
  DeviceScope scope(r.device);
  if (const Buffer* h = r.plan.host.find(name)) {
    // Host memory: written now, once the work already queued (which may write it) is done.
    r.device_work([&] { TFE_CUDA(cudaStreamSynchronize(r.stream)); });
    std::memset(r.host + h->offset, byte, static_cast<size_t>(h->bytes));
    return;
  }
  const Buffer& b = r.plan.arena.at(name);
  r.device_work([&] { TFE_CUDA(cudaMemsetAsync(r.arena + b.offset, byte, static_cast<size_t>(b.bytes), r.stream)); });
}

void inject_cuda_error(Runtime& rt, cudaError_t error) { RuntimeAccess::impl(rt).injected_error = error; }

const SelfCheckReport& self_check_report(const Runtime& rt) { return RuntimeAccess::impl(rt).self_check; }

}  // namespace tfe::testing
