// The draft pass's first node: the call's tables. Row i drafts for the slot named by ids[i] (-1: padding,
// the scratch slot); its position, first position and last token come from that slot's state, which the
// extend pass keeps on the device (keep_state). They land in the four arena tables (slot, pos, first_pos,
// tok) where the pass's kernels read them. A plan with first_ranks also copies each row's rank (ranks[i],
// beside the ids) into `rank`, which step 1's ranked reads.
//
// `ids` is either host memory (host_tables: a blocking draft, whose slot ids the host wrote just before the
// launch) or the arena (draft_slots: an enqueued draft, whose ids the caller's stream put there). A kernel's
// read of host memory is one trip over the host link, cheaper than a copy on the stream before the graph
// (BENCHMARKS.md, "A draft call without copies"). The loads are `ld.global.cv` (fetched again, never from a
// cached line), since the ids are rewritten before every call.
//
// Why the state lives on the device: an engine's extend may hand device tokens, which the host never sees,
// and a pass recorded into the engine's own graph must read positions as they are at replay, not as they
// were at capture.
//
// A bad id (not -1, outside 0..max_slots-1, or a slot that holds no sequence) can come only from device
// memory the host did not check: the row drafts from the scratch slot instead, so nothing is read out of
// bounds, and the row and id are left in `error` (host memory) for the runtime to report at its next call.
//
// Why one CTA: reads of mapped host memory from many CTAs queue one behind another, about 0.75 us each on
// the H200 (BENCHMARKS.md, "Tried and not kept": load_tables gathering g).
#pragma once
#include "common.cuh"
#include "load_tables.h"

namespace tfe {
namespace kernels {

struct LoadTablesParams {
  const int* ids;          // [rows] host memory or the arena
  const int* ranks;        // [rows] beside ids (host_ranks or draft_ranks); RANKS only
  const int4* slot_state;  // [slots]: {last_pos, first_pos, last_token, filled}, the arena
  int* slot;               // [rows] each, the arena
  int* pos;
  int* first_pos;
  int* tok;
  int* rank;         // [rows] the arena, step 1's rank for ranked; RANKS only
  long long* error;  // one record in host memory (kernels/constants.h kError*), written only for a bad id
  long long rows;
  long long max_slots;  // slots 0..max_slots-1 hold sequences; max_slots is the scratch slot
  long long max_rank;   // ranks 0..max_rank: min(kMaxFirstRank, draft_vocab - 1)
};
static_assert(sizeof(LoadTablesParams) == 8 * 12, "one 8-byte slot per registry parameter");

// One CTA of kLoadTablesThreads; thread i fills row i (launch_shape refuses more rows).
template <typename Cfg>
__global__ void __launch_bounds__(kLoadTablesThreads) load_tables(const LoadTablesParams p) {
  // draft_slots may be written by the node just before (an enqueued draft), so every load waits.
  start_after_predecessors();
  const long long i = threadIdx.x;
  if (i >= p.rows) return;
  const int id = __ldcv(p.ids + i);
  int slot = static_cast<int>(p.max_slots);
  int4 state = make_int4(0, 0, 0, 0);
  if (id >= 0 && id < p.max_slots) {
    state = __ldcv(p.slot_state + id);
    if (state.w != 0) slot = id;
  }
  if (slot != id && id != kPaddingSlot) {
    // The scratch slot's state: zeros, like its ring.
    state = make_int4(0, 0, 0, 0);
    *reinterpret_cast<volatile long long*>(p.error) = error_record(kErrorDraftSlot, i, id);
  }
  p.slot[i] = slot;
  p.pos[i] = state.x;
  p.first_pos[i] = state.y;
  p.tok[i] = state.z;
  if constexpr (Cfg::RANKS != 0) {
    // A rank out of range can come only from device memory too: rank 0 (a chain) instead, and reported.
    // A row with a bad id keeps that record: its outputs are meaningless whatever its rank.
    int want = __ldcv(p.ranks + i);
    if (want < 0 || want > p.max_rank) {
      if (slot == id || id == kPaddingSlot)
        *reinterpret_cast<volatile long long*>(p.error) = error_record(kErrorDraftRank, i, want);
      want = 0;
    }
    p.rank[i] = want;
  }
}

}  // namespace kernels
}  // namespace tfe
