// The draft pass's last node: the pass's outputs (out_token, out_conf: [rows, MAX_STEPS] in the arena)
// copied into host memory (host_token, host_conf), where the host reads them once the pass is done.
//
// Why one node at the end and not each step's top1 / rescore writing host memory as well: a grid that
// wrote host memory completes only once those writes have crossed the host link, and the next kernel
// waits for that, so writes in every step cost 0.3-0.9 us a step (BENCHMARKS.md, "A draft call without
// copies"). The plan marks this node `last_step_only`: a pass of s steps runs the one of step s.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct StoreOutputsParams {
  const int* out_token;  // [rows, MAX_STEPS] each, the arena
  const float* out_conf;
  int* host_token;  // [rows, MAX_STEPS] each, host memory
  float* host_conf;
  long long rows;
};
static_assert(sizeof(StoreOutputsParams) == 8 * 5, "one 8-byte slot per registry parameter");

// One CTA; thread i copies entries i, i + 128, ... of both tables.
template <typename Cfg>
__global__ void __launch_bounds__(128) store_outputs(const StoreOutputsParams p) {
  start_after_predecessors();
  const long long n = p.rows * Cfg::MAX_STEPS;
  for (long long i = threadIdx.x; i < n; i += 128) {
    p.host_token[i] = p.out_token[i];
    p.host_conf[i] = p.out_conf[i];
  }
}

}  // namespace kernels
}  // namespace tfe
