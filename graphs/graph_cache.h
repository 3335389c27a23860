// Captured CUDA graphs of the draft passes, one executor per GraphKey, in a bounded map.
//
// A graph is captured from the very function the eager path calls (a `Record` that enqueues the pass on
// the stream it is given), in thread-local capture mode, so a graph and an eager pass launch the same
// kernels with the same arguments. Captures run on a stream the cache creates for them, so the stream the
// graphs replay on may be any stream of the device, the legacy default stream included (which cannot
// capture). Graphs hold raw device addresses: every buffer a graph reads or writes lives in memory owned
// by the Runtime (weights, arena, cuBLASLt workspace, host arena), which outlives its GraphCache. Each
// executor records the `Bindings` (the base addresses) it was captured with:
//  - `run` with bindings that differ re-captures and updates the executor in place (cudaGraphExecUpdate),
//    re-instantiating when the update is refused;
//  - with `check_bindings` on (the default in tests), `replay` refuses an executor whose recorded
//    bindings are not the live ones, which catches a pass that would read freed or moved memory.
// When the map is full the least recently used executor is destroyed.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <map>

#include "graphs/graph_key.h"
#include "device/handles.h"

namespace tfe {

// The device addresses a captured pass depends on.
struct Bindings {
  const void* arena = nullptr;
  const void* tables = nullptr;
  const void* weights = nullptr;
  const void* workspace = nullptr;
  const void* host = nullptr;  // the host arena's device address
  bool operator==(const Bindings&) const = default;
};

struct GraphCounters {
  uint64_t captures = 0;        // captures that made a new executor
  uint64_t updates = 0;         // re-captures applied with cudaGraphExecUpdate
  uint64_t reinstantiated = 0;  // re-captures whose update was refused and were instantiated anew
  uint64_t evictions = 0;
  uint64_t replays = 0;
};

class GraphCache {
 public:
  using Record = std::function<void(cudaStream_t)>;

  // `stream`: where executors are uploaded and, by default, replayed.
  GraphCache(cudaStream_t stream, size_t capacity, bool check_bindings);
  GraphCache(GraphCache&&) = default;
  GraphCache& operator=(GraphCache&&) = default;

  // Captures the executor of `key` if absent; re-captures and updates it if `live` differs from what it
  // was captured with. Does not launch.
  void prepare(const GraphKey& key, const Bindings& live, const Record& record);
  // Replays the executor of `key` on `stream` (it must exist); any stream of the device.
  void replay(const GraphKey& key, const Bindings& live, cudaStream_t stream);
  void replay(const GraphKey& key, const Bindings& live) { replay(key, live, stream_); }
  // prepare + replay.
  void run(const GraphKey& key, const Bindings& live, const Record& record, cudaStream_t stream);
  void run(const GraphKey& key, const Bindings& live, const Record& record) { run(key, live, record, stream_); }

  bool contains(const GraphKey& key) const { return execs_.count(key) != 0; }
  size_t size() const { return execs_.size(); }
  size_t capacity() const { return capacity_; }
  const GraphCounters& counters() const { return counters_; }
  bool check_bindings() const { return check_bindings_; }
  void set_check_bindings(bool on) { check_bindings_ = on; }
  // Tests (runtime/testing.h): the next instantiation fails with `error` instead of calling
  // cudaGraphInstantiate, through the same check and message as a real failure.
  void inject_instantiate_error(cudaError_t error) { injected_instantiate_error_ = error; }
  void clear();

 private:
  struct Entry {
    cuda::GraphExec exec;
    Bindings bindings;
    std::list<GraphKey>::iterator lru;
  };
  cuda::Graph capture(const GraphKey& key, const Record& record);
  cuda::GraphExec instantiate(const GraphKey& key, const cuda::Graph& graph);
  void touch(Entry& e);

  cudaStream_t stream_ = nullptr;
  cuda::Stream capture_stream_;
  size_t capacity_ = 0;
  bool check_bindings_ = true;
  cudaError_t injected_instantiate_error_ = cudaSuccess;
  std::map<GraphKey, Entry> execs_;
  std::list<GraphKey> lru_;  // front: most recently used
  GraphCounters counters_;
};

}  // namespace tfe
