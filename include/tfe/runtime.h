// tfe::Runtime: one draft head on one GPU.
//
// open() reads the head, makes (or loads) its plan, uploads the weights the plan names, allocates one
// device range (weights, arena, cuBLASLt workspace), loads every kernel and captures a CUDA graph per
// (streams bucket, steps). Then an engine calls, per round:
//   extend(requests)        the real rows the target verified (taps + the token that follows each), eager;
//                           taps and tokens in host memory, or in device memory (DeviceExtendRequest);
//   draft(slots, n)         n chained draft steps for each slot: one graph replay; returns host copies;
//   draft_async(slots, n)   the same, enqueued only: outputs stay on the device, nothing waits, and it can
//                           be recorded into the caller's own stream capture (docs/runtime.md);
//   reset(slot)             when a sequence ends;
//   record_accepted(kept, n) after the target verified a round: the accept log (<tfe/accept_log.h>).
// State lives on the device: per slot a K/V ring of ring_rows() rows, the last real row's g, and its
// position, first position and token. The host keeps the SlotTable (<tfe/slots.h>) of positions, which
// checks every call before anything changes; a refused call changes nothing. Draft rows written into a
// ring are overwritten by the next extend, so a rejected draft needs no rollback.
//
// What the host never sees (device tokens, device slot ids) is checked on the device: a bad value is
// replaced by one in range (token 0, the scratch slot), so nothing is read out of bounds, and a later call
// (at the latest synchronize()) throws tfe::Error naming it. The affected slot's state is then wrong and
// the slot should be reset.
//
// Streams: every call that takes `stream` enqueues there (nullopt: stream()). Calls on different streams
// are ordered by the caller, as with any CUDA library handle.
//
// Errors are tfe::Error with a message naming what, where and the limit. A CUDA failure during a call
// leaves the device state unknown: the runtime then refuses every later call (naming the first failure)
// and must be destroyed. One thread at a time per Runtime.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>

#include <tfe/accept_log.h>
#include <tfe/draft.h>
#include <tfe/error.h>
#include <tfe/head_file.h>
#include <tfe/options.h>
#include <tfe/slots.h>
#include <tfe/tap_dump.h>

namespace tfe {

// Runtime::open applies the environment's overrides named below (TFE_*) to these once, before anything else
// (docs/runtime.md "Open").
struct OpenOptions {
  // A deploy artifact (tfe-plan compile -o DIR). Empty: plan now and compile through the kernel cache.
  std::string artifact_dir;
  // An artifact made for another head (header sha256) or another architecture than the device's is
  // refused, or, with `recompile_mismatched_artifact`, planned and compiled anew for this head and device.
  bool recompile_mismatched_artifact = false;
  int device = 0;
  // The stream every call enqueues on: any stream of the device, cudaStreamLegacy (the default stream of
  // torch and most engines) included; graphs are captured on a stream of the runtime's own. Null: the
  // runtime creates its own.
  cudaStream_t stream = nullptr;
  // Plan options (stream buckets, max steps, fp8 mode, max slots, extend rows, attention split, cand_k). The
  // arch is always the device's. With an artifact, when set they must equal the artifact's (else refused or
  // recompiled).
  std::optional<PlanOptions> plan;
  // Draft passes replay CUDA graphs, captured at open. false, or TFE_GRAPHS=0 in the environment: every pass
  // runs eagerly (for A/B runs).
  bool graphs = true;
  bool verify_sha256 = false;  // hash every tensor of the head file against its recorded sha256
  // One JSON line every `every` rounds of record_accepted (docs/runtime.md "The accept log"). TFE_ACCEPT_LOG=N
  // and TFE_ACCEPT_LOG_FILE=PATH in the environment override `every` and `path`.
  AcceptLogOptions accept_log;
  // Every real row of every extend call (host and device forms) kept and written as one safetensors file at
  // close or by write_tap_dump() (docs/runtime.md "The tap dump"). Off unless `path` is set; TFE_TAP_DUMP=FILE
  // in the environment sets it. A device extend then waits for its rows' copy to the host.
  TapDumpOptions tap_dump;
  // After everything is loaded, draft a fixed case and compare it with the CPU reference under the bound of
  // the GPU tests; a step outside it refuses the open (docs/runtime.md "The self-check"). TFE_CHECK=1 (or 0)
  // in the environment overrides it.
  bool self_check = false;
};

struct RuntimeStats {
  uint64_t replays = 0;        // draft passes run as a graph replay
  uint64_t eager_passes = 0;   // draft passes launched node by node
  uint64_t extend_chunks = 0;  // eager extend chunks
  uint64_t captures = 0;       // graphs captured (re-captures for an update included)
  uint64_t graph_updates = 0;  // executors updated in place or re-instantiated
  // Bytes across the host link, copied or (a draft's tables and outputs) read and written by its kernels.
  uint64_t bytes_uploaded = 0;    // host -> device, weights excluded
  uint64_t bytes_downloaded = 0;  // device -> host
  uint64_t weight_bytes = 0;      // uploaded at open
  uint64_t l2_set_aside = 0;      // L2 bytes set aside for resident weights (runtime/testing.h; else 0)
};

// Device addresses of the draft outputs, for engines that consume them on the device. Row r (the r-th
// slot of the last draft call) and step s (1-based) is at index r * row_stride + (s - 1). Valid until the
// next draft call; written in stream() order (another stream waits on stream() before reading them).
struct DeviceDraftOutputs {
  const int32_t* tokens = nullptr;
  const float* confidences = nullptr;
  int64_t row_stride = 0;
  int rows = 0;
  int steps = 0;
};

// Device buffers an enqueued draft also copies its outputs into (on its stream, after the pass): row r and
// step s at r * row_stride + (s - 1). Null pointers: that output stays only in device_outputs().
struct DraftTargets {
  int32_t* tokens = nullptr;
  float* confidences = nullptr;
  int64_t row_stride = 0;  // elements, >= steps; 0: steps
};

class Runtime {
 public:
  static Runtime open(const std::string& head_path, const OpenOptions& options = {});
  // From a head already in memory (HeadFile::from_bytes); the file need not outlive the call.
  static Runtime open(const HeadFile& file, const OpenOptions& options = {});

  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();

  // Absorbs real rows (see ExtendRequest): every request is checked before anything changes; then the
  // rows run in chunks of up to plan_options().extend_rows rows. Asynchronous on stream(): the request's
  // spans may be released on return.
  void extend(std::span<const ExtendRequest> requests, std::optional<cudaStream_t> stream = std::nullopt);
  // The same from device memory: the rows' taps are copied on the device (any row stride), the tokens are
  // read there (a token outside the vocabulary is replaced and reported later, see above); the host
  // uploads only the chunk's tables (slots, positions, row addresses) and never waits for the device.
  void extend(std::span<const DeviceExtendRequest> requests, std::optional<cudaStream_t> stream = std::nullopt);
  // Drafts `steps` tokens for each slot (distinct, non-empty, at most the largest bucket). Blocks until
  // the host copies of tokens and confidences are ready: one graph launch, the tables and the outputs
  // crossing in mapped host memory (the plan's host arena), no copy; the host polls the word the pass's last node sets
  // after the outputs (host_done), which lands sooner than the stream's completion of the launch. Work on
  // stream() is ordered after the pass; other streams that read device_outputs() wait on stream() first.
  // `hidden` of the result is left empty. `first_ranks` (a plan with first_ranks only; empty: every slot its
  // best): step 1 of slots[i] takes the token of that rank, as Reference::draft's (the branches of a draft tree).
  DraftResult draft(std::span<const int> slots, int steps, std::span<const int> first_ranks = {});
  // Enqueues the same draft and returns at once: the slot ids cross in one copy on the stream, the outputs
  // stay in device_outputs() (and `targets`, where given). Not for a capturing stream: the host's ids would
  // be read at replay from memory the runtime has since reused (use the device form below).
  DeviceDraftOutputs draft_async(std::span<const int> slots, int steps, const DraftTargets& targets = {},
                                 std::optional<cudaStream_t> stream = std::nullopt,
                                 std::span<const int> first_ranks = {});
  // The same with `n` slot ids read on the device at `device_slots` (the caller's, or draft_slots()), so
  // that a stream capture records a pass whose slots the caller may change before each replay; positions
  // and tokens are read at replay too. The host checks n and steps; the device checks the ids (see above).
  // On a capturing stream the pass is recorded node by node (the launches a graph of the runtime's own
  // holds); otherwise it is a replay of the runtime's graph.
  // `device_first_ranks`: [n] int32 in device memory, read at replay like the ids (null: every slot its
  // best); a value outside 0..kMaxFirstRank (below draft_vocab) drafts the best and is reported as above.
  DeviceDraftOutputs draft_async(const int32_t* device_slots, int n, int steps, const DraftTargets& targets = {},
                                 std::optional<cudaStream_t> stream = std::nullopt,
                                 const int32_t* device_first_ranks = nullptr);
  // The runtime's own slot-id buffer [largest bucket] in device memory, for draft_async's device form.
  int32_t* draft_slots() const;
  DeviceDraftOutputs device_outputs() const;
  void reset(int slot, std::optional<cudaStream_t> stream = std::nullopt);

  // The one call an engine makes after the target verified a round: kept[i] of the `steps` tokens drafted
  // for the i-th slot of that round's draft were accepted (0..steps; steps 1..max_steps). Host only; counted
  // in accept_totals() and written to the accept log (OpenOptions::accept_log). A refused call counts nothing.
  void record_accepted(std::span<const int> kept, int steps);
  const AcceptCounts& accept_totals() const;  // every round recorded since open

  // Writes the tap dump's file now, with every row kept so far (OpenOptions::tap_dump); it is written again at
  // close. Throws tfe::Error naming the path when it cannot be written, or when no tap dump is on.
  void write_tap_dump();

  RuntimeStats stats() const;
  // The options of the plan the runtime runs (the artifact's, or those asked; arch: the device's).
  const PlanOptions& plan_options() const;
  const HeadHeader& header() const;
  bool fp8_in_use() const;  // whether any linear runs in its FP8 form
  const SlotTable& slots() const;
  int ring_rows() const;
  cudaStream_t stream() const;
  int device() const;
  bool graphs_enabled() const;

  // Waits for the stream; throws on an asynchronous CUDA failure, then on bad device input found since
  // the last call (see above).
  void synchronize() const;

 private:
  struct Impl;
  friend struct RuntimeAccess;  // runtime/testing.h: hooks for tests and measurement
  explicit Runtime(std::unique_ptr<Impl> impl);
  void release() noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tfe
