// The draft pass's first node: the four tables of the call (slot, pos, first_pos, tok; `rows` entries
// each), which the host wrote into mapped pinned memory, copied into the arena where the pass's kernels
// read them.
//
// Why a kernel and not a copy: a host-to-device copy on the stream is a copy-engine round trip of several
// microseconds before the graph may start; a kernel's read of host memory is one trip over the host link
// (BENCHMARKS.md, "A draft call without copies"). The loads are `ld.global.cv` (fetched again, never
// from a cached line), since the host rewrites these bytes before every call.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct LoadTablesParams {
  const int* host_slot;  // [rows] each, host memory
  const int* host_pos;
  const int* host_first_pos;
  const int* host_tok;
  int* slot;  // [rows] each, the arena
  int* pos;
  int* first_pos;
  int* tok;
  long long rows;
};
static_assert(sizeof(LoadTablesParams) == 8 * 9, "one 8-byte slot per registry parameter");

// Table t of the four, laid end to end (selects, not an indexed array: that would live on the stack).
template <typename T>
__device__ __forceinline__ T table_of(long long t, T a, T b, T c, T d) {
  return t == 0 ? a : t == 1 ? b : t == 2 ? c : d;
}

// One CTA; thread i copies entries i, i + blockDim.x, ... of the four tables laid end to end.
template <typename Cfg>
__global__ void __launch_bounds__(128) load_tables(const LoadTablesParams p) {
  constexpr int kPerThread = 4;  // 4 x 128 entries: four tables of up to 128 rows in one round of loads
  int v[kPerThread];
  const long long n = 4 * p.rows;
  // Host memory is written before the launch, not by an earlier node: its loads go out before the wait.
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const long long i = threadIdx.x + k * 128LL;
    if (i < n)
      v[k] = __ldcv(table_of(i / p.rows, p.host_slot, p.host_pos, p.host_first_pos, p.host_tok) + i % p.rows);
  }
  start_after_predecessors();
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const long long i = threadIdx.x + k * 128LL;
    if (i < n) table_of(i / p.rows, p.slot, p.pos, p.first_pos, p.tok)[i % p.rows] = v[k];
  }
}

}  // namespace kernels
}  // namespace tfe
