#include <tfe/runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "core/error.h"
#include "head/numerics.h"
#include "kernels/weight_layout.h"
#include "core/extend_check.h"
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

// A buffer the runtime itself fills or reads, by name: a plan that validates may still lack one (validate
// checks what the nodes bind, not what the runtime expects), so the refusal names the arena and the role.
const Buffer* table(const Plan& p, std::string_view name, BufferRole role = BufferRole::table) {
  const bool in_host = role == BufferRole::host;
  const Buffer* found = in_host ? p.host.find(name) : p.arena.find(name);
  if (!found)
    fail("plan: the {} has no buffer `{}`; the runtime needs it as a {} buffer", in_host ? "host arena" : "arena", name,
         buffer_role_name(role));
  const Buffer& b = *found;
  if (b.role != role)
    fail("plan: buffer `{}` has role {}, the runtime expects {}", name, buffer_role_name(b.role),
         buffer_role_name(role));
  return &b;
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
  id_staging = cuda::allocate_pinned(
      static_cast<size_t>(kIdRing) * static_cast<size_t>(plan.options.buckets.back()) * 4, "slot id staging buffer");
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
        if (a.param == "ids") a.buffer = "draft_slots";
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

// What open can refuse before it reads or plans anything: the diagnostics' options, as the environment sets them.
void check_diagnostics(const OpenOptions& o) {
  const TapDumpOptions dump = tap_dump_options_from_environment(o.tap_dump);
  if (!dump.path.empty()) check_tap_dump_options(dump);
  (void)self_check_from_environment(o.self_check);
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

Runtime Runtime::open(const std::string& head_path, const OpenOptions& o) {
  check_diagnostics(o);
  check_device(o.device);
  HeadFile::Options fo;
  fo.verify_sha256 = o.verify_sha256;
  return open(HeadFile::open(head_path, fo), o);
}

Runtime Runtime::open(const HeadFile& file, const OpenOptions& o) { return open_runtime(file, o, TestHooks{}); }

Runtime open_runtime(const HeadFile& file, const OpenOptions& o, const TestHooks& hooks) {
  check_diagnostics(o);
  check_device(o.device);
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
  r.accept_log = std::make_unique<AcceptLog>(accept_log_options_from_environment(o.accept_log));
  // Attached after the self-check, whose rows are not the engine's.
  std::unique_ptr<TapDump> tap_dump;
  if (TapDumpOptions d = tap_dump_options_from_environment(o.tap_dump); !d.path.empty())
    tap_dump = std::make_unique<TapDump>(std::move(d), static_cast<int>(file.header().taps.size()),
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
  r.b_out_token = table(p, "out_token", BufferRole::output);
  r.b_out_conf = table(p, "out_conf", BufferRole::output);
  r.b_ring_k = table(p, "ring_k", BufferRole::state);
  r.b_ring_v = table(p, "ring_v", BufferRole::state);
  // An extend chunk uploads [row_slot .. taps] in one copy.
  for (const Buffer* t :
       {r.t_row_pos, r.t_row_tok, r.t_row_taps_src, r.t_row_tok_src, r.t_last_row, r.t_last_slot, r.t_last_first})
    if (!(r.t_row_slot->offset <= t->offset && t->offset < r.t_taps->offset))
      fail("plan: table `{}` is not between row_slot and taps; an extend chunk uploads [row_slot .. taps] in one copy",
           t->name);
  const int64_t largest = p.options.buckets.back();
  if (r.b_slot_state->bytes != int64_t{p.options.max_slots + 1} * kc::kSlotStateColumns * 4)
    fail("plan: `slot_state` holds {} bytes; the slots' state is {} x {} int32", r.b_slot_state->bytes,
         p.options.max_slots + 1, kc::kSlotStateColumns);
  if (r.b_draft_slots->bytes < largest * 4)
    fail("plan: `draft_slots` holds {} bytes; an enqueued draft takes {} slot ids", r.b_draft_slots->bytes, largest);
  // The host reads a draft's outputs as [streams, max_steps] of the largest bucket.
  const int64_t out_entries = int64_t{p.options.buckets.back()} * p.options.max_steps;
  for (const Buffer* b : {r.h_token, r.h_conf})
    if (b->bytes != out_entries * 4)
      fail("plan: host buffer `{}` holds {} bytes; the draft's outputs are {} x {} 4-byte values", b->name, b->bytes,
           p.options.buckets.back(), p.options.max_steps);
  if (r.h_done->bytes != 4)
    fail("plan: host buffer `host_done` holds {} bytes; the pass's completion word is one int32", r.h_done->bytes);
  if (r.h_tables->bytes < largest * 4)
    fail("plan: host buffer `host_tables` holds {} bytes; a draft takes {} slot ids", r.h_tables->bytes, largest);
  if (r.h_error->bytes != 8)
    fail("plan: host buffer `host_error` holds {} bytes; the error record is one int64", r.h_error->bytes);

  r.open_device(o);
  if (o.l2_resident_weight_bytes > 0) {
    r.l2 = L2Reservation(o.l2_resident_weight_bytes, o.device);
    r.stats.l2_set_aside = r.l2.bytes();
  }
  r.upload_weights(file);
  if (!hooks.faults.negate_weight.empty()) negate_weight(r, hooks.faults.negate_weight);
  r.load_kernels(planned.images);
  r.prepare_nodes();
  TFE_CUDA(cudaStreamSynchronize(r.stream));

  const bool graphs_on = o.graphs && graphs_enabled_by_environment();
  if (graphs_on) {
    // Room for every pass in both forms: blocking (draft) and enqueued (draft_async, captured lazily).
    const size_t capacity =
        o.graph_capacity ? o.graph_capacity : 2 * p.buckets.size() * static_cast<size_t>(p.options.max_steps);
    r.graphs.emplace(r.stream, capacity, hooks.check_bindings);
    if (hooks.faults.instantiate != cudaSuccess) r.graphs->inject_instantiate_error(hooks.faults.instantiate);
    if (o.capture == OpenOptions::Capture::at_open) r.capture_all();
  }
  Runtime rt = RuntimeAccess::make(std::move(impl));
  r.check_taps = self_check_from_environment(o.self_check);
  if (r.check_taps) {
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

void Runtime::record_accepted(std::span<const int> kept, int steps) {
  Impl& r = *impl_;
  const int max_steps = r.plan.options.max_steps;
  if (steps < 1 || steps > max_steps) fail("record_accepted: steps {} is outside 1..{} (max_steps)", steps, max_steps);
  r.accept_log->record(kept, steps);
}

const AcceptCounts& Runtime::accept_totals() const { return impl_->accept_log->totals(); }

void Runtime::write_tap_dump() {
  if (!impl_->tap_dump)
    fail("write_tap_dump: no tap dump is on (set OpenOptions::tap_dump.path, or TFE_TAP_DUMP=FILE, at open)");
  impl_->tap_dump->write();
}

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

namespace {

// The rows of one request piece that a chunk takes: `done` rows of the request already went to earlier
// chunks, `at` is the piece's first row in the chunk.
struct Piece {
  int64_t done = 0, take = 0, at = 0;
};

// Runs an extend call in chunks of up to extend_rows rows. A chunk takes whole requests while they fit and
// splits the one that does not; each slot it touches keeps the g and state of its last row in the chunk (a
// later chunk of the same request overwrites them). `pack(q, piece, staging)` writes a piece's rows
// (tokens and taps, or their addresses) into the chunk's tables; `upload_end(rows)` is where the chunk's
// upload ends; `device_rows` runs gather_taps first.
template <typename Request, typename Pack, typename UploadEnd>
void run_extend(RuntimeAccess::Impl& r, std::span<const Request> requests, cudaStream_t s, bool device_rows, Pack pack,
                UploadEnd upload_end) {
  const int64_t E = r.plan.options.extend_rows;
  size_t req = 0;
  int64_t done = 0;  // rows of requests[req] already packed
  while (req < requests.size()) {
    std::byte* st = r.staging_buffer();
    auto* row_slot = r.staged_table<int32_t>(st, r.t_row_slot);
    auto* row_pos = r.staged_table<int32_t>(st, r.t_row_pos);
    auto* last_row = r.staged_table<int32_t>(st, r.t_last_row);
    auto* last_slot = r.staged_table<int32_t>(st, r.t_last_slot);
    auto* last_first = r.staged_table<int32_t>(st, r.t_last_first);
    int64_t rows = 0, slot_rows = 0;
    while (req < requests.size() && rows < E) {
      const Request& q = requests[req];
      const Piece piece{done, std::min(q.n_rows - done, E - rows), rows};
      for (int64_t i = 0; i < piece.take; ++i) {
        row_slot[rows + i] = q.slot;
        row_pos[rows + i] = static_cast<int32_t>(q.first_pos + done + i);
      }
      pack(q, piece, st);
      last_row[slot_rows] = static_cast<int32_t>(rows + piece.take - 1);
      last_slot[slot_rows] = q.slot;
      // The sequence's first position: this request's, when it starts the slot.
      last_first[slot_rows] = r.slots.empty(q.slot) ? static_cast<int32_t>(q.first_pos) : r.slots.first_pos(q.slot);
      ++slot_rows;
      rows += piece.take;
      done += piece.take;
      if (done == q.n_rows) ++req, done = 0;
    }
    const int64_t first = r.t_row_slot->offset;
    r.upload_tables(first, upload_end(rows) - first, s);
    if (device_rows) r.gather->kernel->launch(rows, s);
    r.launch_nodes(r.extend, INT_MAX, rows, slot_rows, s);
    ++r.stats.extend_chunks;
  }
}

// This thread in relaxed capture mode for a scope: a query that records nothing (cudaPointerGetAttributes)
// may still be refused as potentially unsafe inside a global or thread-local capture, which it would then
// invalidate.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { TFE_CUDA(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  ~RelaxedCaptureMode() { TFE_CUDA_NOEXCEPT(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

// Throws unless `p` is device memory of `device` (or managed memory).
void check_device_pointer(const void* p, int device, std::string_view what) {
  cudaPointerAttributes a{};
  cudaError_t e = cudaSuccess;
  {
    const RelaxedCaptureMode relaxed;
    e = cudaPointerGetAttributes(&a, p);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("{} ({}) is not memory CUDA knows: {}", what, p, cudaGetErrorName(e));
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    fail("{} ({}) is {} memory; it must be device memory of device {}", what, p,
         a.type == cudaMemoryTypeHost ? "host" : "unregistered host", device);
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    fail("{} ({}) is memory of device {}; the runtime runs on device {}", what, p, a.device, device);
}

}  // namespace

void Runtime::Impl::report_device_errors(std::string_view call) {
  std::atomic_ref<int64_t> record(*host_buffer<int64_t>(h_error));
  const int64_t v = record.load(std::memory_order_acquire);
  if (v == 0) return;
  record.store(0, std::memory_order_relaxed);
  const int64_t kind = (v >> 56) & 0xff, index = (v >> 32) & 0xffffff;
  const auto value = static_cast<int32_t>(static_cast<uint32_t>(v & 0xffffffff));
  if (kind == kc::kErrorDraftSlot)
    fail(
        "{}: an earlier draft_async found slot id {} in row {} of its device slot ids; an id must be -1 (padding) or "
        "a slot in 0..{} that holds a sequence. That row drafted from the scratch slot (its outputs are "
        "meaningless); nothing else changed, and this call did nothing",
        call, value, index, plan.options.max_slots - 1);
  if (kind == kc::kErrorExtendToken)
    fail(
        "{}: an earlier extend of device rows handed slot {} token {}, outside 0..{}; that row used token 0 "
        "instead, so the slot's state is wrong: reset the slot. This call did nothing",
        call, index, value, plan.header.vocab - 1);
  fail("{}: a kernel left an error record of unknown kind {} (value {:#x}); this call did nothing", call, kind, v);
}

void Runtime::extend(std::span<const ExtendRequest> requests, std::optional<cudaStream_t> stream) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("extend");
  const HeadHeader& h = r.plan.header;
  const int64_t row_width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  // Every request is checked before anything changes (the CPU reference's checks and messages).
  check_extend_requests(r.slots, requests, row_width);
  if (r.check_taps) check_finite_taps(requests, row_width);
  if (requests.empty()) return;
  const cudaStream_t s = r.stream_for(stream);

  DeviceScope scope(r.device);
  r.refuse_capture(s, "extend",
                   "an extend's tables cross from host memory the runtime reuses; record only draft_async");
  const size_t row_bytes = static_cast<size_t>(row_width) * sizeof(bf16_bits);
  r.device_work([&] {
    run_extend(
        r, requests, s, false,
        [&](const ExtendRequest& q, const Piece& p, std::byte* st) {
          auto* row_tok = r.staged_table<int32_t>(st, r.t_row_tok);
          auto* taps = r.staged_table<std::byte>(st, r.t_taps);
          for (int64_t i = 0; i < p.take; ++i) row_tok[p.at + i] = q.tokens[static_cast<size_t>(p.done + i)];
          std::memcpy(taps + static_cast<size_t>(p.at) * row_bytes,
                      q.taps.data() + static_cast<size_t>(p.done * row_width), static_cast<size_t>(p.take) * row_bytes);
        },
        [&](int64_t rows) { return r.t_taps->offset + rows * static_cast<int64_t>(row_bytes); });
  });
  for (const ExtendRequest& q : requests) r.slots.commit_extend(q.slot, q.first_pos, q.n_rows, q.tokens);
  if (r.tap_dump) r.tap_dump->record(requests);
}

namespace {
// The tap dump of a device extend: the rows that still fit under max_rows copied to the host after the
// extend's launches on the same stream, which then waits for them (the dump's cost: a synchronization per call).
void dump_device_rows(RuntimeAccess::Impl& r, std::span<const DeviceExtendRequest> requests, int64_t row_width,
                      cudaStream_t s) {
  const size_t row_bytes = static_cast<size_t>(row_width) * sizeof(bf16_bits);
  int64_t room = r.tap_dump->room(), left_out = 0;
  std::vector<std::vector<bf16_bits>> taps(requests.size());
  std::vector<std::vector<int32_t>> tokens(requests.size());
  std::vector<ExtendRequest> rows(requests.size());
  r.device_work([&] {
    for (size_t i = 0; i < requests.size(); ++i) {
      const DeviceExtendRequest& q = requests[i];
      const int64_t keep = std::min(q.n_rows, room);
      room -= keep;
      left_out += q.n_rows - keep;
      taps[i].resize(static_cast<size_t>(keep * row_width));
      tokens[i].resize(static_cast<size_t>(keep));
      rows[i] = ExtendRequest{q.slot, q.first_pos, keep, taps[i], tokens[i]};
      if (keep == 0) continue;
      const int64_t stride = q.taps_stride ? q.taps_stride : row_width;
      TFE_CUDA(cudaMemcpy2DAsync(taps[i].data(), row_bytes, q.taps, static_cast<size_t>(stride) * sizeof(bf16_bits),
                                 row_bytes, static_cast<size_t>(keep), cudaMemcpyDeviceToHost, s));
      TFE_CUDA(cudaMemcpyAsync(tokens[i].data(), q.tokens, static_cast<size_t>(keep) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, s));
      r.stats.bytes_downloaded += static_cast<uint64_t>(keep) * (row_bytes + sizeof(int32_t));
    }
    TFE_CUDA(cudaStreamSynchronize(s));
  });
  r.tap_dump->record(rows, left_out);
}
}  // namespace

void Runtime::extend(std::span<const DeviceExtendRequest> requests, std::optional<cudaStream_t> stream) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("extend");
  const HeadHeader& h = r.plan.header;
  const int64_t row_width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  check_extend_requests(r.slots, requests, row_width);
  if (requests.empty()) return;
  const cudaStream_t s = r.stream_for(stream);

  DeviceScope scope(r.device);
  for (size_t i = 0; i < requests.size(); ++i) {
    check_device_pointer(requests[i].taps, r.device, fmt::format("extend: requests[{}].taps", i));
    check_device_pointer(requests[i].tokens, r.device, fmt::format("extend: requests[{}].tokens", i));
  }
  r.refuse_capture(s, "extend",
                   "an extend's tables cross from host memory the runtime reuses; record only draft_async");
  r.device_work([&] {
    run_extend(
        r, requests, s, true,
        [&](const DeviceExtendRequest& q, const Piece& p, std::byte* st) {
          auto* taps_src = r.staged_table<int64_t>(st, r.t_row_taps_src);
          auto* tok_src = r.staged_table<int64_t>(st, r.t_row_tok_src);
          const int64_t stride = q.taps_stride ? q.taps_stride : row_width;
          for (int64_t i = 0; i < p.take; ++i) {
            taps_src[p.at + i] = reinterpret_cast<int64_t>(q.taps + (p.done + i) * stride);
            tok_src[p.at + i] = reinterpret_cast<int64_t>(q.tokens + p.done + i);
          }
        },
        [&](int64_t) { return r.t_taps->offset; });
  });
  for (const DeviceExtendRequest& q : requests) r.slots.commit_rows(q.slot, q.first_pos, q.n_rows);
  if (r.tap_dump) dump_device_rows(r, requests, row_width, s);
}

DraftResult Runtime::draft(std::span<const int> slot_ids, int steps) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("draft");
  r.slots.check_draft(slot_ids, steps);
  const int n = static_cast<int>(slot_ids.size());
  const size_t bucket = r.bucket_for(n);  // check_draft bounds n by the largest bucket
  const int streams = r.plan.buckets[bucket].streams;
  const int64_t max_steps = r.plan.options.max_steps;

  DeviceScope scope(r.device);
  r.refuse_capture(r.stream, "draft", "it waits for its outputs on the host; record draft_async's device form");
  DraftResult out;
  r.device_work([&] {
    // The slot ids go straight into the host arena: the pass's first node (load_tables) reads them there.
    auto* ids = r.host_buffer<int32_t>(r.h_tables);
    for (int i = 0; i < streams; ++i) ids[i] = i < n ? slot_ids[static_cast<size_t>(i)] : kc::kPaddingSlot;

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
    r.stats.bytes_uploaded += static_cast<uint64_t>(streams) * sizeof(int32_t);
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
  r.last_outputs =
      DeviceDraftOutputs{reinterpret_cast<const int32_t*>(r.arena + r.b_out_token->offset),
                         reinterpret_cast<const float*>(r.arena + r.b_out_conf->offset), max_steps, n, steps};
  return out;
}

DeviceDraftOutputs Runtime::Impl::enqueue_draft(int n, int steps, const DraftTargets& targets, cudaStream_t s) {
  const size_t bucket = bucket_for(n);
  const int streams = plan.buckets[bucket].streams;
  const int64_t max_steps = plan.options.max_steps;
  if (capturing(s)) {
    // The caller's graph gets the launches the runtime's own graph holds (graphs/graph_cache.h: a graph is
    // captured from this same function), so a replay of it drafts what a direct call drafts.
    launch_nodes(enqueued[bucket], steps, streams, 0, s);
    ++stats.eager_passes;
  } else if (graphs) {
    graphs->run(GraphKey{streams, steps, true}, bindings(), draft_record(bucket, steps, true), s);
    ++stats.replays;
  } else {
    launch_nodes(enqueued[bucket], steps, streams, 0, s);
    ++stats.eager_passes;
  }
  const DeviceDraftOutputs out{reinterpret_cast<const int32_t*>(arena + b_out_token->offset),
                               reinterpret_cast<const float*>(arena + b_out_conf->offset), max_steps, n, steps};
  const int64_t stride = targets.row_stride ? targets.row_stride : steps;
  if (targets.tokens)
    TFE_CUDA(cudaMemcpy2DAsync(targets.tokens, static_cast<size_t>(stride) * 4, out.tokens,
                               static_cast<size_t>(max_steps) * 4, static_cast<size_t>(steps) * 4,
                               static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  if (targets.confidences)
    TFE_CUDA(cudaMemcpy2DAsync(targets.confidences, static_cast<size_t>(stride) * 4, out.confidences,
                               static_cast<size_t>(max_steps) * 4, static_cast<size_t>(steps) * 4,
                               static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  last_outputs = out;
  return out;
}

namespace {
void check_targets(const DraftTargets& t, int steps, int device) {
  if (t.row_stride != 0 && t.row_stride < steps)
    fail("draft_async: targets.row_stride = {} is below steps = {}", t.row_stride, steps);
  if (t.tokens) check_device_pointer(t.tokens, device, "draft_async: targets.tokens");
  if (t.confidences) check_device_pointer(t.confidences, device, "draft_async: targets.confidences");
}
}  // namespace

DeviceDraftOutputs Runtime::draft_async(std::span<const int> slot_ids, int steps, const DraftTargets& targets,
                                        std::optional<cudaStream_t> stream) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("draft_async");
  r.slots.check_draft(slot_ids, steps);
  const cudaStream_t s = r.stream_for(stream);
  DeviceScope scope(r.device);
  check_targets(targets, steps, r.device);
  r.refuse_capture(s, "draft_async",
                   "slot ids in host memory would be read at each replay from a buffer the runtime reuses; pass them "
                   "in device memory (draft_async's device form, e.g. draft_slots())");
  const int n = static_cast<int>(slot_ids.size());
  const int streams = r.plan.buckets[r.bucket_for(n)].streams;
  return r.device_work([&] {
    // A table of the ring, free once the copy that last read it has run (a wait only when kIdRing
    // enqueued drafts are still ahead of the device).
    const int i = r.next_ids;
    r.next_ids = (r.next_ids + 1) % Impl::kIdRing;
    TFE_CUDA(cudaEventSynchronize(r.id_staged[i].get()));
    auto* ids =
        reinterpret_cast<int32_t*>(r.id_staging.data()) + static_cast<size_t>(i) * r.plan.options.buckets.back();
    for (int k = 0; k < streams; ++k) ids[k] = k < n ? slot_ids[static_cast<size_t>(k)] : kc::kPaddingSlot;
    TFE_CUDA(cudaMemcpyAsync(r.draft_slots_device(), ids, static_cast<size_t>(streams) * 4, cudaMemcpyHostToDevice, s));
    TFE_CUDA(cudaEventRecord(r.id_staged[i].get(), s));
    r.stats.bytes_uploaded += static_cast<uint64_t>(streams) * 4;
    return r.enqueue_draft(n, steps, targets, s);
  });
}

DeviceDraftOutputs Runtime::draft_async(const int32_t* device_slots, int n, int steps, const DraftTargets& targets,
                                        std::optional<cudaStream_t> stream) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("draft_async");
  const SlotLimits& l = r.slots.limits();
  if (n < 1 || n > l.max_streams)
    fail("draft_async: n = {} slots is outside 1..{} (the largest streams bucket)", n, l.max_streams);
  if (steps < 1 || steps > l.max_steps)
    fail("draft_async: steps = {} is outside 1..{} (max_steps)", steps, l.max_steps);
  if (!device_slots) fail("draft_async: device_slots is null");
  const cudaStream_t s = r.stream_for(stream);
  DeviceScope scope(r.device);
  check_device_pointer(device_slots, r.device, "draft_async: device_slots");
  check_targets(targets, steps, r.device);
  const int streams = r.plan.buckets[r.bucket_for(n)].streams;
  return r.device_work([&] {
    int32_t* own = r.draft_slots_device();
    if (device_slots != own)
      TFE_CUDA(cudaMemcpyAsync(own, device_slots, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
    // The bucket's rows past n are padding (id -1: every byte 0xff).
    if (streams > n) TFE_CUDA(cudaMemsetAsync(own + n, 0xff, static_cast<size_t>(streams - n) * 4, s));
    return r.enqueue_draft(n, steps, targets, s);
  });
}

int32_t* Runtime::draft_slots() const { return impl_->draft_slots_device(); }

DeviceDraftOutputs Runtime::device_outputs() const { return impl_->last_outputs; }

void Runtime::reset(int slot, std::optional<cudaStream_t> stream) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("reset");
  (void)r.slots.empty(slot);  // refuses a slot outside 0..max_slots-1 before anything changes
  const cudaStream_t s = r.stream_for(stream);
  DeviceScope scope(r.device);
  r.refuse_capture(s, "reset", "the host's slot table changes at the call, not at a replay");
  r.slots.reset(slot);
  // Zero the slot's ring and state so that what a slot computes never depends on an earlier sequence's keys
  // (and a draft over it, from device ids, is reported rather than run on stale state).
  r.device_work([&] {
    const size_t per_slot = static_cast<size_t>(r.b_ring_k->bytes / (r.plan.options.max_slots + 1));
    TFE_CUDA(cudaMemsetAsync(r.arena + r.b_ring_k->offset + per_slot * static_cast<size_t>(slot), 0, per_slot, s));
    TFE_CUDA(cudaMemsetAsync(r.arena + r.b_ring_v->offset + per_slot * static_cast<size_t>(slot), 0, per_slot, s));
    const size_t state = static_cast<size_t>(kc::kSlotStateColumns) * 4;
    TFE_CUDA(cudaMemsetAsync(r.arena + r.b_slot_state->offset + state * static_cast<size_t>(slot), 0, state, s));
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

const PlanOptions& Runtime::plan_options() const { return impl_->plan.options; }
const HeadHeader& Runtime::header() const { return impl_->plan.header; }
bool Runtime::fp8_in_use() const { return impl_->plan.fp8; }
const SlotTable& Runtime::slots() const { return impl_->slots; }
int Runtime::ring_rows() const { return impl_->plan.ring_rows; }
cudaStream_t Runtime::stream() const { return impl_->stream; }
int Runtime::device() const { return impl_->device; }
bool Runtime::graphs_enabled() const { return impl_->graphs.has_value(); }

void Runtime::synchronize() const {
  Impl& r = *impl_;
  r.check_usable();
  DeviceScope scope(r.device);
  r.device_work([&] { TFE_CUDA(cudaStreamSynchronize(r.stream)); });
  r.report_device_errors("synchronize");
}

}  // namespace tfe
