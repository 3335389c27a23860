// The draft pass's first node: the call's tables, which the host wrote into mapped pinned memory as one
// buffer `host_tables` [rows, 4] (a row's slot, pos, first_pos, tok side by side), copied into the four
// arena tables (slot, pos, first_pos, tok) where the pass's kernels read them.
//
// Why a kernel and not a copy: a host-to-device copy on the stream is a copy-engine round trip of several
// microseconds before the graph may start; a kernel's read of host memory is one trip over the host link
// (BENCHMARKS.md, "A draft call without copies"). The loads are `ld.global.cv` (fetched again, never
// from a cached line), since the host rewrites these bytes before every call.
//
// Why one CTA: reads of mapped host memory from many CTAs queue one behind another, about 0.75 us each on
// the H200 (BENCHMARKS.md, "Tried and not kept": load_tables gathering g). Why one buffer of rows: the
// host writes a row's four entries together and a thread reads them in one 16-byte load. (Four tables
// read by one warp measured the same within 0.3 us a call: one warp's loads leave together.)
#pragma once
#include "common.cuh"
#include "load_tables.h"

namespace tfe {
namespace kernels {

struct LoadTablesParams {
  const int* host_tables;  // [rows, 4] host memory, 16-byte aligned (validate: param_alignment)
  int* slot;               // [rows] each, the arena
  int* pos;
  int* first_pos;
  int* tok;
  long long rows;
};
static_assert(sizeof(LoadTablesParams) == 8 * 6, "one 8-byte slot per registry parameter");

static_assert(kHostTableColumns == 4, "a host_tables row is one int4");

// One CTA of kLoadTablesThreads; thread i copies row i (launch_shape refuses more rows).
template <typename Cfg>
__global__ void __launch_bounds__(kLoadTablesThreads) load_tables(const LoadTablesParams p) {
  const long long i = threadIdx.x;
  int4 v = make_int4(0, 0, 0, 0);
  // Host memory is written before the launch, not by an earlier node: its load goes out before the wait.
  if (i < p.rows) v = __ldcv(reinterpret_cast<const int4*>(p.host_tables) + i);
  start_after_predecessors();
  if (i < p.rows) {
    p.slot[i] = v.x;
    p.pos[i] = v.y;
    p.first_pos[i] = v.z;
    p.tok[i] = v.w;
  }
}

}  // namespace kernels
}  // namespace tfe
