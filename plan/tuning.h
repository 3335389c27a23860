// The planner's measured speed choices, apart from PlanOptions: none changes what a plan holds or drafts
// (gemv_cluster reorders one narrow output's fp32 sum), so the engine's API leaves them out; tests,
// tfe-plan and tfe-bench set them (runtime/testing.h). The defaults are what measured fastest; the
// measurements are in BENCHMARKS.md.
#pragma once

namespace tfe {

struct Tuning {
  // Draft passes of buckets up to this many streams launch every node dependent but an FP8 GEMV right
  // after a GEMV; 0..16, 0: none (BENCHMARKS.md "Dependent launch").
  int dependent_streams = 4;
  // In place of dependent_streams where wqkv, wo, w_gate_up and w_down all run in FP8; 0..16
  // (BENCHMARKS.md "Dependent launch").
  int dependent_streams_fp8 = 0;
  // Above that limit, every node but a GEMV right after a grid of one CTA an SM or more launches
  // dependent; false: none there (BENCHMARKS.md "Dependent launch").
  bool dependent_safe_nodes = true;
  // The draft's RoPE and ring write in the wqkv GEMV's epilogue where the head has no qk_norm and head_dim
  // is a multiple of 16; same bits (BENCHMARKS.md "Tiled weights and GEMV choices").
  bool rope_in_wqkv = true;
  // A narrow FP8 output's GEMV with each column tile's K over a cluster of CTAs, where the arch has
  // clusters (BENCHMARKS.md "Tiled weights and GEMV choices").
  bool gemv_cluster = true;
  // Matrices only GEMVs read in the tiled layout (kernels/weight_layout.h) where their shape allows; same
  // bits (BENCHMARKS.md "Tiled weights and GEMV choices").
  bool tiled_weights = true;
  bool operator==(const Tuning&) const = default;
};

// Checks the limits (dependent_streams and dependent_streams_fp8 0..16); throws naming the field.
void validate(const Tuning& tuning);

}  // namespace tfe
