#include "graphs/graph_cache.h"

#include <utility>

#include "core/error.h"

namespace tfe {

GraphCache::GraphCache(cudaStream_t stream, size_t capacity, bool check_bindings)
    : stream_(stream), capacity_(capacity), check_bindings_(check_bindings) {
  if (capacity_ < 1) fail("graph cache: capacity {} must be at least 1", capacity_);
  capture_stream_ = cuda::create_stream();
}

cuda::Graph GraphCache::capture(const GraphKey& key, const Record& record) {
  // Thread-local mode: another thread's unsafe calls (cudaMalloc, ...) do not invalidate this capture,
  // while such calls made by the pass itself still do, which is what catches a pass that allocates.
  TFE_CUDA(cudaStreamBeginCapture(capture_stream_.get(), cudaStreamCaptureModeThreadLocal));
  try {
    record(capture_stream_.get());
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(capture_stream_.get(), &partial);
    if (partial) cuda::release_graph(partial);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(capture_stream_.get(), &g);
  cuda::Graph graph(g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("capturing the draft pass {} failed: {} ({}); the pass made a call that cannot be captured", key.str(),
              cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return graph;
}

cuda::GraphExec GraphCache::instantiate(const GraphKey& key, const cuda::Graph& graph) {
  cudaGraphExec_t exec = nullptr;
  const cudaError_t injected = std::exchange(injected_instantiate_error_, cudaSuccess);
  const cudaError_t e = injected != cudaSuccess ? injected : cudaGraphInstantiate(&exec, graph.get(), 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_cuda("instantiating the graph of the draft pass {} failed: {} ({})", key.str(), cudaGetErrorName(e),
              cudaGetErrorString(e));
  }
  return cuda::GraphExec(exec);
}

void GraphCache::touch(Entry& e) { lru_.splice(lru_.begin(), lru_, e.lru); }

void GraphCache::prepare(const GraphKey& key, const Bindings& live, const Record& record) {
  if (auto it = execs_.find(key); it != execs_.end()) {
    Entry& e = it->second;
    touch(e);
    if (e.bindings == live) return;
    cuda::Graph graph = capture(key, record);
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(e.exec.get(), graph.get(), &info) == cudaSuccess) {
      ++counters_.updates;
    } else {
      // The topology or a node kind changed: cudaGraphExecUpdate cannot apply it, so instantiate anew.
      (void)cudaGetLastError();
      e.exec = instantiate(key, graph);
      ++counters_.reinstantiated;
    }
    e.bindings = live;
    return;
  }

  cuda::Graph graph = capture(key, record);
  cuda::GraphExec owned = instantiate(key, graph);
  // Moves the executable's data to the device now rather than at the first replay.
  TFE_CUDA(cudaGraphUpload(owned.get(), stream_));
  if (execs_.size() >= capacity_) {
    execs_.erase(lru_.back());
    lru_.pop_back();
    ++counters_.evictions;
  }
  lru_.push_front(key);
  execs_.emplace(key, Entry{std::move(owned), live, lru_.begin()});
  ++counters_.captures;
}

void GraphCache::replay(const GraphKey& key, const Bindings& live, cudaStream_t stream) {
  auto it = execs_.find(key);
  if (it == execs_.end()) fail("graph {} has not been captured", key.str());
  Entry& e = it->second;
  if (check_bindings_ && !(e.bindings == live))
    fail(
        "graph {} was captured with arena {}, tables {} and host arena {}, but they now live at {}, {} and {}: "
        "replaying it would touch memory the runtime no longer owns",
        key.str(), e.bindings.arena, e.bindings.tables, e.bindings.host, live.arena, live.tables, live.host);
  touch(e);
  TFE_CUDA(cudaGraphLaunch(e.exec.get(), stream));
  ++counters_.replays;
}

void GraphCache::run(const GraphKey& key, const Bindings& live, const Record& record, cudaStream_t stream) {
  prepare(key, live, record);
  replay(key, live, stream);
}

void GraphCache::clear() {
  execs_.clear();
  lru_.clear();
}

}  // namespace tfe
