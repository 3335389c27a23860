#include <tfe/broadcast.h>

#include <string>
#include <thread>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/handles.h"

namespace tfe {

namespace {

using Clock = std::chrono::steady_clock;

void check_options(const BroadcastOptions& o) {
  if (o.max_streams < 1) fail("broadcast: max_streams = {} must be >= 1", o.max_streams);
  if (o.max_steps < 1) fail("broadcast: max_steps = {} must be >= 1", o.max_steps);
  if (o.timeout.count() <= 0) fail("broadcast: timeout = {} ms must be > 0", o.timeout.count());
}

std::string nccl_text(ncclResult_t r) { return fmt::format("{} ({})", ncclGetErrorString(r), static_cast<int>(r)); }

}  // namespace

struct DraftBroadcast::Impl {
  BroadcastOptions options;
  ncclComm_t comm = nullptr;
  bool owned = false;
  int rank = 0;
  int ranks = 0;
  cuda::DeviceMemory tokens, confidences;  // other ranks' buffers [max_streams, max_steps]
  std::string broken;                      // why the communicator was aborted

  ~Impl() {
    if (comm && owned) (void)ncclCommDestroy(comm);
  }

  void check_usable() const {
    if (!broken.empty()) fail_cuda("broadcast: unusable after {}; make a new communicator", broken);
  }
  // Aborts the communicator (its kernels return) and throws: nothing further is enqueued on it.
  [[noreturn]] void abort(std::string why) {
    broken = why;
    (void)ncclCommAbort(comm);  // frees it, the engine's too: the engine must not destroy it again
    comm = nullptr;
    fail_cuda("broadcast (rank {} of {}): {}; the communicator is aborted", rank, ranks, why);
  }
  // A non-blocking communicator's call may return ncclInProgress: poll until it settles, within the timeout.
  void settle(ncclResult_t r, const char* call) {
    const auto deadline = Clock::now() + options.timeout;
    while (r == ncclInProgress) {
      if (Clock::now() > deadline)
        abort(fmt::format("{} still in progress after {} ms", call, options.timeout.count()));
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) abort(fmt::format("{} failed: {}", call, nccl_text(r)));
  }
  void broadcast(void* tokens_buf, void* confs_buf, size_t count, cudaStream_t stream) {
    check_usable();
    cuda::DeviceScope scope(options.device);
    settle(ncclGroupStart(), "ncclGroupStart");
    const ncclResult_t a = ncclBroadcast(tokens_buf, tokens_buf, count, ncclInt32, 0, comm, stream);
    const ncclResult_t b = ncclBroadcast(confs_buf, confs_buf, count, ncclFloat32, 0, comm, stream);
    settle(ncclGroupEnd(), "ncclGroupEnd");
    settle(a, "ncclBroadcast of the tokens");
    settle(b, "ncclBroadcast of the confidences");
  }

  void finish_setup() {
    int count = 0, me = 0, device = -1;
    settle(ncclCommCount(comm, &count), "ncclCommCount");
    settle(ncclCommUserRank(comm, &me), "ncclCommUserRank");
    settle(ncclCommCuDevice(comm, &device), "ncclCommCuDevice");
    if (device != options.device)
      fail("broadcast: the communicator's rank {} runs on device {}, options.device is {}", me, device, options.device);
    ranks = count;
    rank = me;
    if (rank != 0) {
      cuda::DeviceScope scope(options.device);
      const size_t bytes = static_cast<size_t>(options.max_streams) * static_cast<size_t>(options.max_steps) * 4;
      tokens = cuda::allocate_device(bytes, "broadcast tokens");
      confidences = cuda::allocate_device(bytes, "broadcast confidences");
    }
  }
};

ncclUniqueId DraftBroadcast::unique_id() {
  ncclUniqueId id{};
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) fail_cuda("broadcast: ncclGetUniqueId failed: {}", nccl_text(r));
  return id;
}

DraftBroadcast DraftBroadcast::attach(ncclComm_t comm, const BroadcastOptions& options) {
  check_options(options);
  if (!comm) fail("broadcast: the communicator is null");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->comm = comm;
  impl->finish_setup();
  return DraftBroadcast(std::move(impl));
}

DraftBroadcast DraftBroadcast::create(const ncclUniqueId& id, int ranks, int rank, const BroadcastOptions& options) {
  check_options(options);
  if (ranks < 1) fail("broadcast: ranks = {} must be >= 1", ranks);
  if (rank < 0 || rank >= ranks) fail("broadcast: rank {} is outside 0..{}", rank, ranks - 1);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->owned = true;
  cuda::DeviceScope scope(options.device);
  // Non-blocking: every call returns at once, so that a rank that never joins cannot hang this one
  // past the timeout (settle aborts it).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId copy = id;
  const ncclResult_t r = ncclCommInitRankConfig(&impl->comm, ranks, copy, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    fail_cuda("broadcast: ncclCommInitRankConfig (rank {} of {}) failed: {}", rank, ranks, nccl_text(r));
  impl->rank = rank;
  impl->ranks = ranks;
  ncclResult_t state = r;
  if (state == ncclInProgress) (void)ncclCommGetAsyncError(impl->comm, &state);
  impl->settle(state, "ncclCommInitRankConfig");
  impl->finish_setup();
  return DraftBroadcast(std::move(impl));
}

DraftBroadcast::DraftBroadcast(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DraftBroadcast::DraftBroadcast(DraftBroadcast&&) noexcept = default;
DraftBroadcast& DraftBroadcast::operator=(DraftBroadcast&&) noexcept = default;
DraftBroadcast::~DraftBroadcast() = default;

int DraftBroadcast::rank() const { return impl_->rank; }
int DraftBroadcast::ranks() const { return impl_->ranks; }

DeviceDraftOutputs DraftBroadcast::send(const DeviceDraftOutputs& drafted, cudaStream_t stream) {
  Impl& b = *impl_;
  if (b.rank != 0) fail("broadcast: send is rank 0's; rank {} receives", b.rank);
  if (!drafted.tokens || !drafted.confidences) fail("broadcast: send of a draft with no outputs (draft first)");
  if (drafted.row_stride != b.options.max_steps)
    fail("broadcast: the draft's row stride is {}, options.max_steps is {}; they must be rank 0's plan max_steps",
         drafted.row_stride, b.options.max_steps);
  if (drafted.rows < 1 || drafted.rows > b.options.max_streams)
    fail("broadcast: {} rows is outside 1..{} (max_streams)", drafted.rows, b.options.max_streams);
  // In place: the root's receive buffer is its send buffer, which NCCL leaves as it is.
  const size_t count = static_cast<size_t>(drafted.rows) * static_cast<size_t>(drafted.row_stride);
  b.broadcast(const_cast<int32_t*>(drafted.tokens), const_cast<float*>(drafted.confidences), count, stream);
  return drafted;
}

DeviceDraftOutputs DraftBroadcast::receive(int rows, int steps, cudaStream_t stream) {
  Impl& b = *impl_;
  if (b.rank == 0) fail("broadcast: receive is for ranks other than 0; rank 0 sends");
  if (rows < 1 || rows > b.options.max_streams)
    fail("broadcast: {} rows is outside 1..{} (max_streams)", rows, b.options.max_streams);
  if (steps < 1 || steps > b.options.max_steps)
    fail("broadcast: steps = {} is outside 1..{} (max_steps)", steps, b.options.max_steps);
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(b.options.max_steps);
  b.broadcast(b.tokens.data(), b.confidences.data(), count, stream);
  return DeviceDraftOutputs{reinterpret_cast<const int32_t*>(b.tokens.data()),
                            reinterpret_cast<const float*>(b.confidences.data()), b.options.max_steps, rows, steps};
}

void DraftBroadcast::wait(cudaStream_t stream) {
  Impl& b = *impl_;
  b.check_usable();
  cuda::DeviceScope scope(b.options.device);
  const auto deadline = Clock::now() + b.options.timeout;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) TFE_CUDA(e);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(b.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
      b.abort(fmt::format("the communicator reports {}", nccl_text(async)));
    if (Clock::now() > deadline)
      b.abort(fmt::format("no completion within {} ms: a rank may have died or stopped calling",
                          b.options.timeout.count()));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace tfe
