#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "compiler/artifact.h"
#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "graphs/graph_cache.h"
#include "plan/error.h"
#include "plan/head_file.h"
#include "plan/weight_layout.h"
#include "runtime/cuda_check.h"
#include "runtime/device_gemm.h"
#include "runtime/device_handles.h"
#include "runtime/device_kernels.h"
#include "runtime/reference_ops.h"

namespace tfe {

namespace {

constexpr int64_t kAlign = 256;

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Makes `device` current for the scope and restores the caller's device after it: an engine thread may
// drive several GPUs.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    TFE_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) TFE_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) TFE_CUDA_NOEXCEPT(cudaSetDevice(previous_));
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

std::string device_arch(int device) {
  int major = 0, minor = 0;
  TFE_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TFE_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return fmt::format("sm_{}{}", major, minor);
}

// How the asked plan options differ from an artifact's, but for the arch, which the runtime always takes
// from the device; empty where they agree.
std::string differences_except_arch(PlanOptions asked, const PlanOptions& artifact) {
  asked.arch = artifact.arch;
  return plan_options_differences(artifact, asked);
}

// A cubin and the symbol to look up in it.
struct KernelImage {
  std::string lowered_name;
  std::string cubin;
};

// The device's persisting-L2 set-aside while a runtime that asked for one is open
// (OpenOptions::l2_resident_weight_bytes). The limit is the process's, so the one found at open comes back
// at close, and the lines made persisting are made normal again.
class L2Reservation {
 public:
  L2Reservation() = default;
  L2Reservation(size_t wanted, int device) {
    int most = 0;
    TFE_CUDA(cudaDeviceGetAttribute(&most, cudaDevAttrMaxPersistingL2CacheSize, device));
    if (most <= 0)
      fail("l2_resident_weight_bytes: device {} sets no L2 aside for persisting accesses "
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

}  // namespace

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
  std::vector<PreparedNode> extend;
  std::optional<GraphCache> graphs;
  SlotTable slots;
  RuntimeStats stats;
  std::string broken;  // the first failure after which device state is unknown
  DeviceDraftOutputs last_outputs;
  // Tables the runtime fills, found once.
  const Buffer *h_tables = nullptr, *h_token = nullptr, *h_conf = nullptr, *h_done = nullptr;
  const Buffer *t_row_slot = nullptr, *t_row_pos = nullptr, *t_row_tok = nullptr;
  const Buffer *t_last_row = nullptr, *t_last_slot = nullptr, *t_taps = nullptr;
  const Buffer *b_out_token = nullptr, *b_out_conf = nullptr, *b_ring_k = nullptr, *b_ring_v = nullptr;

  explicit Impl(Plan p, SlotLimits limits) : plan(std::move(p)), slots(limits) {}
  ~Impl() {
    // Nothing may be released while the stream still uses it.
    if (stream) TFE_CUDA_NOEXCEPT(cudaStreamSynchronize(stream));
  }

  Bindings bindings() const {
    return Bindings{arena, arena + plan.tables_offset, weights, workspace, host_device};
  }
  int scratch_slot() const { return plan.options.max_slots; }

  void check_usable() const {
    if (!broken.empty())
      fail("runtime: unusable after an earlier device failure ({}); destroy it and open a new one", broken);
  }
  // Runs device work; any failure marks the runtime unusable, since device state is then unknown.
  template <typename F>
  auto device_work(F&& f) -> decltype(f()) {
    try {
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
  void upload_tables(int64_t first, int64_t bytes) {
    const int64_t rel = first - plan.tables_offset;
    TFE_CUDA(cudaMemcpyAsync(arena + first, staging[cur_staging].data() + rel, static_cast<size_t>(bytes),
                             cudaMemcpyHostToDevice, stream));
    TFE_CUDA(cudaEventRecord(staged[cur_staging].get(), stream));
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
  GraphCache::Record draft_record(size_t bucket, int steps) {
    return [this, bucket, steps](cudaStream_t s) {
      launch_nodes(buckets[bucket], steps, plan.buckets[bucket].streams, 0, s);
    };
  }
};

namespace {

SlotLimits slot_limits(const Plan& p) {
  SlotLimits l;
  l.max_slots = p.options.max_slots;
  l.ring_rows = p.ring_rows;
  l.vocab = p.header.vocab;
  l.max_steps = p.options.max_steps;
  l.max_streams = p.options.buckets.back();
  l.window = p.header.window;
  return l;
}

// A buffer the runtime itself fills or reads, by name: a plan that validates may still lack one (validate
// checks what the nodes bind, not what the runtime expects), so the refusal names the arena and the role.
const Buffer* table(const Plan& p, std::string_view name, BufferRole role = BufferRole::table) {
  const bool in_host = role == BufferRole::host;
  const Buffer* found = in_host ? p.host.find(name) : p.arena.find(name);
  if (!found)
    fail("plan: the {} has no buffer `{}`; the runtime needs it as a {} buffer", in_host ? "host arena" : "arena",
         name, buffer_role_name(role));
  const Buffer& b = *found;
  if (b.role != role)
    fail("plan: buffer `{}` has role {}, the runtime expects {}", name, buffer_role_name(b.role), buffer_role_name(role));
  return &b;
}

// The plan and its kernels: from the artifact when it fits this head and device, else planned and
// compiled through the kernel cache.
struct Planned {
  Plan plan;
  std::map<std::string, KernelImage> images;
};

Planned plan_and_compile(const HeadHeader& header, const std::string& sha, PlanOptions options) {
  Planned out;
  out.plan = make_plan(header, options, sha);
  const KernelCache cache = KernelCache::from_environment();
  CompileOptions copt;
  copt.arch = options.arch;
  // Specializations compile independently; the cache serializes writers of one key.
  std::vector<std::future<CachedKernel>> jobs;
  for (const KernelSpec& spec : out.plan.specs)
    jobs.push_back(std::async(std::launch::async, [&cache, &copt, spec] {
      return cache.get(make_compile_unit(spec), copt);
    }));
  std::optional<Error> first;
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      CachedKernel k = jobs[i].get();
      out.images[out.plan.specs[i].uri()] = KernelImage{k.kernel.lowered_name, std::move(k.kernel.cubin)};
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
  return out;
}

Planned plan_for(const HeadFile& file, const OpenOptions& o, const std::string& arch) {
  const std::string sha = file.header_sha256();
  PlanOptions wanted = o.plan.value_or(PlanOptions{});
  wanted.arch = arch;
  if (o.artifact_dir.empty()) return plan_and_compile(file.header(), sha, wanted);

  Artifact art = load_artifact(o.artifact_dir);
  std::string mismatch;
  if (art.plan.head_sha256 != sha)
    mismatch = fmt::format("it was compiled for the head with header sha256 {}, but {} has {}", art.plan.head_sha256,
                           file.file().path(), sha);
  else if (art.arch != arch || art.plan.options.arch != arch)
    mismatch = fmt::format("it was compiled for {}, but device {} is {}", art.arch, o.device, arch);
  else if (const std::string d = o.plan ? differences_except_arch(*o.plan, art.plan.options) : ""; !d.empty())
    mismatch = fmt::format("its plan options differ from those asked (the artifact's against the asked): {}", d);
  if (!mismatch.empty()) {
    if (!o.recompile_mismatched_artifact)
      fail("artifact {}: {}; compile one for this head and device (tfe-plan compile), or open with "
           "recompile_mismatched_artifact",
           o.artifact_dir, mismatch);
    if (!o.plan) wanted = art.plan.options, wanted.arch = arch;
    return plan_and_compile(file.header(), sha, wanted);
  }
  validate(art.plan);
  Planned out;
  out.plan = std::move(art.plan);
  for (ArtifactKernel& k : art.kernels) out.images[k.uri] = KernelImage{k.lowered_name, std::move(k.cubin)};
  return out;
}

}  // namespace

void Runtime::Impl::open_device(const OpenOptions& o) {
  if (o.stream) {
    if (o.stream == cudaStreamLegacy && o.graphs)
      fail("runtime: the legacy default stream cannot be captured into a graph; pass a created stream, or none");
    stream = o.stream;
  } else {
    own_stream = cuda::create_stream();
    stream = own_stream.get();
  }
  const int64_t weights_bytes = align_up(plan.weights.bytes, kAlign);
  const int64_t arena_bytes = align_up(plan.arena.bytes, kAlign);
  const int64_t total = weights_bytes + arena_bytes + plan.cublaslt_workspace;
  memory = cuda::allocate_device(static_cast<size_t>(total), "weights, arena and cuBLASLt workspace");
  weights = memory.data();
  arena = weights + weights_bytes;
  workspace = plan.cublaslt_workspace > 0 ? arena + arena_bytes : nullptr;
  // A zero arena: the scratch slot's ring holds valid (zero) keys, and nothing reads uninitialized memory.
  TFE_CUDA(cudaMemsetAsync(arena, 0, static_cast<size_t>(arena_bytes), stream));
  for (int i = 0; i < 2; ++i) {
    staging[i] = cuda::allocate_pinned(static_cast<size_t>(plan.tables_bytes), "tables staging buffer");
    std::memset(staging[i].data(), 0, staging[i].bytes());
    staged[i] = cuda::create_event();
    TFE_CUDA(cudaEventRecord(staged[i].get(), stream));
  }
  // The host arena starts zeroed, like the arena: a pass never reads bytes the host has not written.
  host_memory = cuda::allocate_mapped(static_cast<size_t>(std::max<int64_t>(plan.host.bytes, 1)), "host arena",
                                      &host_device);
  host = host_memory.data();
  std::memset(host, 0, host_memory.bytes());
}

void Runtime::Impl::upload_weights(const HeadFile& file) {
  for (const Buffer& b : plan.weights.buffers) {
    std::byte* dst = weights + b.offset;
    if (b.from.size() == 1 && b.from[0] == "computed:rope_inv_freq") {
      // The CPU reference's own function: both sides rotate by identical frequencies.
      const std::vector<float> f = ref::rope_inv_freq(plan.header);
      if (static_cast<int64_t>(f.size() * sizeof(float)) != b.bytes || b.dtype != DType::F32)
        fail("weights: `{}` is {} bytes of {}, the RoPE table has {} fp32 values", b.name, b.bytes,
             dtype_name(b.dtype), f.size());
      TFE_CUDA(cudaMemcpy(dst, f.data(), static_cast<size_t>(b.bytes), cudaMemcpyHostToDevice));
      stats.weight_bytes += static_cast<uint64_t>(b.bytes);
      continue;
    }
    if (b.from.empty()) fail("weights: `{}` names no file tensor to upload", b.name);
    int64_t at = 0;
    std::vector<const TensorView*> parts;
    for (const std::string& name : b.from) {
      const TensorView& t = file.tensor(name);
      if (t.dtype != b.dtype)
        fail("weights: `{}` is {}, but its part `{}` in {} is {}", b.name, dtype_name(b.dtype), name,
             file.file().path(), dtype_name(t.dtype));
      if (at + t.bytes > b.bytes)
        fail("weights: the parts of `{}` ({}) hold more than its {} bytes", b.name, fmt::join(b.from, ", "), b.bytes);
      // Every byte is read here anyway; the FP8 GEMV would read a NaN code as a finite weight.
      if (t.dtype == DType::F8_E4M3) check_e4m3_finite({t.data, static_cast<size_t>(t.bytes)}, name, "weights");
      if (b.layout == Layout::rows)
        TFE_CUDA(cudaMemcpy(dst + at, t.data, static_cast<size_t>(t.bytes), cudaMemcpyHostToDevice));
      parts.push_back(&t);
      at += t.bytes;
    }
    if (at != b.bytes)
      fail("weights: the parts of `{}` ({}) hold {} bytes, the plan needs {}", b.name, fmt::join(b.from, ", "), at,
           b.bytes);
    if (b.layout == Layout::tiled) upload_tiled(b, parts, dst);
    stats.weight_bytes += static_cast<uint64_t>(b.bytes);
  }
}

// A tiled matrix (plan/weight_layout.h) is reordered on the host, its parts (the file tensors concatenated
// along rows) read in place, and uploaded in one copy.
void Runtime::Impl::upload_tiled(const Buffer& b, const std::vector<const TensorView*>& parts, std::byte* dst) {
  const int64_t rows = b.shape[0], row_bytes = b.bytes / rows;
  std::vector<const std::byte*> row_at;
  row_at.reserve(static_cast<size_t>(rows));
  for (const TensorView* t : parts) {
    if (t->bytes % row_bytes != 0)
      fail("weights: part of `{}` holds {} bytes, not whole rows of {} bytes", b.name, t->bytes, row_bytes);
    for (int64_t r = 0; r < t->bytes / row_bytes; ++r) row_at.push_back(t->data + r * row_bytes);
  }
  std::vector<std::byte> tiled(static_cast<size_t>(b.bytes));
  // Bands of whole tiles on several threads: on one thread, open of the 1.9 GB llama3-8b-eagle3 bf16
  // head took 1.2 s against 0.45 s row-major.
  const int64_t tiles = rows / kTileRows;
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  const int64_t band = (tiles + threads - 1) / threads;
  std::vector<std::future<void>> jobs;
  for (int64_t first = 0; first < tiles; first += band) {
    const int64_t count = std::min(band, tiles - first);
    jobs.push_back(std::async(std::launch::async, [&, first, count] {
      tile_rows([&](int64_t r) { return row_at[static_cast<size_t>(first * kTileRows + r)]; }, count * kTileRows,
                row_bytes, tiled.data() + first * kTileRows * row_bytes);
    }));
  }
  for (auto& j : jobs) j.get();
  TFE_CUDA(cudaMemcpy(dst, tiled.data(), tiled.size(), cudaMemcpyHostToDevice));
}

void Runtime::Impl::load_kernels(const std::map<std::string, KernelImage>& images) {
  // The most dynamic shared memory any node asks of each specialization.
  std::map<std::string, int64_t> smem;
  auto note = [&](const std::vector<Node>& nodes) {
    for (const Node& n : nodes)
      if (n.kind == Node::Kind::kernel) smem[n.spec] = std::max(smem[n.spec], n.launch.smem);
  };
  for (const Bucket& b : plan.buckets) note(b.nodes);
  note(plan.extend);

  for (const KernelSpec& spec : plan.specs) {
    const std::string uri = spec.uri();
    const auto it = images.find(uri);
    if (it == images.end()) fail("runtime: no cubin for kernel specialization {}", uri);
    libraries.push_back(cuda::load_library(it->second.cubin.data(), uri.c_str()));
    cuda::LoadedKernel k;
    k.uri = uri;
    const cudaError_t e = cudaLibraryGetKernel(&k.kernel, libraries.back().get(), it->second.lowered_name.c_str());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail("runtime: the cubin of {} has no kernel `{}`: {}", uri, it->second.lowered_name, cudaGetErrorName(e));
    }
    // Also loads the kernel into this device's context now: a first load during capture would be an
    // unsafe call inside the captured region.
    cudaFuncAttributes attr{};
    TFE_CUDA(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k.kernel)));
    k.max_threads_per_block = attr.maxThreadsPerBlock;
    k.static_smem = static_cast<int64_t>(attr.sharedSizeBytes);
    cuda::allow_dynamic_smem(k.kernel, smem[uri], device, uri);
    kernels.emplace(uri, k);
  }
}

void Runtime::Impl::prepare_nodes() {
  const cuda::ArenaBases bases{&plan, weights, arena, host_device};
  if (plan.cublaslt_workspace > 0) gemm = cuda::GemmRunner(workspace, static_cast<size_t>(plan.cublaslt_workspace));
  // L2-resident weights (OpenOptions::l2_resident_weight_bytes): every draft GEMV launches with its weight
  // matrix as an access-policy window whose hit ratio is the set-aside over the weight bytes of one step's
  // GEMVs, so that about that many bytes of each step's weights are still in L2 when the next step reads
  // them, and the rest stream without evicting the rings and activations.
  const auto gemv_weights = [&](const Node& n) -> const Arg* {
    if (n.kind != Node::Kind::kernel) return nullptr;
    const std::string& k = plan.spec(n.spec).kernel;
    if (k != "gemv" && k != "gemv_cluster" && k != "gemv_rope_kv") return nullptr;
    const auto w = std::ranges::find(n.args, std::string("w"), &Arg::param);
    return w != n.args.end() && w->kind == Arg::Kind::buffer ? &*w : nullptr;
  };
  const auto weight_bytes = [&](const Arg& w) { return plan.weights.at(w.buffer).bytes - w.byte_offset; };
  double hit_ratio = 0.0;
  size_t most_window = 0;
  if (l2.bytes() > 0 && !plan.buckets.empty()) {
    int64_t step_bytes = 0;
    for (const Node& n : plan.buckets.front().nodes)
      if (const Arg* w = gemv_weights(n); w && n.step == 1) step_bytes += weight_bytes(*w);
    if (step_bytes > 0) hit_ratio = std::min(1.0, static_cast<double>(l2.bytes()) / static_cast<double>(step_bytes));
    int window = 0;
    TFE_CUDA(cudaDeviceGetAttribute(&window, cudaDevAttrMaxAccessPolicyWindowSize, device));
    most_window = static_cast<size_t>(std::max(window, 0));
  }
  const auto l2_window = [&](const Node& n) {
    cuda::L2Window window;
    const Arg* w = gemv_weights(n);
    if (!w || hit_ratio <= 0.0 || most_window == 0) return window;
    window.base = bases.address(w->buffer, w->byte_offset, n.name);
    // Past the device's largest window a matrix's lines keep the normal policy.
    window.bytes = std::min(static_cast<size_t>(weight_bytes(*w)), most_window);
    window.hit_ratio = static_cast<float>(hit_ratio);
    return window;
  };
  auto prepare = [&](const Node& n, int64_t fixed_rows, bool draft) {
    PreparedNode p;
    p.name = n.name;
    p.step = n.step;
    p.last_step_only = n.last_step_only;
    p.rows = n.rows;
    const int64_t max_rows = n.rows == Node::Rows::fixed        ? fixed_rows
                             : n.rows == Node::Rows::chunk_rows ? plan.options.extend_rows
                                                                : plan.options.max_slots;
    if (n.kind == Node::Kind::kernel) {
      using Dependent = OpenOptions::DependentLaunch;
      const Dependent d = options.dependent_launch;
      const bool dependent = d == Dependent::plan ? n.dependent : d == Dependent::all && n.step >= 1;
      p.kernel.emplace(n, kernels.at(n.spec), bases, max_rows, dependent, draft ? l2_window(n) : cuda::L2Window{});
    } else {
      if (plan.cublaslt_workspace <= 0) fail("plan: node {} is a GEMM but the plan reserves no cuBLASLt workspace", n.name);
      const Gemm& g = n.gemm;
      const Buffer& w = plan.weights.at(g.w);
      const Buffer& x = plan.arena.at(g.x);
      const Buffer& y = plan.arena.at(g.y);
      if (w.dtype != DType::BF16 || x.dtype != DType::BF16 || y.dtype != DType::BF16)
        fail("plan: GEMM node {} needs bf16 operands ({} {}, {} {}, {} {})", n.name, g.w, dtype_name(w.dtype), g.x,
             dtype_name(x.dtype), g.y, dtype_name(y.dtype));
      if (g.w_offset < 0 || g.w_offset + g.n * g.k * 2 > w.bytes)
        fail("plan: GEMM node {} reads {} x {} bf16 at byte {} of `{}`, which holds {} bytes", n.name, g.n, g.k,
             g.w_offset, g.w, w.bytes);
      cuda::GemmOperands op;
      op.name = n.name;
      op.w = bases.address(g.w, g.w_offset, n.name);
      op.x = bases.address(g.x, 0, n.name);
      op.y = bases.address(g.y, 0, n.name);
      op.n = g.n;
      op.k = g.k;
      op.ldx = x.shape.back();
      op.ldy = y.shape.back();
      op.max_rows = std::min({max_rows, x.shape.front(), y.shape.front()});
      p.gemm = gemm.add(op);
      if (n.rows == Node::Rows::fixed) gemm.prepare(p.gemm, fixed_rows);
    }
    return p;
  };
  check_knock_out(plan, options.knock_out);
  const auto knocked_out = [&](const Node& n) {
    return std::ranges::find(options.knock_out, node_base_name(n)) != options.knock_out.end();
  };
  for (const Bucket& b : plan.buckets) {
    std::vector<PreparedNode> nodes;
    int last_step = 0;
    for (const Node& n : b.nodes) {
      if (n.step < last_step || n.step < 1 || n.step > plan.options.max_steps)
        fail("plan: node {} of bucket {} has step {}; steps must ascend within 1..{}", n.name, b.streams, n.step,
             plan.options.max_steps);
      last_step = n.step;
      if (knocked_out(n)) continue;
      nodes.push_back(prepare(n, b.streams, true));
    }
    buckets.push_back(std::move(nodes));
  }
  for (const Node& n : plan.extend) {
    if (n.rows == Node::Rows::fixed) fail("plan: extend node {} has a fixed row count", n.name);
    extend.push_back(prepare(n, 0, false));
  }
}

void Runtime::Impl::capture_all() {
  for (size_t b = 0; b < plan.buckets.size(); ++b)
    for (int s = 1; s <= plan.options.max_steps; ++s)
      graphs->prepare(GraphKey{plan.buckets[b].streams, s}, bindings(), draft_record(b, s));
}

namespace {
void check_device(int device) {
  const int count = cuda::device_count();
  if (count == 0) fail("runtime: no CUDA device (cudaGetDeviceCount reports none or fails)");
  if (device < 0 || device >= count) fail("runtime: device {} is outside 0..{}", device, count - 1);
}
}  // namespace

Runtime Runtime::open(const std::string& head_path, const OpenOptions& o) {
  check_device(o.device);
  HeadFile::Options fo;
  fo.verify_sha256 = o.verify_sha256;
  return open(HeadFile::open(head_path, fo), o);
}

Runtime Runtime::open(const HeadFile& file, const OpenOptions& o) {
  check_device(o.device);
  DeviceScope scope(o.device);
  const std::string arch = device_arch(o.device);
  Planned planned = plan_for(file, o, arch);

  const SlotLimits limits = slot_limits(planned.plan);
  auto impl = std::make_unique<Impl>(std::move(planned.plan), limits);
  Impl& r = *impl;
  r.options = o;
  r.device = o.device;
  const Plan& p = r.plan;
  r.h_tables = table(p, "host_tables", BufferRole::host);
  r.h_token = table(p, "host_token", BufferRole::host);
  r.h_conf = table(p, "host_conf", BufferRole::host);
  r.h_done = table(p, "host_done", BufferRole::host);
  r.t_row_slot = table(p, "row_slot");
  r.t_row_pos = table(p, "row_pos");
  r.t_row_tok = table(p, "row_tok");
  r.t_last_row = table(p, "last_row");
  r.t_last_slot = table(p, "last_slot");
  r.t_taps = table(p, "taps");
  r.b_out_token = table(p, "out_token", BufferRole::output);
  r.b_out_conf = table(p, "out_conf", BufferRole::output);
  r.b_ring_k = table(p, "ring_k", BufferRole::state);
  r.b_ring_v = table(p, "ring_v", BufferRole::state);
  // An extend chunk uploads [row_slot .. taps] in one copy.
  if (!(r.t_row_slot->offset < r.t_taps->offset && r.t_row_pos->offset < r.t_taps->offset &&
        r.t_row_tok->offset < r.t_taps->offset && r.t_last_row->offset < r.t_taps->offset &&
        r.t_last_slot->offset < r.t_taps->offset))
    fail("plan: the tables region is not laid out as [row_slot row_pos row_tok last_row last_slot taps]");
  // The host reads a draft's outputs as [streams, max_steps] of the largest bucket.
  const int64_t out_entries = int64_t{p.options.buckets.back()} * p.options.max_steps;
  for (const Buffer* b : {r.h_token, r.h_conf})
    if (b->bytes != out_entries * 4)
      fail("plan: host buffer `{}` holds {} bytes; the draft's outputs are {} x {} 4-byte values", b->name, b->bytes,
           p.options.buckets.back(), p.options.max_steps);
  if (r.h_done->bytes != 4)
    fail("plan: host buffer `host_done` holds {} bytes; the pass's completion word is one int32", r.h_done->bytes);
  constexpr int64_t kTableRowBytes = kc::kHostTableColumns * 4;
  if (r.h_tables->bytes < int64_t{p.options.buckets.back()} * kTableRowBytes)
    fail("plan: host buffer `host_tables` holds {} bytes; the draft's tables take {} rows of {} bytes",
         r.h_tables->bytes, p.options.buckets.back(), kTableRowBytes);

  r.open_device(o);
  if (o.l2_resident_weight_bytes > 0) {
    r.l2 = L2Reservation(o.l2_resident_weight_bytes, o.device);
    r.stats.l2_set_aside = r.l2.bytes();
  }
  r.upload_weights(file);
  r.load_kernels(planned.images);
  r.prepare_nodes();
  TFE_CUDA(cudaStreamSynchronize(r.stream));

  const bool graphs_on = o.graphs && graphs_enabled_by_environment();
  if (graphs_on) {
    const size_t capacity =
        o.graph_capacity ? o.graph_capacity : p.buckets.size() * static_cast<size_t>(p.options.max_steps);
    r.graphs.emplace(r.stream, capacity, o.check_bindings);
    if (o.capture == OpenOptions::Capture::at_open) r.capture_all();
  }
  return Runtime(std::move(impl));
}

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;

Runtime& Runtime::operator=(Runtime&& o) noexcept {
  if (this != &o) {
    release();
    impl_ = std::move(o.impl_);
  }
  return *this;
}

Runtime::~Runtime() { release(); }

void Runtime::release() noexcept {
  if (!impl_) return;
  // Release on the runtime's device, whatever the caller's current one is.
  const int device = impl_->device;
  int previous = -1;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  if (known && previous != device) TFE_CUDA_NOEXCEPT(cudaSetDevice(device));
  impl_.reset();
  if (known && previous != device) TFE_CUDA_NOEXCEPT(cudaSetDevice(previous));
}

void Runtime::extend(std::span<const ExtendRequest> requests) {
  Impl& r = *impl_;
  r.check_usable();
  const HeadHeader& h = r.plan.header;
  const int64_t row_width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  // Every request is checked before anything changes (the CPU reference's checks and messages).
  check_extend_requests(r.slots, requests, row_width);
  if (requests.empty()) return;

  DeviceScope scope(r.device);
  r.device_work([&] {
    const int64_t E = r.plan.options.extend_rows;
    const size_t row_bytes = static_cast<size_t>(row_width) * sizeof(bf16_bits);
    size_t req = 0;
    int64_t done = 0;  // rows of requests[req] already packed
    while (req < requests.size()) {
      std::byte* st = r.staging_buffer();
      auto* row_slot = r.staged_table<int32_t>(st, r.t_row_slot);
      auto* row_pos = r.staged_table<int32_t>(st, r.t_row_pos);
      auto* row_tok = r.staged_table<int32_t>(st, r.t_row_tok);
      auto* last_row = r.staged_table<int32_t>(st, r.t_last_row);
      auto* last_slot = r.staged_table<int32_t>(st, r.t_last_slot);
      auto* taps = r.staged_table<std::byte>(st, r.t_taps);
      int64_t rows = 0, slot_rows = 0;
      // A chunk takes whole requests while they fit and splits the one that does not; each slot it touches
      // keeps the g of its last row in the chunk (a later chunk of the same request overwrites it).
      while (req < requests.size() && rows < E) {
        const ExtendRequest& q = requests[req];
        const int64_t take = std::min(q.n_rows - done, E - rows);
        for (int64_t i = 0; i < take; ++i) {
          row_slot[rows + i] = q.slot;
          row_pos[rows + i] = static_cast<int32_t>(q.first_pos + done + i);
          row_tok[rows + i] = q.tokens[static_cast<size_t>(done + i)];
        }
        std::memcpy(taps + static_cast<size_t>(rows) * row_bytes,
                    q.taps.data() + static_cast<size_t>(done * row_width), static_cast<size_t>(take) * row_bytes);
        last_row[slot_rows] = static_cast<int32_t>(rows + take - 1);
        last_slot[slot_rows] = q.slot;
        ++slot_rows;
        rows += take;
        done += take;
        if (done == q.n_rows) ++req, done = 0;
      }
      const int64_t first = r.t_row_slot->offset;
      r.upload_tables(first, r.t_taps->offset + rows * static_cast<int64_t>(row_bytes) - first);
      r.launch_nodes(r.extend, INT_MAX, rows, slot_rows, r.stream);
      ++r.stats.extend_chunks;
    }
  });
  for (const ExtendRequest& q : requests) r.slots.commit_extend(q.slot, q.first_pos, q.n_rows, q.tokens);
}

DraftResult Runtime::draft(std::span<const int> slot_ids, int steps) {
  Impl& r = *impl_;
  r.check_usable();
  r.slots.check_draft(slot_ids, steps);
  const int n = static_cast<int>(slot_ids.size());
  size_t bucket = 0;
  while (r.plan.buckets[bucket].streams < n) ++bucket;  // check_draft bounds n by the largest bucket
  const int streams = r.plan.buckets[bucket].streams;
  const int64_t max_steps = r.plan.options.max_steps;

  DeviceScope scope(r.device);
  DraftResult out;
  r.device_work([&] {
    // The tables go straight into the host arena, a row's four entries side by side: the pass's first node
    // (load_tables) reads them from there.
    auto* tables = r.host_buffer<int32_t>(r.h_tables);
    for (int i = 0; i < streams; ++i) {
      int32_t* row = tables + i * kc::kHostTableColumns;
      if (i < n) {
        const int slot = slot_ids[static_cast<size_t>(i)];
        row[0] = slot;
        row[1] = r.slots.last_pos(slot);
        row[2] = r.slots.first_pos(slot);
        row[3] = r.slots.last_token(slot);
      } else {
        // Padding: the scratch slot at position 0; its ring and g are zeros (valid) and its rows are dropped.
        row[0] = r.scratch_slot();
        row[1] = 0;
        row[2] = 0;
        row[3] = 0;
      }
    }

    // Cleared before the launch (a full fence: the store is visible before the launch is), set by the
    // pass's last node; the GPU never reads it.
    std::atomic_ref<int32_t>(*r.host_buffer<int32_t>(r.h_done)).store(0, std::memory_order_seq_cst);
    const GraphKey key{streams, steps};
    if (r.graphs) {
      r.graphs->run(key, r.bindings(), r.draft_record(bucket, steps));
      ++r.stats.replays;
    } else {
      r.launch_nodes(r.buckets[bucket], steps, streams, 0, r.stream);
      ++r.stats.eager_passes;
    }
    // The pass's last node (store_outputs) copies the tokens and confidences into the host arena, then
    // sets host_done.
    r.wait_for_outputs();
    r.stats.bytes_uploaded += static_cast<uint64_t>(4 * streams) * sizeof(int32_t);
    r.stats.bytes_downloaded += static_cast<uint64_t>(streams * steps) * (sizeof(int32_t) + sizeof(float));

    const auto* tokens = r.host_buffer<const int32_t>(r.h_token);
    const auto* confs = r.host_buffer<const float>(r.h_conf);
    out.streams = n;
    out.steps = steps;
    out.width = 0;  // hidden states stay on the device (read_buffer("h2") holds the last step's)
    out.tokens.resize(static_cast<size_t>(n * steps));
    out.confidences.resize(out.tokens.size());
    for (int i = 0; i < n; ++i)
      for (int s = 0; s < steps; ++s) {
        out.tokens[static_cast<size_t>(i * steps + s)] = tokens[i * max_steps + s];
        out.confidences[static_cast<size_t>(i * steps + s)] = confs[i * max_steps + s];
      }
  });
  r.last_outputs = DeviceDraftOutputs{reinterpret_cast<const int32_t*>(r.arena + r.b_out_token->offset),
                                      reinterpret_cast<const float*>(r.arena + r.b_out_conf->offset), max_steps, n,
                                      steps};
  return out;
}

DeviceDraftOutputs Runtime::device_outputs() const { return impl_->last_outputs; }

void Runtime::reset(int slot) {
  Impl& r = *impl_;
  r.check_usable();
  r.slots.reset(slot);
  // Zero the slot's ring so that what a slot computes never depends on an earlier sequence's keys.
  DeviceScope scope(r.device);
  r.device_work([&] {
    const size_t per_slot = static_cast<size_t>(r.b_ring_k->bytes / (r.plan.options.max_slots + 1));
    TFE_CUDA(cudaMemsetAsync(r.arena + r.b_ring_k->offset + per_slot * static_cast<size_t>(slot), 0, per_slot, r.stream));
    TFE_CUDA(cudaMemsetAsync(r.arena + r.b_ring_v->offset + per_slot * static_cast<size_t>(slot), 0, per_slot, r.stream));
  });
}

RuntimeStats Runtime::stats() const {
  RuntimeStats s = impl_->stats;
  if (impl_->graphs) {
    const GraphCounters& g = impl_->graphs->counters();
    s.captures = g.captures + g.updates + g.reinstantiated;
    s.graph_updates = g.updates + g.reinstantiated;
  }
  return s;
}

const Plan& Runtime::plan() const { return impl_->plan; }
const SlotTable& Runtime::slots() const { return impl_->slots; }
int Runtime::ring_rows() const { return impl_->plan.ring_rows; }
cudaStream_t Runtime::stream() const { return impl_->stream; }
int Runtime::device() const { return impl_->device; }
bool Runtime::graphs_enabled() const { return impl_->graphs.has_value(); }

std::vector<std::byte> Runtime::read_buffer(std::string_view name) const {
  Impl& r = *impl_;
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

void Runtime::fill_buffer(std::string_view name, uint8_t byte) {
  Impl& r = *impl_;
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

void Runtime::synchronize() const {
  Impl& r = *impl_;
  r.check_usable();
  DeviceScope scope(r.device);
  r.device_work([&] { TFE_CUDA(cudaStreamSynchronize(r.stream)); });
}

}  // namespace tfe
