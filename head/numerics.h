// The head's numbers that the CPU reference, the planner and the runtime must share bit for bit: RoPE's
// frequencies (uploaded as the `rope_inv_freq` weight) and attention's score scale (a kernel argument).
#pragma once
#include <cstdint>
#include <vector>

#include <tfe/header.h>

namespace tfe {

// RoPE frequencies [head_dim / 2], fp32: inv_freq_i = 1 / theta^(2i / hd) (as HF transformers computes
// theta^(-2i/hd) in fp32), then, when rope.llama3, HF's `_compute_llama3_parameters` in fp32: wavelengths
// above original_max_positions / low_freq_factor are divided by `factor`, those below
// original_max_positions / high_freq_factor kept, and those between interpolated smoothly.
std::vector<float> rope_inv_freq(const HeadHeader& h);
// Attention score scale 1 / sqrt(hd) in fp32; the planner passes this same value to the kernels.
float attention_scale(int64_t hd);
// The candidates a two_stage head rescores per row: the header's cand_k where `requested` is 0, else
// `requested` (PlanOptions::cand_k, ReferenceOptions::cand_k), refused for a dense head or past draft_vocab.
int rescored_candidates(const HeadHeader& h, int requested);

}  // namespace tfe
