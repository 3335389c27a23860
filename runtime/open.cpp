// Runtime::open: the environment's overrides, the plan (an artifact's or planned now), the weights' upload,
// the kernels, the nodes' launches and the graphs; the self-check.
#include <tfe/runtime.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "core/error.h"
#include "head/numerics.h"
#include "kernels/weight_layout.h"
#include "runtime/impl.h"

namespace tfe {

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

// A buffer the runtime itself fills or reads, by name; validate() has checked its arena, role and size
// (check_runtime_buffers, plan/plan.cpp).
const Buffer* table(const Plan& p, std::string_view name, BufferRole role = BufferRole::table) {
  return role == BufferRole::host ? &p.host.at(name) : &p.arena.at(name);
}

}  // namespace

void Runtime::Impl::open_device(const OpenOptions& o) {
  if (o.stream) {
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
  id_staging =
      cuda::allocate_pinned(static_cast<size_t>(kIdRing) * 2 * static_cast<size_t>(plan.options.buckets.back()) * 4,
                            "slot id staging buffer");
  for (cuda::Event& e : id_staged) {
    e = cuda::create_event();
    TFE_CUDA(cudaEventRecord(e.get(), stream));
  }
  // The host arena starts zeroed, like the arena: a pass never reads bytes the host has not written.
  host_memory =
      cuda::allocate_mapped(static_cast<size_t>(std::max<int64_t>(plan.host.bytes, 1)), "host arena", &host_device);
  host = host_memory.data();
  std::memset(host, 0, host_memory.bytes());
}

void Runtime::Impl::upload_weights(const HeadFile& file) {
  for (const Buffer& b : plan.weights.buffers) {
    std::byte* dst = weights + b.offset;
    if (b.from.size() == 1 && b.from[0] == "computed:rope_inv_freq") {
      // The CPU reference's own function: both sides rotate by identical frequencies.
      const std::vector<float> f = rope_inv_freq(plan.header);
      if (static_cast<int64_t>(f.size() * sizeof(float)) != b.bytes || b.dtype != DType::F32)
        fail("weights: `{}` is {} bytes of {}, the RoPE table has {} fp32 values", b.name, b.bytes, dtype_name(b.dtype),
             f.size());
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

// A tiled matrix (kernels/weight_layout.h) is reordered on the host, its parts (the file tensors concatenated
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
    const bool corrupt = hooks.faults.corrupt_cubin == uri;  // a test's injected fault
    const std::string garbage(corrupt ? it->second.cubin.size() : 0, '\x5a');
    libraries.push_back(cuda::load_library(corrupt ? garbage.data() : it->second.cubin.data(), uri.c_str()));
    cuda::LoadedKernel k;
    k.uri = uri;
    const cudaError_t e = cudaLibraryGetKernel(&k.kernel, libraries.back().get(), it->second.lowered_name.c_str());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail_cuda("runtime: the cubin of {} has no kernel `{}`: {}", uri, it->second.lowered_name, cudaGetErrorName(e));
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
  // L2-resident weights (TestHooks::l2_resident_weight_bytes): every draft GEMV launches with its weight
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
      using Dependent = TestHooks::DependentLaunch;
      const Dependent d = hooks.dependent_launch;
      const bool dependent = d == Dependent::plan ? n.dependent : d == Dependent::all && n.step >= 1;
      p.kernel.emplace(n, kernels.at(n.spec), bases, max_rows, dependent, draft ? l2_window(n) : cuda::L2Window{});
    } else {
      if (plan.cublaslt_workspace <= 0)
        fail("plan: node {} is a GEMM but the plan reserves no cuBLASLt workspace", n.name);
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
  check_knock_out(plan, hooks.knock_out);
  const auto knocked_out = [&](const Node& n) {
    return std::ranges::find(hooks.knock_out, node_base_name(n)) != hooks.knock_out.end();
  };
  const auto kernel_of = [&](const Node& n) -> std::string_view {
    return n.kind == Node::Kind::kernel ? std::string_view(plan.spec(n.spec).kernel) : std::string_view("gemm");
  };
  for (const Bucket& b : plan.buckets) {
    std::vector<PreparedNode> nodes, enqueued_nodes;
    int last_step = 0;
    for (const Node& n : b.nodes) {
      if (n.step < last_step || n.step < 1 || n.step > plan.options.max_steps)
        fail("plan: node {} of bucket {} has step {}; steps must ascend within 1..{}", n.name, b.streams, n.step,
             plan.options.max_steps);
      last_step = n.step;
      if (knocked_out(n)) continue;
      nodes.push_back(prepare(n, b.streams, true));
      // The enqueued pass: slot ids from draft_slots, outputs left in the arena.
      if (kernel_of(n) == "store_outputs") continue;
      if (kernel_of(n) != "load_tables") {
        enqueued_nodes.push_back(nodes.back());
        continue;
      }
      Node from_arena = n;
      for (Arg& a : from_arena.args)
        if (a.param == "ids")
          a.buffer = "draft_slots";
        else if (a.param == "ranks" && a.kind == Arg::Kind::buffer)
          a.buffer = "draft_ranks";
      enqueued_nodes.push_back(prepare(from_arena, b.streams, true));
    }
    buckets.push_back(std::move(nodes));
    enqueued.push_back(std::move(enqueued_nodes));
  }
  for (const Node& n : plan.extend) {
    if (n.rows == Node::Rows::fixed) fail("plan: extend node {} has a fixed row count", n.name);
    if (kernel_of(n) == "gather_taps")
      gather.emplace(prepare(n, 0, false));
    else
      extend.push_back(prepare(n, 0, false));
  }
  if (!gather) fail("plan: the extend pass has no gather_taps node");
}

void Runtime::Impl::capture_all() {
  for (size_t b = 0; b < plan.buckets.size(); ++b)
    for (int s = 1; s <= plan.options.max_steps; ++s)
      graphs->prepare(GraphKey{plan.buckets[b].streams, s}, bindings(), draft_record(b, s));
}

namespace {
void check_device(int device) {
  const int count = cuda::device_count();
  if (count == 0) fail_cuda("runtime: no CUDA device (cudaGetDeviceCount reports none or fails)");
  if (device < 0 || device >= count) fail("runtime: device {} is outside 0..{}", device, count - 1);
}

// The options as the environment overrides them (its one reading on the way to an open), and what open can
// refuse before it reads or plans anything: the tap dump's file, then the device.
OpenOptions prepared(const OpenOptions& options) {
  OpenOptions o = open_options_from_environment(options);
  if (!o.tap_dump.path.empty()) check_tap_dump_options(o.tap_dump);
  check_device(o.device);
  return o;
}

// testing::Hooks::Faults::negate_weight: the sign of every bf16 value of one weight buffer flipped on the device.
void negate_weight(RuntimeAccess::Impl& r, const std::string& name) {
  const Buffer* b = r.plan.weights.find(name);
  if (!b) fail("negate_weight: the plan has no weight buffer `{}`", name);
  if (b->dtype != DType::BF16) fail("negate_weight: weight buffer `{}` is {}, not BF16", name, dtype_name(b->dtype));
  std::vector<bf16_bits> v(static_cast<size_t>(b->bytes) / sizeof(bf16_bits));
  TFE_CUDA(cudaMemcpy(v.data(), r.weights + b->offset, v.size() * sizeof(bf16_bits), cudaMemcpyDeviceToHost));
  for (bf16_bits& x : v) x = static_cast<bf16_bits>(x ^ 0x8000u);
  TFE_CUDA(cudaMemcpy(r.weights + b->offset, v.data(), v.size() * sizeof(bf16_bits), cudaMemcpyHostToDevice));
}
}  // namespace

namespace {
// The open itself, with the options prepared (the environment applied, checked).
Runtime open_with(const HeadFile& file, const OpenOptions& o, const TestHooks& hooks);
}  // namespace

Runtime Runtime::open(const std::string& head_path, const OpenOptions& options) {
  const OpenOptions o = prepared(options);
  HeadFile::Options fo;
  fo.verify_sha256 = o.verify_sha256;
  return open_with(HeadFile::open(head_path, fo), o, TestHooks{});
}

Runtime Runtime::open(const HeadFile& file, const OpenOptions& o) { return open_runtime(file, o, TestHooks{}); }

Runtime open_runtime(const HeadFile& file, const OpenOptions& options, const TestHooks& hooks) {
  return open_with(file, prepared(options), hooks);
}

namespace {
Runtime open_with(const HeadFile& file, const OpenOptions& o, const TestHooks& hooks) {
  DeviceScope scope(o.device);
  ResolveRequest rq;
  rq.artifact_dir = o.artifact_dir;
  rq.options = o.plan;
  rq.recompile_mismatched_artifact = o.recompile_mismatched_artifact;
  rq.tuning = hooks.tuning;
  rq.arch = device_arch(o.device);
  rq.device = o.device;
  Resolved planned = resolve(file, rq);

  const SlotLimits limits = slot_limits(planned.plan);
  auto impl = std::make_unique<RuntimeAccess::Impl>(std::move(planned.plan), limits);
  RuntimeAccess::Impl& r = *impl;
  r.options = o;
  r.hooks = hooks;
  r.device = o.device;
  r.accept_log = std::make_unique<AcceptLog>(o.accept_log);
  // Attached after the self-check, whose rows are not the engine's.
  std::unique_ptr<TapDump> tap_dump;
  if (!o.tap_dump.path.empty())
    tap_dump = std::make_unique<TapDump>(o.tap_dump, static_cast<int>(file.header().taps.size()),
                                         file.header().target_hidden, file.header_sha256());
  const Plan& p = r.plan;
  r.h_tables = table(p, "host_tables", BufferRole::host);
  r.h_token = table(p, "host_token", BufferRole::host);
  r.h_conf = table(p, "host_conf", BufferRole::host);
  r.h_done = table(p, "host_done", BufferRole::host);
  r.h_error = table(p, "host_error", BufferRole::host);
  r.t_row_slot = table(p, "row_slot");
  r.t_row_pos = table(p, "row_pos");
  r.t_row_tok = table(p, "row_tok");
  r.t_last_row = table(p, "last_row");
  r.t_last_slot = table(p, "last_slot");
  r.t_last_first = table(p, "last_first");
  r.t_row_taps_src = table(p, "row_taps_src");
  r.t_row_tok_src = table(p, "row_tok_src");
  r.t_taps = table(p, "taps");
  r.b_slot_state = table(p, "slot_state", BufferRole::state);
  r.b_draft_slots = table(p, "draft_slots", BufferRole::input);
  if (p.options.first_ranks) {
    r.h_ranks = table(p, "host_ranks", BufferRole::host);
    r.b_draft_ranks = table(p, "draft_ranks", BufferRole::input);
  }
  r.b_out_token = table(p, "out_token", BufferRole::output);
  r.b_out_conf = table(p, "out_conf", BufferRole::output);
  r.b_ring_k = table(p, "ring_k", BufferRole::state);
  r.b_ring_v = table(p, "ring_v", BufferRole::state);

  r.open_device(o);
  if (hooks.l2_resident_weight_bytes > 0) {
    r.l2 = L2Reservation(hooks.l2_resident_weight_bytes, o.device);
    r.stats.l2_set_aside = r.l2.bytes();
  }
  r.upload_weights(file);
  if (!hooks.faults.negate_weight.empty()) negate_weight(r, hooks.faults.negate_weight);
  r.load_kernels(planned.images);
  r.prepare_nodes();
  TFE_CUDA(cudaStreamSynchronize(r.stream));

  if (o.graphs) {
    // Room for every pass in both forms: blocking (draft) and enqueued (draft_async, captured lazily).
    const size_t capacity =
        hooks.graph_capacity ? hooks.graph_capacity : 2 * p.buckets.size() * static_cast<size_t>(p.options.max_steps);
    r.graphs.emplace(r.stream, capacity, hooks.check_bindings);
    if (hooks.faults.instantiate != cudaSuccess) r.graphs->inject_instantiate_error(hooks.faults.instantiate);
    if (hooks.capture == TestHooks::Capture::at_open) r.capture_all();
  }
  Runtime rt = RuntimeAccess::make(std::move(impl));
  r.check_taps = o.self_check;
  if (o.self_check) {
    // The check's calls are not the engine's. Its slots are reset; the arena and the host arena are zeroed
    // again, as open left them (every slot's ring and state, the scratch slot's included, the outputs); the
    // counters and the last outputs are put back. A graph the check captured under lazy capture stays, counted.
    const RuntimeStats before = r.stats;
    r.self_check = run_self_check(rt, file);
    r.device_work([&] {
      TFE_CUDA(cudaMemsetAsync(r.arena, 0, static_cast<size_t>(r.plan.arena.bytes), r.stream));
      TFE_CUDA(cudaStreamSynchronize(r.stream));
    });
    std::memset(r.host, 0, r.host_memory.bytes());
    r.stats = before;
    r.last_outputs = {};
  }
  r.tap_dump = std::move(tap_dump);
  return rt;
}
}  // namespace

}  // namespace tfe
