// The extend pass's last node: each slot the chunk touched keeps its last real row's position and token,
// and the first position of its sequence, as its device state (slot_state), which the next draft pass's
// load_tables reads. The runtime's host slot table holds the same positions; the token may exist only on
// the device (an extend of device tokens).
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct KeepStateParams {
  const int* last_row;    // [rows] the chunk row of each touched slot's last row
  const int* last_slot;   // [rows]
  const int* last_first;  // [rows] the first position of that slot's sequence
  const int* row_pos;     // [chunk rows]
  const int* row_tok;     // [chunk rows]
  int4* slot_state;       // [slots]
  long long rows;
};
static_assert(sizeof(KeepStateParams) == 8 * 7, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(kKeepStateThreads) keep_state(const KeepStateParams p) {
  start_after_predecessors();
  const long long i = blockIdx.x * static_cast<long long>(kKeepStateThreads) + threadIdx.x;
  if (i >= p.rows) return;
  const int r = p.last_row[i];
  p.slot_state[p.last_slot[i]] = make_int4(p.row_pos[r], p.last_first[i], p.row_tok[r], 1);
}

}  // namespace kernels
}  // namespace tfe
