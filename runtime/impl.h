// Runtime::Impl: the state behind a tfe::Runtime, shared by open.cpp, runtime.cpp and the testing hooks
// (runtime/testing.h). Not installed.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tfe/runtime.h>

#include "compiler/resolve.h"
#include "core/error.h"
#include "core/extend_check.h"
#include "device/cuda_check.h"
#include "device/gemm.h"
#include "device/handles.h"
#include "device/kernels.h"
#include "graphs/graph_cache.h"
#include "plan/plan.h"
#include "runtime/environment.h"
#include "runtime/self_check.h"
#include "runtime/tap_dump.h"

namespace tfe {

// What tests and measurements change in how a runtime runs its plan; the defaults are the product's.
struct TestHooks {
  // Before each replay: the graph's captured addresses are the live ones.
  bool check_bindings = true;
  // Programmatic dependent launch of the draft passes' kernels (Node::dependent): plan: where the plan
  // marks it; off: nowhere; all: every kernel node of every draft pass.
  enum class DependentLaunch : uint8_t { plan, off, all };
  DependentLaunch dependent_launch = DependentLaunch::plan;
  // Draft-pass nodes left out of every pass, named without their step prefix ("post_norm"), to time what
  // the rest of a pass costs inside the graph (tfe-bench --knock-out). The drafts are then wrong. A left-out
  // node's outputs keep what they last held (zeros from open on), so the nodes after it still read ids and
  // rows in range. Checked at open by check_knock_out (plan/plan.h).
  std::vector<std::string> knock_out;
  // The tuning the runtime plans with (none of it is the engine's to choose); an artifact's plan keeps its own.
  Tuning tuning;
  // When the draft graphs are captured (with OpenOptions::graphs): at open, the product's way, or lazily,
  // each at its first replay, so that open and capture are timed apart (tfe-bench) and a capture meets a draft.
  enum class Capture : uint8_t { at_open, lazy };
  Capture capture = Capture::at_open;
  size_t graph_capacity = 0;  // executors kept; 0: room for every pass in both forms (2 x buckets x max_steps)
  // Bytes of L2 set aside so that part of the draft GEMVs' weights stays in L2 from one step to the next
  // (each GEMV's weight matrix launches as an L2 access-policy window whose hit ratio is the set-aside over
  // a step's GEMV weight bytes; its other lines stream). 0: none, the default. Clamped to the device's
  // cudaDevAttrMaxPersistingL2CacheSize; refused where that is 0. The persisting-L2 limit is the process's
  // (cudaLimitPersistingL2CacheSize): the runtime sets it at open, and at close resets the persisting lines
  // (cudaCtxResetPersistingL2Cache) and puts back the limit it found. While it is open, the set-aside part
  // of L2 holds the head's weights between calls too, which the target model's passes then do without
  // (tfe-bench --l2-resident-mb, BENCHMARKS.md "L2 set-aside").
  size_t l2_resident_weight_bytes = 0;
  // Faults injected where the GPU side can fail, each through the path a real failure takes, so that tests
  // see what it leaves behind. capture: each capture of a draft pass makes a call that capture forbids
  // (cudaMalloc), so the capture is invalidated. instantiate: the next instantiation of a graph fails with
  // this error. corrupt_cubin: the specialization of this uri loads a cubin of garbage bytes.
  struct Faults {
    bool capture = false;
    cudaError_t instantiate = cudaSuccess;
    std::string corrupt_cubin;
    // negate_weight: every bf16 value of this weight buffer has its sign flipped in device memory right after
    // the upload, as a corrupted upload would leave it, so that the self-check (OpenOptions::self_check) meets
    // a runtime that drafts wrong. The final norm's weights negate n, so the vocabulary head's logits.
    std::string negate_weight;
  };
  Faults faults;
};

constexpr int64_t kAlign = 256;

using cuda::DeviceScope;

inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

inline std::string device_arch(int device) {
  int major = 0, minor = 0;
  TFE_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TFE_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return fmt::format("sm_{}{}", major, minor);
}

// The device's persisting-L2 set-aside while a runtime that asked for one is open
// (TestHooks::l2_resident_weight_bytes). The limit is the process's, so the one found at open comes back
// at close, and the lines made persisting are made normal again.
class L2Reservation {
 public:
  L2Reservation() = default;
  L2Reservation(size_t wanted, int device) {
    int most = 0;
    TFE_CUDA(cudaDeviceGetAttribute(&most, cudaDevAttrMaxPersistingL2CacheSize, device));
    if (most <= 0)
      fail(
          "l2_resident_weight_bytes: device {} sets no L2 aside for persisting accesses "
          "(cudaDevAttrMaxPersistingL2CacheSize is 0)",
          device);
    TFE_CUDA(cudaDeviceGetLimit(&previous_, cudaLimitPersistingL2CacheSize));
    bytes_ = std::min(wanted, static_cast<size_t>(most));
    TFE_CUDA(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes_));
  }
  L2Reservation(const L2Reservation&) = delete;
  L2Reservation& operator=(const L2Reservation&) = delete;
  L2Reservation& operator=(L2Reservation&& o) noexcept {
    std::swap(bytes_, o.bytes_);
    std::swap(previous_, o.previous_);
    return *this;
  }
  ~L2Reservation() {
    if (bytes_ == 0) return;
    TFE_CUDA_NOEXCEPT(cudaCtxResetPersistingL2Cache());
    TFE_CUDA_NOEXCEPT(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, previous_));
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;  // set aside; 0: nothing asked, nothing to give back
  size_t previous_ = 0;
};

// A node of the plan, ready to enqueue: a packed kernel launch or a cuBLASLt GEMM.
struct PreparedNode {
  std::string name;
  int step = 0;
  bool last_step_only = false;
  Node::Rows rows = Node::Rows::fixed;
  std::optional<cuda::KernelLaunch> kernel;
  int gemm = -1;
};

struct Runtime::Impl {
  // Declaration order is release order reversed: graphs go before the kernels and memory they name,
  // the memory before the stream it was used on is gone.
  Plan plan;
  OpenOptions options;
  TestHooks hooks;
  int device = 0;
  L2Reservation l2;  // released last: after every launch that named it
  cuda::Stream own_stream;
  cudaStream_t stream = nullptr;
  cuda::DeviceMemory memory;  // weights | arena | cuBLASLt workspace, one allocation
  std::byte* weights = nullptr;
  std::byte* arena = nullptr;
  std::byte* workspace = nullptr;
  // Host staging of the tables region, double-buffered so that packing the next extend chunk overlaps
  // the previous chunk's copy; `staged[i]` marks the end of buffer i's last copy.
  cuda::PinnedMemory staging[2];
  cuda::Event staged[2];
  int next_staging = 0;
  // The host arena (Plan::host): mapped pinned memory. The host writes a draft's tables here and reads its
  // outputs here; the pass's kernels reach it through `host_device`. draft() waits for its pass before
  // returning, so the next call may rewrite the tables.
  cuda::PinnedMemory host_memory;
  std::byte* host = nullptr;
  std::byte* host_device = nullptr;
  std::vector<cuda::Library> libraries;
  std::map<std::string, cuda::LoadedKernel> kernels;  // by spec uri
  cuda::GemmRunner gemm;
  std::vector<std::vector<PreparedNode>> buckets;  // parallel to plan.buckets
  // The same passes enqueued (draft_async): load_tables reads draft_slots, no store_outputs.
  std::vector<std::vector<PreparedNode>> enqueued;
  std::optional<PreparedNode> gather;  // the extend pass's first node, for rows in device memory only
  std::vector<PreparedNode> extend;    // the rest of the extend pass
  std::optional<GraphCache> graphs;
  SlotTable slots;
  RuntimeStats stats;
  std::unique_ptr<AcceptLog> accept_log;
  std::unique_ptr<TapDump> tap_dump;         // null: off
  SelfCheckReport self_check;                // what the self-check at open compared (cases 0: it did not run)
  bool check_taps = false;                   // checks on (the self-check's switch): host taps must be finite
  std::string broken;                        // the first failure after which device state is unknown
  cudaError_t injected_error = cudaSuccess;  // testing::inject_cuda_error: the next device work fails so
  DeviceDraftOutputs last_outputs;
  // Slot ids (and, with first_ranks, ranks) of draft_async's host form, copied from here on the stream: a
  // ring of kIdRing tables of 2 x the largest bucket, each reused once the copy that read it last has left
  // it (`id_staged`).
  static constexpr int kIdRing = 8;
  cuda::PinnedMemory id_staging;
  cuda::Event id_staged[kIdRing];
  int next_ids = 0;
  // Tables the runtime fills, found once.
  const Buffer *h_tables = nullptr, *h_token = nullptr, *h_conf = nullptr, *h_done = nullptr, *h_error = nullptr;
  const Buffer *h_ranks = nullptr, *b_draft_ranks = nullptr;  // null: the plan has first_ranks off
  const Buffer *t_row_slot = nullptr, *t_row_pos = nullptr, *t_row_tok = nullptr;
  const Buffer *t_row_taps_src = nullptr, *t_row_tok_src = nullptr;
  const Buffer *t_last_row = nullptr, *t_last_slot = nullptr, *t_last_first = nullptr, *t_taps = nullptr;
  const Buffer *b_out_token = nullptr, *b_out_conf = nullptr, *b_ring_k = nullptr, *b_ring_v = nullptr;
  const Buffer *b_slot_state = nullptr, *b_draft_slots = nullptr;

  explicit Impl(Plan p, SlotLimits limits) : plan(std::move(p)), slots(limits) {}
  ~Impl() {
    // Nothing may be released while the stream still uses it.
    if (stream) TFE_CUDA_NOEXCEPT(cudaStreamSynchronize(stream));
  }

  Bindings bindings() const { return Bindings{arena, arena + plan.tables_offset, weights, workspace, host_device}; }
  int scratch_slot() const { return plan.options.max_slots; }
  int32_t* draft_slots_device() const { return reinterpret_cast<int32_t*>(arena + b_draft_slots->offset); }
  int32_t* draft_ranks_device() const { return reinterpret_cast<int32_t*>(arena + b_draft_ranks->offset); }
  // A draft's first ranks (host values, or `on_device` ones the device checks), as the reference checks
  // them (core/extend_check.h); a rank above 0, or any from the device, needs the plan option first_ranks.
  void check_ranks(std::string_view call, std::span<const int> first_ranks, size_t slots,
                   bool on_device = false) const {
    check_first_ranks(call, first_ranks, slots, plan.header);
    const bool ranked = on_device || std::any_of(first_ranks.begin(), first_ranks.end(), [](int r) { return r > 0; });
    if (ranked && !plan.options.first_ranks)
      fail(
          "{}: first_ranks given, but this runtime's plan has first_ranks off; open it with the plan option "
          "first_ranks (tfe-plan compile --first-ranks, PlanOptions::first_ranks)",
          call);
  }

  void check_usable() const {
    if (!broken.empty())
      fail_cuda("runtime: unusable after an earlier device failure ({}); destroy it and open a new one", broken);
  }
  // Runs device work; any failure marks the runtime unusable, since device state is then unknown.
  template <typename F>
  auto device_work(F&& f) -> decltype(f()) {
    try {
      if (injected_error != cudaSuccess) TFE_CUDA(std::exchange(injected_error, cudaSuccess));
      return f();
    } catch (const std::exception& e) {
      broken = e.what();
      throw;
    }
  }

  // The one function that enqueues plan nodes, used both eagerly and under graph capture: a graph holds
  // exactly the launches an eager pass makes. `step_limit`: nodes with a larger step are left out (the
  // pass of fewer steps is a prefix), and so are last_step_only nodes of a smaller one (the final node of
  // a shorter pass). `rows`: fixed and chunk_rows nodes; `slot_rows`: chunk_slots nodes.
  void launch_nodes(std::span<const PreparedNode> nodes, int step_limit, int64_t rows, int64_t slot_rows,
                    cudaStream_t s) {
    for (const PreparedNode& n : nodes) {
      if (n.step > step_limit) break;
      if (n.last_step_only && n.step < step_limit) continue;
      const int64_t r = n.rows == Node::Rows::chunk_slots ? slot_rows : rows;
      if (n.kernel)
        n.kernel->launch(r, s);
      else
        gemm.run(n.gemm, r, s);
    }
  }

  std::byte* staging_buffer() {
    const int i = next_staging;
    next_staging ^= 1;
    // The buffer's previous copy must have left it before it is overwritten.
    TFE_CUDA(cudaEventSynchronize(staged[i].get()));
    cur_staging = i;
    return staging[i].data();
  }
  // Copies [first, first + bytes) of the tables region from the current staging buffer.
  void upload_tables(int64_t first, int64_t bytes, cudaStream_t s) {
    const int64_t rel = first - plan.tables_offset;
    TFE_CUDA(cudaMemcpyAsync(arena + first, staging[cur_staging].data() + rel, static_cast<size_t>(bytes),
                             cudaMemcpyHostToDevice, s));
    TFE_CUDA(cudaEventRecord(staged[cur_staging].get(), s));
    stats.bytes_uploaded += static_cast<uint64_t>(bytes);
  }
  template <typename T>
  T* host_buffer(const Buffer* b) {
    return reinterpret_cast<T*>(host + b->offset);
  }

  // Waits until the draft pass's last node (store_outputs) has set host_done, which it does after the
  // outputs have reached host memory. The word lands sooner than the stream's completion of the graph
  // launch, which cudaStreamSynchronize would wait for; work enqueued later stays ordered after the pass
  // by the stream. Meanwhile the stream is asked every kQueryEvery, so that a failed pass throws its CUDA
  // error instead of leaving the host spinning.
  void wait_for_outputs() {
    constexpr auto kQueryEvery = std::chrono::microseconds(20);
    std::atomic_ref<int32_t> done(*host_buffer<int32_t>(h_done));
    auto next_query = std::chrono::steady_clock::now() + kQueryEvery;
    while (done.load(std::memory_order_acquire) != 1) {
      const auto now = std::chrono::steady_clock::now();
      if (now < next_query) continue;
      next_query = now + kQueryEvery;
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaErrorNotReady) continue;
      TFE_CUDA(e);
      if (done.load(std::memory_order_acquire) != 1)
        fail("draft: the pass completed without setting host_done (its last node must be store_outputs)");
    }
  }
  template <typename T>
  T* staged_table(std::byte* base, const Buffer* b) {
    return reinterpret_cast<T*>(base + (b->offset - plan.tables_offset));
  }
  int cur_staging = 0;

  void open_device(const OpenOptions& o);
  void upload_weights(const HeadFile& file);
  void upload_tiled(const Buffer& b, const std::vector<const TensorView*>& parts, std::byte* dst);
  void load_kernels(const std::map<std::string, KernelImage>& images);
  void prepare_nodes();
  void capture_all();
  GraphCache::Record draft_record(size_t bucket, int steps, bool enqueued_pass = false) {
    return [this, bucket, steps, enqueued_pass](cudaStream_t s) {
      launch_nodes((enqueued_pass ? enqueued : buckets)[bucket], steps, plan.buckets[bucket].streams, 0, s);
      if (hooks.faults.capture) {
        void* p = nullptr;
        (void)cudaMalloc(&p, 1);  // refused under capture, which it invalidates; nothing is allocated
      }
    };
  }

  cudaStream_t stream_for(std::optional<cudaStream_t> s) const { return s ? *s : stream; }
  // Whether `s` is recording into a graph (the caller's capture): then nothing may read host memory the
  // runtime rewrites, nor wait on the host.
  static bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TFE_CUDA(cudaStreamIsCapturing(s, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  void refuse_capture(cudaStream_t s, std::string_view call, std::string_view why) const {
    if (capturing(s)) fail("{}: the stream is capturing a graph; {}", call, why);
  }
  // Throws, once, what a kernel found wrong in device input the host never saw (kernels/constants.h
  // kError*): load_tables' slot ids, gather_taps' tokens. The record is host memory, so reading it waits for
  // nothing; a record still in flight is reported by a later call.
  void report_device_errors(std::string_view call);
  // Bucket index for n rows (n within 1..largest bucket).
  size_t bucket_for(int n) const {
    size_t b = 0;
    while (plan.buckets[b].streams < n) ++b;
    return b;
  }
  // Enqueues a draft pass whose slot ids are in draft_slots: the runtime's graph, or, on a capturing
  // stream, the same launches node by node into the caller's graph. Then the outputs to `targets`.
  DeviceDraftOutputs enqueue_draft(int n, int steps, const DraftTargets& targets, cudaStream_t s);
};

// Opens a runtime with test hooks (Runtime::open passes the defaults).
Runtime open_runtime(const HeadFile& file, const OpenOptions& options, const TestHooks& hooks);

struct RuntimeAccess {
  using Impl = Runtime::Impl;
  static Runtime::Impl& impl(const Runtime& r) { return *r.impl_; }
  static Runtime make(std::unique_ptr<Runtime::Impl> impl) { return Runtime(std::move(impl)); }
};

}  // namespace tfe
