// make_plan and the planner's order of work (plan/planner.h): the ring, the attention check, the FP8 forms.
#include "plan/planner.h"

namespace tfe::planning {

Planner::Planner(const HeadHeader& h, const PlanOptions& o, const Tuning& t, std::string sha) {
  validate(h);
  validate(o);
  validate(t);
  cand_k_ = plan_cand_k(h, o);
  check_first_ranks_option(h, o);
  p_.header = h;
  p_.options = o;
  p_.tuning = t;
  p_.head_sha256 = std::move(sha);
}

Plan Planner::run() {
  decide_ring();
  check_attention_fits();
  decide_fp8();
  lay_out_weights();
  lay_out_arena();
  lay_out_host();
  choose("draft tables and outputs",
         "host arena: s1.load_tables reads the tables, the last step's store_outputs writes the outputs and then "
         "host_done, which the host polls",
         "a draft call is then one graph launch and one wait, with no copy-engine transfer (BENCHMARKS.md \"A draft "
         "call without copies\")");
  for (int b : p_.options.buckets) p_.buckets.push_back(draft_bucket(b));
  const int dependent = dependent_streams();
  const bool above = dependent < p_.options.buckets.back() && p_.tuning.dependent_safe_nodes;
  std::string decision = dependent ? fmt::format("draft passes of buckets up to {} streams", dependent) : "";
  if (above)
    decision +=
        fmt::format("{}every node but a GEMV after a grid of {} CTAs or more", dependent ? "; above, " : "", kSmCount);
  if (decision.empty()) decision = "none";
  choose("dependent launch", decision,
         fmt::format("tuning {} = {}, dependent_safe_nodes = {}: a kernel launched early overlaps its "
                     "predecessor's end, except a GEMV whose grid would then land unevenly (BENCHMARKS.md "
                     "\"Dependent launch\")",
                     layer_fp8() ? "dependent_streams_fp8" : "dependent_streams", dependent,
                     p_.tuning.dependent_safe_nodes));
  plan_extend();
  finish();
  return std::move(p_);
}

void Planner::choose(std::string subject, std::string decision, std::string reason) {
  p_.choices.push_back(Choice{std::move(subject), std::move(decision), std::move(reason)});
}

void Planner::decide_ring() {
  const auto& h = p_.header;
  p_.ring_rows = h.window + 1 + p_.options.max_steps;
  choose("ring_rows", std::to_string(p_.ring_rows),
         fmt::format("window + 1 + max_steps = {} + 1 + {}: the last step's W + 1 keys, and one row per draft "
                     "step so that no step overwrites a key a later step of the pass still reads",
                     h.window, p_.options.max_steps));
}

// ring_attention keeps a CTA's K/V ring, chunk scores, per-warp outputs and partial in shared memory, all
// growing with the query heads a kv head (the group) and head_dim. A head whose attention cannot be
// launched on the plan's arch is refused here, by its header fields, rather than at open on the device.
void Planner::check_attention_fits() const {
  const auto& hh = h();
  if (hh.head_dim > kMaxAttentionHeadDim)
    fail("plan: head_dim = {} is above {}, the most ring_attention takes", hh.head_dim, kMaxAttentionHeadDim);
  const int64_t limit = max_smem_per_block(p_.options);
  for (int b : p_.options.buckets) {
    const int64_t split = attention_split(b), smem = attention_smem(split);
    if (smem > limit)
      fail(
          "plan: ring_attention needs {} bytes of shared memory a CTA for heads = {} over kv_heads = {} ({} a "
          "group), head_dim = {} and window = {} (SPLIT {} at {} streams); {} allows at most {}",
          smem, hh.heads, hh.kv_heads, hh.heads / hh.kv_heads, hh.head_dim, hh.window, split, b, p_.options.arch,
          limit);
  }
}

// FP8 or bf16 per linear in use, then per fused matrix (one dtype per matrix).
void Planner::decide_fp8() {
  const auto& h = p_.header;
  const auto in_use = linears_in_use(h);
  if (p_.options.fp8 == Fp8Mode::require) {
    std::string missing;
    for (const auto& l : in_use)
      if (!h.has_fp8(l)) missing += (missing.empty() ? "" : ", ") + l;
    if (!missing.empty())
      fail("plan: fp8 = require, but the head has no FP8 form for {} (convert with FP8 forms, or use fp8 = auto)",
           missing);
  }
  std::map<std::string, bool> wants;
  for (const auto& l : in_use) wants[l] = p_.options.fp8 != Fp8Mode::off && h.has_fp8(l);
  auto group = [&](const std::string& fused, std::vector<std::string> parts) {
    std::string lacking;
    for (const auto& l : parts)
      if (!wants[l]) lacking += (lacking.empty() ? "" : ", ") + l;
    const bool all = lacking.empty();
    std::string joined;
    for (const auto& l : parts) joined += (joined.empty() ? "" : "|") + l;
    choose(fused, fmt::format("fuse {} ({})", joined, all ? "fp8" : "bf16"),
           all ? "one GEMV reads x once for all parts; every part has an FP8 form in use"
               : fmt::format("one GEMV reads x once for all parts; one matrix has one dtype, and {} {} no FP8 "
                             "form in use, so the fused matrix is bf16",
                             lacking, parts.size() > 1 && lacking.find(',') != std::string::npos ? "have" : "has"));
    for (const auto& l : parts) {
      if (wants[l] && !all) wants[l] = false, fp8_dropped_.insert(l);
    }
    fused_fp8_[fused] = all;
  };
  group("wqkv", {"wq", "wk", "wv"});
  group("w_gate_up", {"w_gate", "w_up"});
  for (const auto& l : in_use) {
    std::string reason;
    if (p_.options.fp8 == Fp8Mode::off) {
      reason = "fp8 = off";
    } else if (fp8_dropped_.count(l)) {
      reason = "its FP8 form is left unused: the fused matrix it belongs to is bf16";
    } else if (h.has_fp8(l)) {
      reason = fmt::format("the head holds its FP8 form; fp8 = {}", fp8_mode_name(p_.options.fp8));
    } else {
      reason = "the head holds no FP8 form of it";
    }
    choose(l, wants[l] ? "fp8" : "bf16", reason);
    fp8_[l] = wants[l];
  }
  p_.fp8 = std::any_of(fp8_.begin(), fp8_.end(), [](const auto& kv) { return kv.second; });
}

}  // namespace tfe::planning

namespace tfe {

Plan make_plan(const HeadHeader& header, const PlanOptions& options, const Tuning& tuning, std::string head_sha256) {
  Plan p = planning::Planner(header, options, tuning, std::move(head_sha256)).run();
  validate(p);
  return p;
}

}  // namespace tfe
