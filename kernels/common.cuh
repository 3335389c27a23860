// Shared pieces of the tfe kernels: parameter slots, bf16 / fp8 unpacking and fixed-order warp reductions
// (the enumerated constants and the integer helpers are constants.h's, which the host reads too). Compiled
// by NVRTC: only the CUDA headers and each other.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "constants.h"

namespace tfe {
namespace kernels {

// An f32 parameter in the low half of its 8-byte slot, so every slot of a params struct is 8 bytes and
// the runtime packs them by index.
struct alignas(8) F32Slot {
  float v;
};

typedef __nv_bfloat16 bf16;

// Programmatic dependent launch (sm_90). A kernel launched with the programmatic-serialization attribute
// may start while its predecessor in the stream is still running; it must not read anything an earlier
// node wrote, nor write anything, before `wait_for_predecessors()` returns (the predecessor has then
// completed and its writes are visible). Weights are read-only for a pass, so a GEMV may start loading
// them before the wait. `release_dependents()` lets the next kernel launch once every CTA of this one
// has called it or exited; without the attribute both are no-ops.
__device__ __forceinline__ void wait_for_predecessors() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void release_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// The first statement of every kernel but gemv: it reads earlier nodes' outputs from the start, and it is
// short, so the next kernel may launch (and start loading its weights) at once.
__device__ __forceinline__ void start_after_predecessors() {
  wait_for_predecessors();
  release_dependents();
}

// 16 bytes global -> shared, `bytes` 0 writing zeros (a row past its end, a key past the chunk). Data read
// once goes through L2 only (.cg: gemv's weights, attention's K/V); data every CTA reads may stay in L1
// (.ca: gemv's x). A thread that reads back only what its own copies wrote needs no barrier, only the wait.
template <bool L1>
__device__ __forceinline__ void copy_async_16(unsigned dst, const void* src, unsigned bytes) {
  if constexpr (L1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
  }
}
// 4 bytes global -> shared (cp.async takes 4 and 8 bytes only through L1), `bytes` 0 writing zeros.
__device__ __forceinline__ void copy_async_4(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

// The join of a row split over CTAs (topk, rescore): each CTA writes its partials, then takes an
// integer ticket from the row's counter; the CTA that draws the last ticket returns true in every thread,
// reads the partials in their fixed order (with __ldcg: another SM wrote them) and joins them, so the
// result does not depend on which CTA joins. It also returns the counter to zero for the next pass.
// Call it from every thread of the CTA. Thread 0 alone fences: the barrier orders the other threads'
// writes before its release fence, and its acquire fence before their reads (fences are cumulative).
__device__ __forceinline__ bool last_to_arrive(int* arrivals, int ctas) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // release: this CTA's partials are visible device-wide before its ticket
    last = atomicAdd(arrivals, 1) == ctas - 1;
    if (last) {
      *arrivals = 0;
      __threadfence();  // acquire: the other CTAs' partials are read after their tickets
    }
  }
  __syncthreads();
  return last;
}

// Thread-block clusters (sm_90): a kernel declares its cluster with TFE_CLUSTER(n) along x; below sm_90 the
// planner gives such kernels one CTA a cluster and the macro declares none.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TFE_CLUSTER(n)
#else
#define TFE_CLUSTER(n) __cluster_dims__(n, 1, 1)
#endif
// All threads of all CTAs of the cluster: release this CTA's shared-memory writes, acquire the peers'.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of `local` (this CTA's shared memory) in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ unsigned peer_address(const void* local, unsigned rank) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(rank));
  return remote;
}
__device__ __forceinline__ float load_peer(const float* local, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(peer_address(local, rank)) : "memory");
  return v;
}
__device__ __forceinline__ unsigned load_peer(const unsigned* local, unsigned rank) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(peer_address(local, rank)) : "memory");
  return v;
}
// Four consecutive words from a 16-byte aligned `local` in cluster CTA `rank`.
__device__ __forceinline__ uint4 load_peer_v4(const unsigned* local, unsigned rank) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(peer_address(local, rank))
               : "memory");
  return v;
}

// -inf without <cmath> (NVRTC has no INFINITY).
__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

// bf16 -> fp32 is exact: the bf16 bits are the high half of the float.
__device__ __forceinline__ float bf16_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf16(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ unsigned bf16_bits(float v) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
}
// Two floats rounded to bf16 and packed low-first, as a bf16x2 word stores them.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// Two e4m3 bytes (the low 16 bits of `u`) -> two bf16 packed low-first, exact: one packed cvt to f16x2, two
// f16 -> f32, and one byte permute that keeps the high halves (every e4m3 value is a bf16 value, so
// dropping the low halves loses nothing). NaN codes stay NaN. rescore's widening, and the FP8 GEMV's
// where it does not place the bits (gemv.cuh, fp8x4_widen).
__device__ __forceinline__ unsigned fp8x2_to_bf16x2(unsigned short u) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return __byte_perm(__float_as_uint(f.x), __float_as_uint(f.y), 0x7632);
}

// Butterfly reductions: every lane ends with the same value, combined in the same order every run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Inclusive prefix sum over the lanes of a warp (lane l gets the sum of lanes 0..l): integer, so exact.
__device__ __forceinline__ unsigned warp_inclusive_sum(unsigned v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

// Sum over a CTA of THREADS threads (its launch's block): warp butterflies, then the warp totals in warp
// order. The warp count is a constant so that the totals' shared-memory loads issue together rather than
// one per add; the adds keep warp order, so the bits are those of a loop over the warps. `scratch` holds
// 32 floats; every thread gets the total. Ends with a barrier, so `scratch` may be reused right after.
template <int THREADS>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  constexpr int WARPS = (THREADS + 31) / 32;
  static_assert(WARPS <= 32, "scratch holds 32 warp totals");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) t += scratch[w];
  __syncthreads();
  return t;
}

// An argmax candidate: (value, index) with ties to the lower index. NaN-free inputs assumed.
struct ArgMax {
  float v;
  int i;
};
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, a.v, o);
    const int i = __shfl_xor_sync(0xffffffffu, a.i, o);
    if (better(v, i, a.v, a.i)) a = ArgMax{v, i};
  }
  return a;
}

// The argmax (ties: lower index) of `best` over a CTA of THREADS threads, broadcast to every thread.
// `sv`, `si`: 32 entries each. A constant warp count, as in block_sum.
template <int THREADS>
__device__ __forceinline__ ArgMax block_argmax(ArgMax best, float* sv, int* si) {
  constexpr int WARPS = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  best = warp_argmax(best);
  if (lane == 0) {
    sv[warp] = best.v;
    si[warp] = best.i;
  }
  __syncthreads();
#pragma unroll
  for (int w = 0; w < WARPS; ++w)
    if (better(sv[w], si[w], best.v, best.i)) best = ArgMax{sv[w], si[w]};
  __syncthreads();
  return best;
}

// A draft step's result for row r, as top1, ranked and rescore end: the target id and its confidence into
// column `step` - 1 of the outputs [rows, max_steps], and the id as the next step's token.
__device__ __forceinline__ void store_step(int* out_token, float* out_conf, int* next_token, long long r,
                                           long long max_steps, long long step, int target, float conf) {
  const long long at = r * max_steps + (step - 1);
  out_token[at] = target;
  out_conf[at] = conf;
  next_token[r] = target;
}

// One partial of a row's vocabulary top-1 (gemv's kEpilogueTop1 writes them, top1 joins them): over the
// columns of one gemv CTA, the largest logit, the lowest column at it, and sum exp(l - max). One 16-byte
// record, so that a partial is one store and one load; `pad` is written as zero.
struct alignas(16) Top1Part {
  float max;
  int idx;
  float sum;
  float pad;
};
static_assert(sizeof(Top1Part) == kTop1PartBytes, "kc::kTop1PartBytes sizes the planner's top1_part buffer");

// RMSNorm scale of a row: 1 / sqrt(mean(x^2) + eps), with an IEEE square root and division (no rsqrt
// approximation) so that it matches the CPU reference's rounding.
__device__ __forceinline__ float rms_inv(float sum_sq, long long width, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(width) + eps);
}
// rms(x) = bf16(w * bf16(x * inv)).
__device__ __forceinline__ float rms_apply(float x, float inv, float w) { return round_bf16(w * round_bf16(x * inv)); }

}  // namespace kernels
}  // namespace tfe
