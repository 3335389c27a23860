// The planner's choice of each kernel's shape: the extend's K/V GEMM, attention's split and chunks, topk,
// the gemv's clusters, columns and epilogues, the vocabulary head, dependent launch.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>
#include <utility>

#include "core/error.h"
#include "kernels/registry.h"
#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "head/presets.h"
#include "plan_cases.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::golden_heads;
using tfe::test::golden_options;

TEST_CASE(
    "make_plan: the extend's K/V GEMM reads the contiguous wk|wv rows of wqkv, or their row-major copy wkv "
    "beside a tiled bf16 wqkv") {
  Tuning rows_only;
  rows_only.tiled_weights = false;
  for (const auto& [name, h] : golden_heads())
    for (const Tuning& t : {Tuning{}, rows_only}) {
      CAPTURE(name);
      CAPTURE(t.tiled_weights);
      const Plan p = make_plan(h, golden_options(), t);
      const auto kv =
          std::find_if(p.extend.begin(), p.extend.end(), [](const Node& n) { return n.name == "extend.kv"; });
      REQUIRE(kv != p.extend.end());
      const Buffer& wqkv = p.weights.at("wqkv");
      const int64_t q_rows = h.heads * h.head_dim, k = 2 * h.hidden;
      const Buffer* wkv = p.weights.find("wkv");
      // The copy exists exactly where the bf16 wqkv is tiled: wk's rows and wv's, row-major.
      CHECK((wkv != nullptr) == (wqkv.dtype == DType::BF16 && wqkv.layout == Layout::tiled));
      CHECK((wqkv.layout == Layout::tiled) == (t.tiled_weights && q_rows % 16 == 0));
      if (wqkv.dtype == DType::BF16) {
        CHECK(kv->kind == Node::Kind::gemm);
        CHECK(kv->gemm.n == 2 * h.kv_heads * h.head_dim);
        if (wkv) {
          CHECK(wkv->layout == Layout::rows);
          CHECK(wkv->from == std::vector<std::string>{"wk", "wv"});
          CHECK(kv->gemm.w == "wkv");
          CHECK(kv->gemm.w_offset == 0);
          CHECK(kv->gemm.n * kv->gemm.k * 2 == wkv->bytes);
        } else {
          CHECK(kv->gemm.w == "wqkv");
          CHECK(kv->gemm.w_offset == q_rows * k * 2);
          CHECK(kv->gemm.w_offset + kv->gemm.n * kv->gemm.k * 2 == wqkv.bytes);
        }
      } else {
        CHECK(kv->kind == Node::Kind::kernel);
        CHECK(p.spec(kv->spec).constant("ROWS") == 16);
        CHECK(kv->args[0].byte_offset == q_rows * k);
        CHECK(kv->args[1].byte_offset == q_rows * 4);
      }
      // Each tap norm works in place on its column slice of the uploaded taps.
      for (const auto& n : p.extend)
        if (n.name.starts_with("extend.tap_norm.")) {
          const int64_t i = std::stoll(n.name.substr(16));
          CHECK(n.args[0].byte_offset == i * h.target_hidden * 2);
          CHECK(n.args[3].byte_offset == n.args[0].byte_offset);
          CHECK(n.args[1].i == static_cast<int64_t>(h.taps.size()) * h.target_hidden);
        }
    }
}

TEST_CASE("make_plan: attention splits the window over a cluster of up to 8 CTAs, from sm_90 on") {
  struct Case {
    const char* preset;
    int64_t window;
    std::string arch;
    int64_t split;
  };
  // SPLIT = min(8, ceil((W + 1) / 32)): chunks of at least 32 keys, at most the portable cluster size.
  for (const Case& c : {Case{"llama3-8b-eagle3", 511, "sm_90", 8}, Case{"tiny", 15, "sm_90", 1},
                        Case{"tiny", 31, "sm_90", 1}, Case{"tiny", 32, "sm_90", 2}, Case{"tiny", 128, "sm_90", 5},
                        Case{"tiny", 255, "sm_90", 8}, Case{"tiny", 511, "sm_90", 8},
                        Case{"llama3-8b-eagle3", 511, "sm_89", 1}, Case{"llama3-8b-eagle3", 511, "sm_100", 8}}) {
    CAPTURE(c.preset);
    CAPTURE(c.window);
    CAPTURE(c.arch);
    HeadHeader h = preset_header(c.preset);
    h.window = c.window;
    PlanOptions o = golden_options();
    o.arch = c.arch;
    o.buckets = {1, 2, 4, 8};  // at most one wave of CTAs: the first split holds (the next test takes more)
    const Plan p = make_plan(h, o);
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes) {
        if (!n.name.ends_with(".attention")) continue;
        CAPTURE(n.name);
        const KernelSpec& spec = p.spec(n.spec);
        CHECK(spec.constant("SPLIT") == c.split);
        // A CTA per (key chunk, kv head) along x, rows along y; grid.x whole clusters of SPLIT.
        CHECK(n.launch.grid[0] == h.kv_heads * c.split);
        CHECK(n.launch.grid[0] % c.split == 0);
        CHECK(n.launch.grid[1] == b.streams);
        CHECK(n.launch.rows_axis == 1);
        // Shared memory: the ring of K/V tiles (or the per-warp outputs, which reuse it), the chunk's scores
        // and its partial. llama3 at SPLIT 8: two tiles of 8 passes x 8 keys x 256 bytes (K of the chunk's
        // 64 keys, then V), 64 x 4 scores, 4 x 130 partial floats.
        const int64_t g = h.heads / h.kv_heads, chunk = (h.window + c.split) / c.split;
        const int64_t scores_and_part = 4 * (g * chunk + g * (h.head_dim + 2));
        CHECK(n.launch.smem > scores_and_part);
        if (std::string_view(c.preset) == "llama3-8b-eagle3" && c.split == 8)
          CHECK(n.launch.smem == 2 * 64 * 256 + 4 * 4 * 64 + 4 * 4 * 130);
      }
    const auto choice = std::find_if(p.choices.begin(), p.choices.end(),
                                     [](const Choice& ch) { return ch.subject == "attention draft"; });
    REQUIRE(choice != p.choices.end());
    CHECK(choice->decision == fmt::format("ring_attention split {}", c.split));
  }
}

TEST_CASE(
    "make_plan: attention takes fewer, longer key chunks where its grid would exceed one wave, while five "
    "CTAs still fit an SM's shared memory") {
  PlanOptions o;
  o.buckets = {1, 2, 4, 8, 16};
  o.max_steps = 2;
  auto splits = [&](const HeadHeader& h, bool to_one_wave = true) {
    std::map<int, int64_t> by_streams;
    const Plan p = make_plan(h, o);
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes)
        if (n.name == "s1.attention") {
          by_streams[b.streams] = p.spec(n.spec).constant("SPLIT");
          // kv_heads x streams x SPLIT CTAs: at most one wave of 512 once the split is below its start
          // (unless shared memory stopped it first), and five CTAs an SM.
          if (to_one_wave && by_streams[b.streams] < 8) CHECK(n.launch.grid[0] * n.launch.grid[1] <= 512);
          CHECK(n.launch.smem <= 44 * 1024);
        }
    return by_streams;
  };
  // tfe-two-stage: 8 kv heads, 129 keys, so SPLIT 5 (26 keys a CTA). 16 streams x 8 kv heads x 5 = 640 CTAs;
  // at SPLIT 4, 512 CTAs of 33 keys.
  const HeadHeader two_stage = preset_header("tfe-two-stage");
  CHECK(splits(two_stage) == std::map<int, int64_t>{{1, 5}, {2, 5}, {4, 5}, {8, 5}, {16, 4}});
  // llama3-8b-eagle3: 512 keys. At 16 streams, SPLIT 4: 512 CTAs of 128 keys, two tiles of K, then of V,
  // two of the four in flight (36896 bytes of shared memory).
  const HeadHeader llama = preset_header("llama3-8b-eagle3");
  CHECK(splits(llama) == std::map<int, int64_t>{{1, 8}, {2, 8}, {4, 8}, {8, 8}, {16, 4}});
  // 96 query heads over 8 kv heads (12 a group: tiles of 4 passes, four 8 KB tiles in flight) and 512 keys:
  // at 16 streams SPLIT 4 would take 45152 bytes (32 KB of ring, 12 x 128 scores, 12 x 130 partial floats),
  // over the 44 KB that leaves five CTAs an SM, so the split stops at 5 (640 CTAs).
  HeadHeader grouped = llama;
  grouped.heads = 96;
  const auto gs = splits(grouped, false);
  CHECK(gs == std::map<int, int64_t>{{1, 8}, {2, 8}, {4, 8}, {8, 8}, {16, 5}});
  // A head with 32 kv heads and 256 keys: the wave is exceeded from 4 streams on (32 x 4 x 8 = 1024).
  HeadHeader wide = two_stage;
  wide.kv_heads = 32;
  wide.window = 255;
  const auto w = splits(wide);
  CHECK(w.at(1) == 8);
  CHECK(w.at(2) == 8);
  CHECK(w.at(4) == 4);
  CHECK(w.at(8) == 2);
  CHECK(w.at(16) == 1);
  // same_drafts: every bucket takes the largest bucket's split (a slot's attention sums its keys in one
  // order in every bucket), also where the buckets stop below 16.
  o.attention_split = AttentionSplit::same_drafts;
  CHECK(splits(llama) == std::map<int, int64_t>{{1, 4}, {2, 4}, {4, 4}, {8, 4}, {16, 4}});
  CHECK(splits(wide) == std::map<int, int64_t>{{1, 1}, {2, 1}, {4, 1}, {8, 1}, {16, 1}});
  o.buckets = {1, 2, 4};
  CHECK(splits(wide) == std::map<int, int64_t>{{1, 4}, {2, 4}, {4, 4}});
}

TEST_CASE("make_plan: two_stage topk is one cluster of CTAs per row, 4096 scores a CTA up to 8, one below sm_90") {
  const auto topk_of = [](const HeadHeader& h, const std::string& arch) {
    PlanOptions o;
    o.arch = arch;
    const Plan p = make_plan(h, o);
    // The CTAs of a row agree through distributed shared memory: no partials or tickets between them.
    for (const char* gone : {"part_score", "part_id", "topk_arrivals"}) CHECK(p.arena.find(gone) == nullptr);
    std::set<int64_t> splits;
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes)
        if (n.name.ends_with("topk")) {
          const KernelSpec& spec = p.spec(n.spec);
          CHECK(spec.constant("VOCAB") == h.draft_vocab);
          CHECK(spec.constant("CAND_K") == h.cand_k);
          CHECK(n.launch.grid[0] == spec.constant("SPLIT"));  // one cluster a row
          CHECK(n.launch.grid[1] == b.streams);
          splits.insert(spec.constant("SPLIT"));
        }
    REQUIRE(splits.size() == 1);
    return *splits.begin();
  };
  HeadHeader h = preset_header("tfe-two-stage");
  CHECK(h.draft_vocab == 32000);
  CHECK(topk_of(h, "sm_90") == 8);
  CHECK(topk_of(h, "sm_80") == 1);
  h.draft_vocab = 4096;
  CHECK(topk_of(h, "sm_90") == 1);
  h.draft_vocab = 4097;
  CHECK(topk_of(h, "sm_90") == 2);
  h.draft_vocab = 20000;
  CHECK(topk_of(h, "sm_90") == 5);
  h.draft_vocab = 128256;
  CHECK(topk_of(h, "sm_100") == 8);
}

TEST_CASE(
    "make_plan: a narrow FP8 output's gemv splits each column tile's K over a cluster (gemv_cluster), up to "
    "128 CTAs, from sm_90 on, never in bf16") {
  // The GEMV nodes of every draft pass, by node name (without its step prefix): kernel and CSPLIT.
  const auto gemvs = [](const HeadHeader& h, const PlanOptions& o, const Tuning& t = {}) {
    const Plan p = make_plan(h, o, t);
    std::map<std::string, std::set<std::pair<std::string, int64_t>>> out;
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes) {
        const KernelSpec& spec = p.spec(n.spec);
        if (!spec.kernel.starts_with("gemv")) continue;
        const int64_t split = spec.kernel == "gemv_cluster" ? spec.constant("CSPLIT") : 1;
        out[std::string(node_base_name(n))].emplace(spec.kernel, split);
        if (split > 1) {
          // grid.x: the plain gemv's CTAs, CSPLIT a column tile; block and shared memory its own.
          const LaunchShape plain = launch_shape(gemv_equivalent(spec), b.streams);
          CHECK(n.launch.grid[0] == plain.grid[0] * split);
          CHECK(n.launch.block == plain.block);
          CHECK(split <= gemv_cluster_split_limit(spec));
        }
      }
    CHECK(std::any_of(p.choices.begin(), p.choices.end(),
                      [](const Choice& c) { return c.subject == "gemv cluster split"; }));
    return out;
  };
  using Kernels = std::set<std::pair<std::string, int64_t>>;
  HeadHeader h = preset_header("tfe-two-stage");
  h.fp8 = linears_in_use(h);
  const PlanOptions defaults;
  const auto fp8 = gemvs(h, defaults);
  // lr_a: 512 columns, 32 column tiles of 16; 4 CTAs a tile give 128 (FP8: 64 K steps over 16 warps a CTA).
  CHECK(fp8.at("lr_a") == Kernels{{"gemv_cluster", 4}});
  for (const auto& [name, kernels] : fp8)
    if (name != "lr_a") CHECK(kernels.begin()->first != "gemv_cluster");
  Tuning off;
  off.gemv_cluster = false;
  CHECK(gemvs(h, defaults, off).at("lr_a") == Kernels{{"gemv", 1}});
  PlanOptions ampere;
  ampere.arch = "sm_80";
  CHECK(gemvs(h, ampere).at("lr_a") == Kernels{{"gemv", 1}});
  HeadHeader bf16 = preset_header("tfe-two-stage");
  CHECK(gemvs(bf16, defaults).at("lr_a") == Kernels{{"gemv", 1}});
  // tiny-two-stage's lr_a gives each of its warps one K step already: nothing to split.
  HeadHeader tiny = preset_header("tiny-two-stage");
  tiny.fp8 = linears_in_use(tiny);
  CHECK(gemvs(tiny, defaults).at("lr_a") == Kernels{{"gemv", 1}});
  // The split's limit: every warp of the cluster a K step of its own; 1 where the output is not narrow.
  const auto lr_a = [](int64_t k, int64_t weight) {
    return make_spec("gemv_cluster", {{"ROWS", 1},
                                      {"K", k},
                                      {"N", 512},
                                      {"WEIGHT", weight},
                                      {"EPILOGUE", kc::kEpilogueBF16},
                                      {"COLS", 16},
                                      {"TILED", 1},
                                      {"CSPLIT", 2}});
  };
  CHECK(gemv_cluster_split_limit(lr_a(4096, kc::kWeightFP8)) == 4);   // 64 steps, 16 warps
  CHECK(gemv_cluster_split_limit(lr_a(4096, kc::kWeightBF16)) == 8);  // 128 steps
  CHECK(gemv_cluster_split_limit(lr_a(256, kc::kWeightFP8)) == 1);    // 4 steps, 4 warps
  CHECK(gemv_equivalent(lr_a(4096, kc::kWeightFP8)) == make_spec("gemv", {{"ROWS", 1},
                                                                          {"K", 4096},
                                                                          {"N", 512},
                                                                          {"WEIGHT", kc::kWeightFP8},
                                                                          {"EPILOGUE", kc::kEpilogueBF16},
                                                                          {"COLS", 16},
                                                                          {"TILED", 1}}));
  CHECK(gemv_cluster_split_limit(make_spec(
            "gemv",
            {{"ROWS", 1}, {"K", 4096}, {"N", 4096}, {"WEIGHT", 0}, {"EPILOGUE", 0}, {"COLS", 16}, {"TILED", 0}})) == 1);
}

TEST_CASE(
    "make_plan: a head without qk_norm ropes in the wqkv gemv's epilogue (gemv_rope_kv), one with qk_norm "
    "or a head_dim not a multiple of 16 keeps the qk_rope_kv node") {
  // Per step: the wqkv node's kernel, and whether a qk_rope_kv node follows it.
  const auto draft_rope = [](const HeadHeader& h, const Tuning& t = {}) {
    const Plan p = make_plan(h, PlanOptions{}, t);
    std::set<std::string> kernels;
    for (const auto& b : p.buckets) {
      int ropes = 0, wqkvs = 0;
      for (const auto& n : b.nodes) {
        if (n.name.ends_with(".qk_rope_kv")) ++ropes;
        if (!n.name.ends_with(".wqkv")) continue;
        ++wqkvs;
        const KernelSpec& spec = p.spec(n.spec);
        kernels.insert(spec.kernel);
        if (spec.kernel != "gemv_rope_kv") continue;
        // Its GEMV is the wqkv gemv's: the same columns, tiles and launch as the two-node path's.
        const KernelSpec g = gemv_equivalent(spec);
        CHECK(g.constant("N") == (h.heads + 2 * h.kv_heads) * h.head_dim);
        CHECK(g.constant("K") == 2 * h.hidden);
        CHECK(n.launch == launch_shape(g, b.streams));
        std::map<std::string, std::string> bound;
        for (const Arg& a : n.args) bound[a.param] = a.buffer;
        CHECK(bound["x"] == "x");
        CHECK(bound["q_out"] == "q");
        CHECK(bound["ring_k"] == "ring_k");
        CHECK(bound["ring_v"] == "ring_v");
      }
      CHECK(wqkvs == p.options.max_steps);
      CHECK(ropes == (kernels.count("gemv") ? p.options.max_steps : 0));
    }
    REQUIRE(kernels.size() == 1);
    // The qkv buffer exists only for the two-node path; the extend's qk_rope_kv runs either way.
    CHECK((p.arena.find("qkv") != nullptr) == (*kernels.begin() == "gemv"));
    CHECK(std::any_of(p.extend.begin(), p.extend.end(), [](const Node& n) { return n.name == "extend.qk_rope_kv"; }));
    const auto choice =
        std::find_if(p.choices.begin(), p.choices.end(), [](const Choice& c) { return c.subject == "rope draft"; });
    REQUIRE(choice != p.choices.end());
    return *kernels.begin();
  };
  CHECK(draft_rope(preset_header("llama3-8b-eagle3")) == "gemv_rope_kv");
  CHECK(draft_rope(preset_header("tiny")) == "gemv_rope_kv");
  CHECK(draft_rope(preset_header("tfe-two-stage")) == "gemv");
  CHECK(draft_rope(preset_header("tiny-two-stage")) == "gemv");
  HeadHeader h = preset_header("tiny");
  h.head_dim = 24;  // 12 pairs: a 16-column tile would split a head's pairs
  CHECK(draft_rope(h) == "gemv");
  h.head_dim = 32;
  h.qk_norm = true;
  CHECK(draft_rope(h) == "gemv");
  Tuning off;
  off.rope_in_wqkv = false;
  CHECK(draft_rope(preset_header("llama3-8b-eagle3"), off) == "gemv");
  // Only a GEMV has a gemv equivalent.
  CHECK_THROWS_WITH_AS(gemv_equivalent(make_spec("topk", {{"VOCAB", 300}, {"CAND_K", 16}, {"SPLIT", 1}})),
                       doctest::Contains("is not a gemv"), Error);
}

TEST_CASE(
    "make_plan: a dense step ends in the lm_head gemv writing top1 partials and one top1 node joining "
    "them, a CTA per row, at the gemv's COLS") {
  for (const auto& golden : golden_heads()) {
    const HeadHeader& header = golden.second;
    if (header.head_type != HeadType::dense) continue;
    CAPTURE(golden.first);
    const Plan p = make_plan(header, golden_options());
    // Neither the logits nor tickets: the records are the only thing between the two kernels.
    for (const char* gone : {"logits", "part_max", "part_idx", "part_sum", "top1_arrivals"})
      CHECK(p.arena.find(gone) == nullptr);
    const Buffer& parts = p.arena.at("top1_part");
    CHECK(parts.dtype == DType::F32);
    CHECK(parts.shape.size() == 3);
    CHECK(parts.shape[0] == p.options.buckets.back());
    CHECK(parts.shape[2] == 4);  // one 16-byte record per partial
    for (const auto& b : p.buckets) {
      CAPTURE(b.streams);
      std::map<int, int> per_step;
      for (size_t i = 0; i < b.nodes.size(); ++i) {
        const Node& n = b.nodes[i];
        if (p.spec(n.spec).kernel != "top1") continue;
        ++per_step[n.step];
        // The step's last node but its store_outputs (which only the pass ending there runs).
        REQUIRE(i + 1 < b.nodes.size());
        CHECK(b.nodes[i + 1].name == fmt::format("s{}.store_outputs", n.step));
        if (i + 2 < b.nodes.size()) CHECK(b.nodes[i + 2].step == n.step + 1);
        REQUIRE(i > 0);
        const Node& lm = b.nodes[i - 1];
        const KernelSpec& gemv = p.spec(lm.spec);
        const KernelSpec& top1 = p.spec(n.spec);
        CHECK(lm.name == fmt::format("s{}.lm_head", n.step));
        CHECK(gemv.constant("EPILOGUE") == kc::kEpilogueTop1);
        CHECK(std::any_of(lm.args.begin(), lm.args.end(),
                          [](const Arg& a) { return a.param == "y" && a.buffer == "top1_part"; }));
        CHECK(std::any_of(n.args.begin(), n.args.end(),
                          [](const Arg& a) { return a.param == "part" && a.buffer == "top1_part"; }));
        // One partial per gemv CTA and row: top1's COLS is the gemv's, and the buffer holds them all.
        CHECK(top1.constant("COLS") == gemv.constant("COLS"));
        CHECK(top1.constant("VOCAB") == gemv.constant("N"));
        CHECK(lm.launch.grid[0] == (top1.constant("VOCAB") + top1.constant("COLS") - 1) / top1.constant("COLS"));
        CHECK(lm.launch.grid[0] <= parts.shape[1]);
        CHECK(n.launch.grid[0] == b.streams);
        CHECK(n.launch.grid[1] == 1);
        CHECK(n.launch.block == 256);
      }
      CHECK(per_step.size() == static_cast<size_t>(p.options.max_steps));
      for (const auto& [step, count] : per_step) CHECK(count == 1);
    }
    // The buffer is sized for the bucket with the most partials, COLS 16.
    CHECK(parts.shape[1] == (header.draft_vocab + 15) / 16);
  }
}

TEST_CASE(
    "make_plan: a gemv takes 32 columns a CTA only above 8 rows with K >= 2048, in bf16 only with 512 "
    "CTAs left, a short K several column tiles a CTA, and two weight tiles keep their ring in up to 96 KB of "
    "dynamic shared memory") {
  for (const auto& [name, header] : golden_heads()) {
    CAPTURE(name);
    const Plan p = make_plan(header, golden_options());
    int wide = 0;
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes) {
        const KernelSpec& spec = p.spec(n.spec);
        if (spec.kernel != "gemv") continue;
        CAPTURE(n.name);
        const int64_t cols = spec.constant("COLS"), big_n = spec.constant("N");
        const bool spec_fp8 = spec.constant("WEIGHT") == kc::kWeightFP8;
        const bool expect_wide = spec.constant("ROWS") > 8 && spec.constant("EPILOGUE") != kc::kEpilogueSwiGLU &&
                                 (big_n + 15) / 16 >= 64 && spec.constant("K") >= 2048 &&
                                 (spec_fp8 || (big_n + 31) / 32 >= 512);
        CHECK(cols == (expect_wide ? 32 : 16));
        // A column tile's warps split K so that each takes at least 4 steps of 32 (bf16) or 64 (FP8)
        // where K allows (8 at most, 16 for a narrow output); a CTA then runs 8 / split tiles.
        const int64_t steps = (spec.constant("K") + (spec_fp8 ? 63 : 31)) / (spec_fp8 ? 64 : 32);
        const bool narrow = (big_n + 15) / 16 < 64;
        int64_t split = narrow ? std::min<int64_t>(16, steps) : 1;
        while (!narrow && split < 8 && split * 2 <= steps / 4) split *= 2;
        const int64_t tiles = narrow ? 1 : 8 / split;
        CHECK(n.launch.block == 32 * split * tiles);
        CHECK(n.launch.grid[0] == ((big_n + cols - 1) / cols + tiles - 1) / tiles);
        if (name.starts_with("tfe-two-stage") && n.name.ends_with("lr_b"))
          CHECK(tiles == (spec_fp8 ? 4 : 2));  // K 512: 8 (FP8) or 16 steps
        // Two weight tiles in bf16, or in FP8 above 8 rows: 3 stages x 8 warps x (4 weight + x chunks) x
        // 512 bytes, x chunks 2 per 8 rows in FP8 and 1 in bf16.
        const bool two_tiles = cols == 32 || spec.constant("EPILOGUE") == kc::kEpilogueSwiGLU;
        const int64_t nt = (spec.constant("ROWS") + 7) / 8;
        const bool dynamic = two_tiles && (!spec_fp8 || nt == 2) && (big_n + 15) / 16 >= 64;
        CHECK(n.launch.smem == (dynamic ? 3 * 8 * (4 + nt * (spec_fp8 ? 2 : 1)) * 512 : 0));
        wide += cols == 32;
      }
    // bf16: llama3-8b-eagle3's vocabulary head (32000 x 4096) is the wide one, in the 16-stream bucket;
    // tfe-two-stage's lr_b (32000 x 512) is too short in K, and the tiny heads' linears are narrow.
    // FP8: the 16-stream bucket's linears but gate/up (and lr_a, lr_b) of both full-size heads.
    CHECK((wide > 0) == (name.starts_with("llama3-8b-eagle3") || name == "tfe-two-stage-fp8"));
    // The plan says which shapes run several tiles a CTA: lr_b of the full-size two_stage head alone.
    const auto tiles_choice = std::find_if(p.choices.begin(), p.choices.end(),
                                           [](const auto& c) { return c.subject == "gemv column tiles per CTA"; });
    REQUIRE(tiles_choice != p.choices.end());
    CHECK(tiles_choice->decision == (name == "tfe-two-stage-fp8" ? "4 at K 512 N 32000 fp8; 1 elsewhere"
                                     : name == "tfe-two-stage"   ? "2 at K 512 N 32000 bf16; 1 elsewhere"
                                                                 : "1"));
  }
  // A plan that asks for 32 columns with SwiGLU, or another width, is refused by its launch shape.
  for (int64_t cols : {int64_t{48}, int64_t{32}}) {
    CAPTURE(cols);
    const int64_t epilogue = cols == 32 ? kc::kEpilogueSwiGLU : kc::kEpilogueF32;
    const KernelSpec spec = make_spec(
        "gemv",
        {{"ROWS", 16}, {"K", 4096}, {"N", 14336}, {"WEIGHT", 0}, {"EPILOGUE", epilogue}, {"COLS", cols}, {"TILED", 0}});
    CHECK_THROWS_WITH_AS(launch_shape(spec, 16), doctest::Contains(fmt::format("COLS is {}", cols).c_str()), Error);
  }
}

TEST_CASE(
    "make_plan: draft kernels launch dependent up to dependent_streams (default 4, or dependent_streams_fp8, "
    "default 0, where the layer's linears are FP8), but an FP8 GEMV right after a GEMV, and above it every node "
    "but a GEMV after a full grid (dependent_safe_nodes), extend kernels never") {
  CHECK(Tuning{}.dependent_streams == 4);
  CHECK(Tuning{}.dependent_streams_fp8 == 0);
  CHECK(Tuning{}.dependent_safe_nodes);
  for (const auto& [name, header] : golden_heads()) {
    CAPTURE(name);
    // The golden FP8 presets run every linear in FP8; the others none.
    const bool fp8 = name.ends_with("-fp8");
    for (const auto& [bf16_limit, fp8_limit] : std::vector<std::pair<int, int>>{{0, 16}, {2, 4}, {4, 16}, {16, 0}})
      for (const bool safe : {false, true}) {
        CAPTURE(bf16_limit);
        CAPTURE(fp8_limit);
        CAPTURE(safe);
        Tuning t;
        t.dependent_streams = bf16_limit;
        t.dependent_streams_fp8 = fp8_limit;
        t.dependent_safe_nodes = safe;
        const int limit = fp8 ? fp8_limit : bf16_limit;
        const Plan p = make_plan(header, golden_options(), t);
        int plain_fp8 = 0, plain_above = 0, dependent_above = 0;
        for (const auto& b : p.buckets)
          for (size_t i = 0; i < b.nodes.size(); ++i) {
            const Node& n = b.nodes[i];
            CAPTURE(n.name);
            const auto gemv = [&](const Node& m) { return p.spec(m.spec).kernel.starts_with("gemv"); };
            const bool fp8_after_gemv =
                i > 0 && gemv(b.nodes[i - 1]) && gemv(n) && p.spec(n.spec).constant("WEIGHT") == kc::kWeightFP8;
            plain_fp8 += b.streams <= limit && fp8_after_gemv;
            if (b.streams <= limit) {
              CHECK(n.dependent == !fp8_after_gemv);
              continue;
            }
            // Above the limit: a GEMV after a grid of 132 CTAs or more (an H200's SMs) launches plainly.
            const auto ctas = [](const Node& m) { return m.launch.grid[0] * m.launch.grid[1] * m.launch.grid[2]; };
            const bool after_full_grid = i > 0 && gemv(n) && ctas(b.nodes[i - 1]) >= 132;
            CHECK(n.dependent == (safe && !after_full_grid));
            plain_above += safe && after_full_grid;
            dependent_above += n.dependent;
          }
        // Both kinds occur above the limit where it is under 16 (the golden plans' largest bucket), for the
        // full-size presets (the tiny ones' grids are all under 132 CTAs).
        if (safe && limit < 16 && !name.starts_with("tiny")) {
          CHECK(plain_above > 0);
          CHECK(dependent_above > 0);
        }
        // w_down (and two_stage's lr_b) in every FP8 bucket that launches dependent.
        const int dependent_buckets = static_cast<int>(
            std::count_if(p.buckets.begin(), p.buckets.end(), [&](const Bucket& b) { return b.streams <= limit; }));
        const int per_step = name.starts_with("tfe-two-stage") ? 2 : 1;
        CHECK(plain_fp8 == (fp8 ? dependent_buckets * p.options.max_steps * per_step : 0));
        for (const auto& n : p.extend) CHECK_FALSE(n.dependent);
      }
    Plan p = make_plan(header, golden_options());
    // The flag is plan data: it survives the YAML, and an extend node carrying it is refused by name.
    CHECK(load_plan_yaml(dump_plan_yaml(p)) == p);
    Node& extend_kernel =
        *std::find_if(p.extend.begin(), p.extend.end(), [](const Node& n) { return n.kind == Node::Kind::kernel; });
    extend_kernel.dependent = true;
    const std::string refusal = fmt::format("plan: node {} is marked dependent", extend_kernel.name);
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(refusal.c_str()), Error);
    CHECK_THROWS_WITH_AS(load_plan_yaml(dump_plan_yaml(p)), doctest::Contains(refusal.c_str()), Error);
  }
  // A layer with one linear left in bf16 is not an FP8 layer: w_down without its FP8 form keeps
  // dependent_streams; with it, dependent_streams_fp8 applies.
  for (const bool all_fp8 : {false, true}) {
    CAPTURE(all_fp8);
    HeadHeader h = preset_header("tiny");
    h.fp8 = linears_in_use(h);
    if (!all_fp8) h.fp8.erase(std::find(h.fp8.begin(), h.fp8.end(), "w_down"));
    Tuning t;
    t.dependent_streams = 1;
    t.dependent_streams_fp8 = 16;
    t.dependent_safe_nodes = false;  // so that a bucket's first node shows which limit applies
    const Plan p = make_plan(h, golden_options(), t);
    for (const auto& b : p.buckets) {
      CAPTURE(b.streams);
      CHECK(b.nodes.front().dependent == (all_fp8 || b.streams <= 1));
    }
  }
}
