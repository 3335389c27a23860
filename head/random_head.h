// Random heads (`tfe-plan random`): every tensor of a header filled from a counter-based generator, so
// that a head is a pure function of (header, seed), whatever the thread count, and fills at memory speed.
// Scales keep a row's activations near unit size through the whole layer (no NaN or inf, and logits that
// spread over a few units, so drafts vary with their input).
#pragma once
#include <cstdint>
#include <vector>

#include <tfe/head_file.h>
#include <tfe/header.h>

namespace tfe {

enum class RandomInit : uint8_t {
  uniform,  // a linear: uniform in [-a, a] with a = std * sqrt(3)
  norm,     // an RMSNorm weight: 1 + uniform in [-std * sqrt(3), std * sqrt(3)]
  normal,   // an embedding: approximately N(0, std^2) (Irwin-Hall of four uniforms)
  d2t,      // draft_vocab distinct target ids, sorted, chosen by the seed; stored as target - draft id
};

// How one tensor of a random head is drawn. `std` is the standard deviation of the random part.
struct RandomTensor {
  TensorSpec spec;
  RandomInit init;
  float std = 0.0f;
  bool operator==(const RandomTensor&) const = default;
};

// Standard deviation of an output head's rows, in units of 1/sqrt(fan-in): logits of a unit-RMS input
// then have this standard deviation, so the softmax is neither flat nor one-hot.
inline constexpr float kRandomLogitStd = 2.0f;
// Noise of RMSNorm weights around 1.
inline constexpr float kRandomNormStd = 0.05f;

// The bf16 and int32 tensors of a head (expected_tensors without FP8 forms), in that order, with their
// draws: linears std 1/sqrt(fan-in), output heads (lm_head, lr_b, target_head) kRandomLogitStd/sqrt(fan-in),
// norms 1 + noise, embed N(0, 1).
std::vector<RandomTensor> random_tensor_table(const HeadHeader& h);

// A random head: the header (validated) with its tensors drawn by `seed`; with `fp8`, every linear in use
// also carries its FP8 form (header.fp8 lists them). `threads` 0: one per hardware thread.
HeadWriter random_head(const HeadHeader& h, uint64_t seed, bool fp8, int threads = 0);

}  // namespace tfe
