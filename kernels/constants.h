// What the host and the kernels both read: the values of the kernels' enumerated constants, the sizes of
// the records one kernel leaves for another, and the helpers the shared shapes (kernels/*.h) compute with.
// Compiled by the host compiler and by NVRTC (embedded with the kernel sources), so: C++17, no standard
// headers, sizes as long long.
#pragma once

#if defined(__CUDACC__)
#define TFE_HOST_DEVICE __host__ __device__
#else
#define TFE_HOST_DEVICE
#endif

namespace tfe {

namespace kc {
constexpr long long kWeightBF16 = 0, kWeightFP8 = 1;
constexpr long long kEpilogueBF16 = 0,    // y = bf16(acc)
    kEpilogueF32 = 1,                     // y = acc (fp32 logits / scores)
    kEpilogueResidual = 2,                // y = bf16(residual + acc): the add rounded once
    kEpilogueSwiGLU = 3,                  // rows j and N+j of w: y = bf16(bf16(silu(gate)) * up)
    kEpilogueTop1 = 4;                    // y = per row, one top1 partial of the CTA's COLS columns
constexpr long long kTop1PartBytes = 16;  // one top1 partial (kernels/common.cuh Top1Part asserts it)
// A draft row whose slot id is this is padding: it drafts from the scratch slot (load_tables.cuh).
constexpr int kPaddingSlot = -1;
// A slot's device state (slot_state): {last_pos, first_pos, last_token, filled}, one int4 (keep_state.cuh).
constexpr long long kSlotStateColumns = 4;
constexpr long long kKeepStateThreads = 128;
// What a kernel found wrong in device input the host could not check, as one 8-byte record in host
// memory: the kind in the top byte, an index (a row, a slot) in the next three, a value (a slot id, a token) in the low
// half. 0: nothing found. The runtime reports and clears it at its next call (runtime/runtime.cpp).
constexpr long long kErrorDraftSlot = 1;    // load_tables: row, slot id
constexpr long long kErrorExtendToken = 2;  // gather_taps: slot, token
constexpr long long kErrorDraftRank = 3;    // load_tables: row, first rank
// The highest rank a draft's first step may take (tfe::kMaxFirstRank, include/tfe/draft.h): ranked keeps
// each thread's best kMaxFirstRank + 1 logits.
constexpr int kMaxFirstRank = 7;
}  // namespace kc

namespace kernels {

using namespace kc;  // the kernels name these constants unqualified

TFE_HOST_DEVICE constexpr long long error_record(long long kind, long long row, int value) {
  return (kind << 56) | ((row & 0xffffff) << 32) | static_cast<long long>(static_cast<unsigned>(value));
}

TFE_HOST_DEVICE constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
TFE_HOST_DEVICE constexpr long long min_ll(long long a, long long b) { return a < b ? a : b; }
TFE_HOST_DEVICE constexpr long long max_ll(long long a, long long b) { return a > b ? a : b; }
TFE_HOST_DEVICE constexpr long long pow2_at_most(long long n) {  // n >= 1
  long long p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
TFE_HOST_DEVICE constexpr long long pow2_at_least(long long n) {
  long long p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace kernels
}  // namespace tfe
