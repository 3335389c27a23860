// The draft pass's last node: the pass's outputs (out_token, out_conf: [rows, MAX_STEPS] in the arena)
// copied into host memory (host_token, host_conf), then host_done set to 1, which the host polls.
//
// Why one node at the end and not each step's top1 / rescore writing host memory as well: a grid that
// wrote host memory completes only once those writes have crossed the host link, and the next kernel
// waits for that, so writes in every step cost 0.3-0.9 us a step (BENCHMARKS.md, "A draft call without
// copies"). The plan marks this node `last_step_only`: a pass of s steps runs the one of step s.
//
// Why a completion word: the host sees the word about as soon as it lands, sooner than the stream's own
// completion of the graph launch, which cudaStreamSynchronize waits for. The host clears it before the
// launch; the release store after the CTA barrier orders every thread's copies before it at system scope,
// so a host that reads 1 (with acquire) reads the whole outputs.
#pragma once
#include "common.cuh"
#include "store_outputs.h"

namespace tfe {
namespace kernels {

struct StoreOutputsParams {
  const int* out_token;  // [rows, MAX_STEPS] each, the arena
  const float* out_conf;
  int* host_token;  // [rows, MAX_STEPS] each, host memory
  float* host_conf;
  int* host_done;  // one word, host memory: set to 1 once both tables are there
  long long rows;
};
static_assert(sizeof(StoreOutputsParams) == 8 * 6, "one 8-byte slot per registry parameter");

// One CTA; thread i copies entries i, i + kStoreOutputsThreads, ... of both tables; thread 0 then sets
// host_done.
template <typename Cfg>
__global__ void __launch_bounds__(kStoreOutputsThreads) store_outputs(const StoreOutputsParams p) {
  start_after_predecessors();
  const long long n = p.rows * Cfg::MAX_STEPS;
  for (long long i = threadIdx.x; i < n; i += kStoreOutputsThreads) {
    p.host_token[i] = p.out_token[i];
    p.host_conf[i] = p.out_conf[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p.host_done), "r"(1u) : "memory");
}

}  // namespace kernels
}  // namespace tfe
