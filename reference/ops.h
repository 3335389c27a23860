// The head's operations on the CPU, exactly as docs/head.md "Numerics" states them: bf16 storage between
// operations, fp32 for every sum, norm statistic, softmax and logit. The GPU kernels are tested against
// these functions and may differ only in the order of their sums.
//
// Summation order (the one freedom the spec leaves). Every dot product and sum of squares here is the
// lane sum: element i goes to fp32 lane i mod kSumLanes, each lane adds its elements in ascending i,
// and the lanes are combined pairwise ((0+1)+(2+3))+... . The compiler vectorizes that loop without
// reassociating anything, so the result is the same for any build and any thread count. Softmax
// denominators are sequential fp32 sums in ascending key (or candidate) order.
//
// All functions are pure: they read spans and write spans of the documented sizes, and throw tfe::Error
// on a size mismatch. `threads` splits work over output rows only; every output is computed by one
// thread in one fixed order, so results never depend on the count.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tfe/header.h>
#include "core/numeric.h"
#include "head/numerics.h"

namespace tfe::ref {

inline constexpr int kSumLanes = 16;

// Lane sums (see above) of fp32(a_i) * fp32(b_i).
float dot(const float* a, const float* b, int64_t n);
float dot(const bf16_bits* a, const float* b, int64_t n);
float dot(const bf16_bits* a, const bf16_bits* b, int64_t n);
float dot(const uint8_t* fp8_e4m3, const float* b, int64_t n);

// Widens bf16 to fp32 (exact).
std::vector<float> widen(std::span<const bf16_bits> x);

// RMSNorm of each row of x ([rows, n], n = w.size()):
//   y = bf16( w * bf16( x * r ) ),  r = 1 / sqrtf( sum(x^2) / n + eps )  (sum: lane sum in fp32).
void rmsnorm(std::span<const bf16_bits> x, std::span<const bf16_bits> w, float eps, std::span<bf16_bits> y);

// A linear's weights [out, in] in one of the file's two forms: bf16, or FP8 e4m3 with a per-row fp32
// scale. acc_j(x) = sum_k fp32(w_jk) * x_k, or scale_j * sum_k fp32(q_jk) * x_k (the scale applied to
// the finished sum, docs/head.md "FP8").
struct Linear {
  std::string name;
  int64_t out = 0, in = 0;
  const bf16_bits* w = nullptr;  // bf16 form
  const uint8_t* q = nullptr;    // FP8 form
  const float* scale = nullptr;  // FP8 form: [out]

  static Linear bf16(std::string name, std::span<const bf16_bits> w, int64_t out, int64_t in);
  static Linear fp8(std::string name, std::span<const uint8_t> q, std::span<const float> scale, int64_t out,
                    int64_t in);
  bool is_fp8() const { return q != nullptr; }
  float acc(int64_t j, const float* x) const;  // acc_j for one fp32 row x [in]
};

// x [rows, in] -> y [rows, out]. Three output forms:
void linear(const Linear& w, std::span<const bf16_bits> x, std::span<bf16_bits> y, int threads = 1);  // bf16(acc)
void linear_f32(const Linear& w, std::span<const bf16_bits> x, std::span<float> y, int threads = 1);  // acc (logits)
// Residual form, rounded once: y = bf16( float(res) + acc ), res [rows, out].
void linear_residual(const Linear& w, std::span<const bf16_bits> x, std::span<const bf16_bits> res,
                     std::span<bf16_bits> y, int threads = 1);

// SiLU in fp32: g / (1 + expf(-g)).
float silu(float g);
// SwiGLU: a = bf16(silu(gate)), m = bf16(a * up), elementwise over equal sizes.
void swiglu(std::span<const bf16_bits> gate, std::span<const bf16_bits> up, std::span<bf16_bits> m);

// Rotate-half RoPE of each head of x ([heads, hd]) at position pos: angle_i = float(pos) * inv_freq_i
// (fp32), pairs (i, i + hd/2): y_i = x_i cos - x_{i+hd/2} sin, y_{i+hd/2} = x_{i+hd/2} cos + x_i sin,
// each rounded once to bf16.
void rope(std::span<const bf16_bits> x, int64_t hd, int32_t pos, std::span<const float> inv_freq,
          std::span<bf16_bits> y);

// Grouped-query attention of one row over n_keys keys (ascending positions):
// q [nh, hd]; k, v [n_keys, nkv, hd]; o [nh, hd]. Query head j reads kv head j / (nh / nkv).
// s_t = dot(q, k_t) * scale (fp32), p_t = expf(s_t - max) / sum_t expf(s_t - max) (sequential sum),
// o = bf16( sum_t p_t v_t ) (sequential over t).
void attention(std::span<const bf16_bits> q, std::span<const bf16_bits> k, std::span<const bf16_bits> v, int64_t nh,
               int64_t nkv, int64_t hd, std::span<bf16_bits> o);

// argmax with ties to the lower id; confidence = softmax at the argmax = 1 / sum_i expf(l_i - max)
// (sequential sum in ascending i).
struct Top1 {
  int64_t id = 0;
  float confidence = 0.0f;
};
Top1 top1(std::span<const float> logits);
// The logit of rank `rank` (0: top1's), equal logits ranked by the lower id; confidence = softmax there,
// expf(l - max) / sum_i expf(l_i - max), the sum as top1's (rank 0: top1 itself).
Top1 ranked(std::span<const float> logits, int rank);

// The k largest scores, best first; equal scores in ascending id order.
std::vector<int32_t> topk(std::span<const float> scores, int k);

// Two-stage rescoring: exact[c] is the exact fp32 logit of candidate c whose target id is target[c].
// Picks the largest exact logit, ties to the lower target id; confidence = softmax over the candidates'
// exact logits at the pick (sequential sum in candidate order).
struct Rescored {
  int64_t index = 0;      // into the candidate list
  int32_t target_id = 0;  // target[index]
  float confidence = 0.0f;
};
Rescored rescore(std::span<const float> exact, std::span<const int32_t> target);

}  // namespace tfe::ref
