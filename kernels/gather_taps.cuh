// An extend of device rows: the runtime uploads each row's source addresses (the caller's taps and token,
// any row stride), and this node, the chunk's first, copies them into the arena's `taps` and `row_tok`
// tables, where the rest of the extend pass reads them as it reads rows the host uploaded.
//
// Tokens were never seen by the host, so they are checked here: one outside 0..vocab-1 would index past
// the embedding. It becomes token 0 (the row then holds a wrong but in-bounds value) and the slot and token
// are left in `error` (host memory) for the runtime to report at its next call.
#pragma once
#include "common.cuh"

namespace tfe {
namespace kernels {

struct GatherTapsParams {
  const long long* row_taps_src;  // [rows] device addresses of each row's WIDTH bf16
  const long long* row_tok_src;   // [rows] device addresses of each row's int32 token
  bf16* taps;                     // [rows, WIDTH] the arena
  int* row_tok;                   // [rows]
  const int* row_slot;            // [rows]: names the slot in the error record
  long long* error;               // one record in host memory
  long long rows;
  long long vocab;
};
static_assert(sizeof(GatherTapsParams) == 8 * 8, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) gather_taps(const GatherTapsParams p) {
  start_after_predecessors();
  constexpr long long W = Cfg::WIDTH;
  const long long r = blockIdx.x;
  if (r >= p.rows) return;
  const bf16* src = reinterpret_cast<const bf16*>(p.row_taps_src[r]);
  bf16* dst = p.taps + r * W;
  // 16-byte copies when the caller's row starts 16-byte aligned (any row stride is allowed).
  const bool vec =
      W % 8 == 0 && ((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) & 15) == 0;
  if (vec) {
    for (long long c = threadIdx.x; c < W / 8; c += blockDim.x)
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
  } else {
    for (long long e = threadIdx.x; e < W; e += blockDim.x) dst[e] = src[e];
  }
  if (threadIdx.x == 0) {
    const int token = *reinterpret_cast<const int*>(p.row_tok_src[r]);
    const bool in_range = token >= 0 && token < p.vocab;
    p.row_tok[r] = in_range ? token : 0;
    if (!in_range)
      *reinterpret_cast<volatile long long*>(p.error) = error_record(kErrorExtendToken, p.row_slot[r], token);
  }
}

}  // namespace kernels
}  // namespace tfe
