// The options of a plan: what a head's plan is made for. Read by the planner (plan/), the deploy step
// (tfe-plan compile) and Runtime::open.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tfe {

enum class Fp8Mode : uint8_t { automatic, off, require };  // YAML / CLI: auto, off, require
std::string_view fp8_mode_name(Fp8Mode m);
Fp8Mode fp8_mode_from_name(std::string_view s);  // throws naming the value

struct PlanOptions {
  std::vector<int> buckets = {1, 2, 4, 8, 16};  // stream buckets, ascending, each 1..16
  int max_steps = 8;                            // 1..16
  Fp8Mode fp8 = Fp8Mode::automatic;
  std::string arch = "sm_90";
  int max_slots = 64;      // sequences the runtime holds; one scratch slot is added for padding
  int extend_rows = 1024;  // rows one extend chunk takes; larger extends run in chunks
  // Draft passes of buckets up to this many streams launch their kernels dependent (Node::dependent);
  // 0: none. 4 measured best on the H200 (BENCHMARKS.md, "Programmatic dependent launch" and the A/B of
  // 668a17b): faster at 1, 2 and 4 streams, slower at 8 and 16.
  int dependent_streams = 4;  // 0..16
  // The same limit for a plan whose layer linears (wqkv, wo, w_gate_up, w_down) all run in FP8, in place
  // of dependent_streams. 0 measured best there with dependent_safe_nodes (BENCHMARKS.md, "Dependent launch
  // above dependent_streams"): every node but a GEMV after a full grid dependent in every bucket was
  // 1.2-3.1 us a step faster at 4-16 streams than every node but an FP8 GEMV after a GEMV (the limit 16
  // before), and within 0.3 us (llama3) or 1 us faster (tfe-two-stage) at 1-2.
  int dependent_streams_fp8 = 0;  // 0..16
  // In the buckets above that limit, the nodes whose early start cannot unbalance a GEMV's grid still launch
  // dependent: every node but a GEMV right after a grid of at least one CTA an SM (kSmCount), whose CTAs would
  // land unevenly on the slots that grid's last CTAs leave. Measured on the H200 (BENCHMARKS.md, "Dependent
  // launch above dependent_streams"): llama3 bf16 6.4 us a step faster at 8 streams, 2.4 at 16. false: no
  // node of those buckets launches dependent (FP8 layers, at dependent_streams_fp8 0: none at all).
  bool dependent_safe_nodes = true;
  // The draft's RoPE in the wqkv GEMV's epilogue (kernel gemv_rope_kv) where the head allows it (no
  // qk_norm, head_dim a multiple of 16); false: the wqkv gemv and a qk_rope_kv node, as heads with
  // qk_norm run. Both give the same bits.
  bool rope_in_wqkv = true;
  // A narrow output's FP8 GEMV (fewer than 64 column tiles of 16, e.g. two_stage's lr_a) as gemv_cluster,
  // each tile's K split over a cluster of CTAs, where the arch has clusters and K has steps enough; false:
  // gemv. (bf16 keeps gemv: measured slower as gemv_cluster.)
  bool gemv_cluster = true;
  // Weight matrices read only by GEMVs in the tiled layout (Layout::tiled, plan/weight_layout.h) where
  // their shape allows; false: every matrix row-major, as in the head file. Both give the same bits.
  bool tiled_weights = true;
  // ring_attention's key split chosen per bucket: fewer, longer chunks where a bucket's grid would exceed
  // one wave (measured 2.5-4 us a step faster at 16 streams). The split sets the order of attention's fp32
  // sums, so a slot's drafts may then differ between buckets at a near-tie. false: every bucket takes the
  // largest bucket's split, and a slot drafts the same tokens in every bucket.
  bool attention_split_per_bucket = true;
  bool operator==(const PlanOptions&) const = default;
};

}  // namespace tfe
