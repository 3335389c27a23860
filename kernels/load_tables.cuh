// The draft pass's first node: the four tables of the call (slot, pos, first_pos, tok; `rows` entries
// each), which the host wrote into mapped pinned memory, copied into the arena where the pass's kernels
// read them; and each row's hidden input g[r] = slot_g[slot[r]], the slot's last hidden row, which step 1
// starts from. One CTA per row.
//
// Why a kernel and not a copy: a host-to-device copy on the stream is a copy-engine round trip of several
// microseconds before the graph may start; a kernel's read of host memory is one trip over the host link
// (BENCHMARKS.md, "A draft call without copies"). The loads are `ld.global.cv` (fetched again, never
// from a cached line), since the host rewrites these bytes before every call. The gather of g rides in
// the same kernel because it needs the row's slot, which this kernel already holds: as a node of its own
// it was one more launch a call, waiting on this one's stores.
#pragma once
#include "common.cuh"
#include "copy_rows.cuh"

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
  const bf16* slot_g;  // [slots, WIDTH]: each slot's last hidden row
  bf16* g;             // [rows, WIDTH]
  long long rows;
};
static_assert(sizeof(LoadTablesParams) == 8 * 11, "one 8-byte slot per registry parameter");

// Table t of the four (selects, not an indexed array: that would live on the stack).
template <typename T>
__device__ __forceinline__ T table_of(int t, T a, T b, T c, T d) {
  return t == 0 ? a : t == 1 ? b : t == 2 ? c : d;
}

// CTA r: threads 0..3 copy entry r of the four tables; then every thread copies its part of row r of g.
template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) load_tables(const LoadTablesParams p) {
  constexpr long long W = Cfg::WIDTH;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  // Host memory is written before the launch, not by an earlier node: its loads go out before the wait.
  // Every thread needs the row's slot (a warp's loads of one word are one request).
  const int t = static_cast<int>(threadIdx.x);
  const int slot = __ldcv(p.host_slot + r);
  const int entry = t < 4 ? __ldcv(table_of(t, p.host_slot, p.host_pos, p.host_first_pos, p.host_tok) + r) : 0;
  start_after_predecessors();  // slot_g is written by earlier work on the stream (extend, the last pass)
  if (t < 4) table_of(t, p.slot, p.pos, p.first_pos, p.tok)[r] = entry;
  copy_row<W>(p.slot_g + static_cast<long long>(slot) * W, p.g + r * W);
}

}  // namespace kernels
}  // namespace tfe
