// tfe::Runtime: one draft head on one GPU.
//
// open() reads the head, makes (or loads) its plan, uploads the weights the plan names, allocates one
// device range (weights, arena, cuBLASLt workspace), loads every kernel and captures a CUDA graph per
// (streams bucket, steps). Then an engine calls, per round:
//   extend(requests)  the real rows the target verified (taps + the token that follows each), eager;
//   draft(slots, n)   n chained draft steps for each slot: one graph replay;
//   reset(slot)       when a sequence ends.
// State lives on the device: per slot a K/V ring of ring_rows() rows and the last real row's g. The host
// keeps the SlotTable (<tfe/slots.h>), which checks every call before anything changes; a refused call
// changes nothing. Draft rows written into a ring are overwritten by the next extend, so a rejected draft
// needs no rollback.
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

#include <tfe/draft.h>
#include <tfe/error.h>
#include <tfe/head_file.h>
#include <tfe/options.h>
#include <tfe/slots.h>

namespace tfe {

struct OpenOptions {
  // A deploy artifact (tfe-plan compile -o DIR). Empty: plan now and compile through the kernel cache.
  std::string artifact_dir;
  // An artifact made for another head (header sha256) or another architecture than the device's is
  // refused, or, with `recompile_mismatched_artifact`, planned and compiled anew for this head and device.
  bool recompile_mismatched_artifact = false;
  int device = 0;
  // The stream every call enqueues on. Null: the runtime creates its own. Must not be the legacy default
  // stream's handle when graphs are on (capture needs a created stream).
  cudaStream_t stream = nullptr;
  // Plan options (stream buckets, max steps, fp8 mode, max slots, extend rows, attention split, cand_k). The
  // arch is always the device's. With an artifact, when set they must equal the artifact's (else refused or
  // recompiled).
  std::optional<PlanOptions> plan;
  enum class Capture : uint8_t { at_open, lazy };  // lazy: a graph is captured at its first replay
  Capture capture = Capture::at_open;
  bool graphs = true;          // false, or TFE_GRAPHS=0 in the environment: every pass runs eagerly
  size_t graph_capacity = 0;   // executors kept; 0: one per (bucket, steps)
  bool verify_sha256 = false;  // hash every tensor of the head file against its recorded sha256
  // Bytes of L2 set aside so that part of the draft GEMVs' weights stays in L2 from one step to the next
  // (each GEMV's weight matrix launches as an L2 access-policy window whose hit ratio is the set-aside over
  // a step's GEMV weight bytes; its other lines stream). 0: none, the default. Clamped to the device's
  // cudaDevAttrMaxPersistingL2CacheSize; refused where that is 0. The persisting-L2 limit is the process's
  // (cudaLimitPersistingL2CacheSize): the runtime sets it at open, and at close resets the persisting lines
  // (cudaCtxResetPersistingL2Cache) and puts back the limit it found. While it is open, the set-aside part
  // of L2 holds the head's weights between calls too, which the target model's passes then do without.
  size_t l2_resident_weight_bytes = 0;
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
  uint64_t l2_set_aside = 0;      // L2 bytes set aside for resident weights (OpenOptions::l2_resident_weight_bytes)
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
  void extend(std::span<const ExtendRequest> requests);
  // Drafts `steps` tokens for each slot (distinct, non-empty, at most the largest bucket). Blocks until
  // the host copies of tokens and confidences are ready: one graph launch, the tables and the outputs
  // crossing in mapped host memory (the plan's host arena), no copy; the host polls the word the pass's last node sets
  // after the outputs (host_done), which lands sooner than the stream's completion of the launch. Work on
  // stream() is ordered after the pass; other streams that read device_outputs() wait on stream() first.
  // `hidden` of the result is left empty.
  DraftResult draft(std::span<const int> slots, int steps);
  DeviceDraftOutputs device_outputs() const;
  void reset(int slot);

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

  // Waits for the stream; throws on an asynchronous CUDA failure.
  void synchronize() const;

 private:
  struct Impl;
  friend struct RuntimeAccess;  // runtime/testing.h: hooks for tests and measurement
  explicit Runtime(std::unique_ptr<Impl> impl);
  void release() noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tfe
