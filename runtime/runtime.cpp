// tfe::Runtime's calls (<tfe/runtime.h>): extend, draft, reset, the accept log and tap dump, stats; its open
// is runtime/open.cpp.
#include <tfe/runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/extend_check.h"
#include "runtime/impl.h"

namespace tfe {

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
  if (kind == kc::kErrorDraftRank)
    fail(
        "{}: an earlier draft_async found first rank {} in row {} of its device ranks, outside 0..{} "
        "(kMaxFirstRank, below draft_vocab); that row drafted its best token instead; nothing else changed, and "
        "this call did nothing",
        call, value, index, max_first_rank(plan.header));
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

DraftResult Runtime::draft(std::span<const int> slot_ids, int steps, std::span<const int> first_ranks) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("draft");
  r.slots.check_draft(slot_ids, steps);
  r.check_ranks("draft", first_ranks, slot_ids.size());
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
    if (r.h_ranks) {
      auto* ranks = r.host_buffer<int32_t>(r.h_ranks);
      for (int i = 0; i < streams; ++i)
        ranks[i] = i < static_cast<int>(first_ranks.size()) ? first_ranks[static_cast<size_t>(i)] : 0;
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
                                        std::optional<cudaStream_t> stream, std::span<const int> first_ranks) {
  Impl& r = *impl_;
  r.check_usable();
  r.report_device_errors("draft_async");
  r.slots.check_draft(slot_ids, steps);
  r.check_ranks("draft_async", first_ranks, slot_ids.size());
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
    // A table of the ring holds the bucket's ids, then (with first_ranks) its ranks.
    const int largest = r.plan.options.buckets.back();
    auto* ids = reinterpret_cast<int32_t*>(r.id_staging.data()) + static_cast<size_t>(i) * 2 * largest;
    for (int k = 0; k < streams; ++k) ids[k] = k < n ? slot_ids[static_cast<size_t>(k)] : kc::kPaddingSlot;
    TFE_CUDA(cudaMemcpyAsync(r.draft_slots_device(), ids, static_cast<size_t>(streams) * 4, cudaMemcpyHostToDevice, s));
    r.stats.bytes_uploaded += static_cast<uint64_t>(streams) * 4;
    if (r.b_draft_ranks) {
      int32_t* ranks = ids + largest;
      for (int k = 0; k < streams; ++k)
        ranks[k] = k < static_cast<int>(first_ranks.size()) ? first_ranks[static_cast<size_t>(k)] : 0;
      TFE_CUDA(
          cudaMemcpyAsync(r.draft_ranks_device(), ranks, static_cast<size_t>(streams) * 4, cudaMemcpyHostToDevice, s));
      r.stats.bytes_uploaded += static_cast<uint64_t>(streams) * 4;
    }
    TFE_CUDA(cudaEventRecord(r.id_staged[i].get(), s));
    return r.enqueue_draft(n, steps, targets, s);
  });
}

DeviceDraftOutputs Runtime::draft_async(const int32_t* device_slots, int n, int steps, const DraftTargets& targets,
                                        std::optional<cudaStream_t> stream, const int32_t* device_first_ranks) {
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
  if (device_first_ranks) {
    r.check_ranks("draft_async", {}, static_cast<size_t>(n), true);
    check_device_pointer(device_first_ranks, r.device, "draft_async: device_first_ranks");
  }
  check_targets(targets, steps, r.device);
  const int streams = r.plan.buckets[r.bucket_for(n)].streams;
  return r.device_work([&] {
    int32_t* own = r.draft_slots_device();
    if (device_slots != own)
      TFE_CUDA(cudaMemcpyAsync(own, device_slots, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
    // The bucket's rows past n are padding (id -1: every byte 0xff).
    if (streams > n) TFE_CUDA(cudaMemsetAsync(own + n, 0xff, static_cast<size_t>(streams - n) * 4, s));
    if (int32_t* ranks = r.b_draft_ranks ? r.draft_ranks_device() : nullptr) {
      // No ranks given: every row its best. The device checks the values (load_tables).
      if (device_first_ranks && device_first_ranks != ranks)
        TFE_CUDA(cudaMemcpyAsync(ranks, device_first_ranks, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
      const int from = device_first_ranks ? n : 0;
      if (streams > from) TFE_CUDA(cudaMemsetAsync(ranks + from, 0, static_cast<size_t>(streams - from) * 4, s));
    }
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
