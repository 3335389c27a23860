// The planner's finish (plan/planner.h): launches, dependent launch, the specs, and the choices the passes
// imply.
#include <algorithm>

#include "plan/planner.h"

namespace tfe::planning {

void Planner::finish() {
  const auto& hh = h();
  const std::string B = fmt::format("{}", p_.options.buckets.back());
  const std::string draft_reason =
      fmt::format("at most {} rows a step: memory-bound, a GEMV streams each weight byte once", B);
  for (auto l : {"wqkv", "wo", "w_gate_up", "w_down"}) choose(fmt::format("{} draft", l), "gemv", draft_reason);
  if (rope_in_wqkv()) {
    choose("rope draft", "in the wqkv gemv's epilogue (gemv_rope_kv)",
           "no qk_norm and head_dim a multiple of 16: the gemv's column tiles hold whole rotate-half pairs, so its "
           "epilogue writes q and the ring's K and V, with no qkv buffer or qk_rope_kv node (BENCHMARKS.md \"Tiled "
           "weights and GEMV choices\")");
  } else {
    std::string reason = "tuning rope_in_wqkv = false";
    if (p_.tuning.rope_in_wqkv && hh.qk_norm)
      reason =
          "qk_norm needs a head's whole sum of squares, which spans several of the gemv's column tiles, "
          "before any element is rotated";
    else if (p_.tuning.rope_in_wqkv)
      reason = fmt::format(
          "head_dim = {} is not a multiple of 16: a gemv column tile of 16 does not hold whole "
          "rotate-half pairs",
          hh.head_dim);
    choose("rope draft", "qk_rope_kv node after the wqkv gemv", reason);
  }
  // One line per run of buckets with the same split, e.g. "ring_attention split 8 (streams 1..8), 4 (16)".
  std::vector<std::pair<int64_t, std::vector<int>>> splits;
  for (int b : p_.options.buckets) {
    const int64_t s = attention_split(b);
    if (splits.empty() || splits.back().first != s) splits.push_back({s, {}});
    splits.back().second.push_back(b);
  }
  std::string decision = "ring_attention split", keys;
  for (size_t i = 0; i < splits.size(); ++i) {
    const auto& [s, bs] = splits[i];
    const std::string streams =
        bs.size() == 1 ? fmt::format("{}", bs.front()) : fmt::format("{}..{}", bs.front(), bs.back());
    decision += fmt::format("{} {}", i ? "," : "", s);
    if (splits.size() > 1) decision += fmt::format(" (streams {})", streams);
    keys += fmt::format("{}{}{}", i ? ", " : "up to ", (hh.window + s) / s,
                        splits.size() > 1 ? fmt::format(" keys a CTA at streams {}", streams) : " keys a CTA");
  }
  const bool same = p_.options.attention_split == AttentionSplit::same_drafts;
  choose("attention draft", decision,
         fmt::format("{} of a {}-key window: {}{} (BENCHMARKS.md \"Attention split\")", keys, hh.window + 1,
                     splits.size() == 1 && splits.front().first == 1
                         ? fmt::format("one CTA a (kv head, row), since a chunk takes at least {} keys and "
                                       "clusters need sm_90",
                                       kAttnMinKeysPerCta)
                         : fmt::format("each (kv head, row) one cluster of SPLIT CTAs, fewer where kv_heads x "
                                       "streams x SPLIT would exceed one wave of {} CTAs",
                                       kAttnWaveCtas),
                     same ? "; attention_split same_drafts: the largest bucket's split in every bucket, so a slot "
                            "drafts the same tokens in every bucket"
                     : splits.size() > 1
                         ? "; attention_split per_bucket: the split orders the fp32 sums, so a slot's drafts may "
                           "differ between buckets at a near-tie"
                         : ""));
  if (hh.head_type == HeadType::dense) {
    const int64_t b0 = p_.options.buckets.front(), b1 = p_.options.buckets.back();
    choose("lm_head draft", "gemv top1 partials + top1 join",
           fmt::format("the gemv's epilogue writes one (max, lowest index, sum exp) partial a row per column tile, "
                       "{} at bucket {} .. {} at bucket {}, which top1 joins in order, so the logits never reach "
                       "memory (BENCHMARKS.md \"Tiled weights and GEMV choices\")",
                       top1_parts(b0), b0, top1_parts(b1), b1));
    if (p_.options.first_ranks)
      choose("lm_head step 1", "gemv f32 logits + ranked",
             "first_ranks: a row may take another rank than the best, which the tiles' top-1 records cannot name; "
             "the step's logits go to memory whole and one CTA a row picks the row's rank (load_tables copies the "
             "ranks beside the slot ids)");
  } else {
    choose("lr_a draft", "gemv", draft_reason);
    choose("lr_b draft", "gemv f32 scores + topk",
           fmt::format("one cluster of {} CTAs a row selects the best {} of {} scores, agreeing on each radix "
                       "pass through distributed shared memory",
                       topk_split(), cand_k_, hh.draft_vocab));
    choose("target_head draft", "rescore",
           fmt::format("only the {} candidate rows of target_head are read a row, a warp each, and the last CTA "
                       "to arrive joins",
                       cand_k_));
  }
  std::vector<std::string> wide;
  for (const auto& [uri, spec] : specs_) {
    if (!is_gemv(spec)) continue;
    const KernelSpec g = gemv_equivalent(spec);
    if (g.constant("COLS") == 32)
      wide.push_back(fmt::format("K {} N {} ROWS {}", g.constant("K"), g.constant("N"), g.constant("ROWS")));
  }
  choose("gemv columns per CTA", wide.empty() ? "16" : fmt::format("32 at {}; 16 elsewhere", fmt::join(wide, ", ")),
         fmt::format("32 above 8 rows where K >= {} and the output is not narrow, in bf16 only where {} CTAs "
                     "remain, halving x's traffic per weight byte (BENCHMARKS.md \"Tiled weights and GEMV "
                     "choices\")",
                     kGemvWideMinK, kGemvWideCtas));
  // Shapes whose CTAs run several column tiles (a short K), each once whatever its ROWS and COLS.
  std::set<std::string> multi;
  for (const auto& [uri, spec] : specs_) {
    if (!is_gemv(spec) || gemv_tiles_per_cta(spec) == 1) continue;
    const KernelSpec g = gemv_equivalent(spec);
    multi.insert(fmt::format("{} at K {} N {} {}", gemv_tiles_per_cta(g), g.constant("K"), g.constant("N"),
                             g.constant("WEIGHT") == kc::kWeightFP8 ? "fp8" : "bf16"));
  }
  choose("gemv column tiles per CTA", multi.empty() ? "1" : fmt::format("{}; 1 elsewhere", fmt::join(multi, ", ")),
         "a tile's K is split over 8 warps (16 for a narrow output), over fewer where a warp would get under 4 "
         "K steps, the spare warps taking more tiles so that a short K's loads still pipeline (BENCHMARKS.md "
         "\"Tiled weights and GEMV choices\")");
  std::set<std::string> clustered;
  for (const auto& [uri, spec] : specs_)
    if (spec.kernel == "gemv_cluster")
      clustered.insert(fmt::format("{} at K {} N {} {}", spec.constant("CSPLIT"), spec.constant("K"),
                                   spec.constant("N"), spec.constant("WEIGHT") == kc::kWeightFP8 ? "fp8" : "bf16"));
  std::string unclustered = "no FP8 output narrow enough";
  if (!p_.tuning.gemv_cluster)
    unclustered = "tuning gemv_cluster = false";
  else if (max_cluster_ctas(p_.options) == 1)
    unclustered = fmt::format("{} has no clusters", p_.options.arch);
  choose("gemv cluster split", clustered.empty() ? "1" : fmt::format("{}; 1 elsewhere", fmt::join(clustered, ", ")),
         clustered.empty() ? unclustered
                           : fmt::format("a narrow FP8 output's few column tiles leave most SMs idle, so each "
                                         "tile's K is split over a cluster, up to {} CTAs in all, joined in rank "
                                         "order (BENCHMARKS.md \"Tiled weights and GEMV choices\")",
                                         kGemvClusterCtas));
  choose("weight layout", tiled_.empty() ? "rows" : fmt::format("tiled: {}", fmt::join(tiled_, ", ")),
         fmt::format("a tiled matrix's warp loads read 512 consecutive bytes (BENCHMARKS.md \"Tiled weights and "
                     "GEMV choices\"); row-major: {}",
                     rows_.empty() ? "none" : fmt::format("{}", fmt::join(rows_, ", "))));
  for (auto& [uri, spec] : specs_) p_.specs.push_back(spec);  // std::map: sorted by uri
  if (gemms_ == 0) {
    p_.cublaslt_workspace = 0;
    choose("cublaslt_workspace", "0", "no node uses cuBLASLt");
  }
  p_.device_bytes = p_.weights.bytes + p_.arena.bytes + p_.cublaslt_workspace;
}

}  // namespace tfe::planning
