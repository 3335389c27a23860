// The options of a plan: what a head's plan is made for, each field changing the drafts or what the
// runtime holds. How fast a plan runs is the planner's measured tuning (plan/tuning.h), outside this API.
// Read by the planner (plan/), the deploy step (tfe-plan compile) and Runtime::open.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tfe {

enum class Fp8Mode : uint8_t { automatic, off, require };  // YAML / CLI: auto, off, require
std::string_view fp8_mode_name(Fp8Mode m);
Fp8Mode fp8_mode_from_name(std::string_view s);  // throws naming the value

// How ring_attention's key split, which orders attention's fp32 sums, is chosen (BENCHMARKS.md "Attention
// split"). per_bucket: each bucket's fastest split, so a slot's drafts may differ between buckets at a
// near-tie. same_drafts: the largest bucket's split in every bucket, so a slot drafts the same tokens
// whichever bucket its call falls in.
enum class AttentionSplit : uint8_t { per_bucket, same_drafts };  // YAML / CLI: per_bucket, same_drafts
std::string_view attention_split_name(AttentionSplit s);
AttentionSplit attention_split_from_name(std::string_view s);  // throws naming the value

struct PlanOptions {
  std::vector<int> buckets = {1, 2, 4, 8, 16};  // stream buckets, ascending, each 1..16
  int max_steps = 8;                            // 1..16
  Fp8Mode fp8 = Fp8Mode::automatic;
  std::string arch = "sm_90";
  int max_slots = 64;      // sequences the runtime holds; one scratch slot is added for padding
  int extend_rows = 1024;  // rows one extend chunk takes; larger extends run in chunks
  AttentionSplit attention_split = AttentionSplit::per_bucket;
  // The candidates a two_stage head rescores per row: 0 takes the header's cand_k; else 1..512 and at most
  // the header's draft_vocab. A dense head has no candidates and refuses a nonzero value.
  int cand_k = 0;
  // Step 1 may draft, per slot, the token of another rank than the best (Runtime::draft's first_ranks, the
  // branches of a draft tree): its lm_head writes every logit, which `ranked` orders. A dense head's only.
  bool first_ranks = false;
  bool operator==(const PlanOptions&) const = default;
};

// Checks options against their limits (buckets ascending, unique, 1..16; max_steps 1..16; max_slots
// 1..4096; extend_rows 16..8192; cand_k 0..512; arch sm_<digits>); throws naming the option, its value and
// the limit. The planner checks the same (plan/plan.cpp).
void validate(const PlanOptions& options);

}  // namespace tfe
