// make_plan: its options and their limits, FP8 forms, the weights, buffers and arenas it lays out, the
// passes it forms, and the heads it refuses.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <tfe/draft.h>

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
using tfe::test::replace_once;

TEST_CASE("make_plan: every preset plans and validates") {
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    const Plan p = make_plan(preset_header(name), PlanOptions{});
    CHECK_NOTHROW(validate(p));
    CHECK(p.buckets.size() == 5);
  }
}

TEST_CASE("make_plan: options outside their limits are refused by name") {
  const HeadHeader h = preset_header("tiny");
  auto refused = [&](auto edit, const char* message) {
    PlanOptions o;
    edit(o);
    CHECK_THROWS_WITH_AS(make_plan(h, o), doctest::Contains(message), Error);
  };
  refused([](PlanOptions& o) { o.buckets = {}; }, "buckets is empty");
  refused([](PlanOptions& o) { o.buckets = {0, 2}; }, "buckets[0] = 0 is outside 1..16");
  refused([](PlanOptions& o) { o.buckets = {1, 17}; }, "buckets[1] = 17 is outside 1..16");
  refused([](PlanOptions& o) { o.buckets = {4, 2}; }, "buckets must be ascending and unique; buckets[1] = 2 follows 4");
  refused([](PlanOptions& o) { o.buckets = {2, 2}; }, "buckets[1] = 2 follows 2");
  refused([](PlanOptions& o) { o.max_steps = 0; }, "max_steps = 0 is outside 1..16");
  refused([](PlanOptions& o) { o.max_steps = 17; }, "max_steps = 17 is outside 1..16");
  refused([](PlanOptions& o) { o.max_slots = 0; }, "max_slots = 0 is outside 1..4096");
  refused([](PlanOptions& o) { o.max_slots = 4097; }, "max_slots = 4097 is outside 1..4096");
  refused([](PlanOptions& o) { o.max_slots = 8; }, "bucket 16 exceeds max_slots = 8");
  refused([](PlanOptions& o) { o.extend_rows = 15; }, "extend_rows = 15 is outside 16..8192");
  refused([](PlanOptions& o) { o.extend_rows = 8193; }, "extend_rows = 8193 is outside 16..8192");
  refused([](PlanOptions& o) { o.cand_k = -1; }, "cand_k = -1 is outside 0..512 (0: the head's)");
  refused([](PlanOptions& o) { o.cand_k = 513; }, "cand_k = 513 is outside 0..512 (0: the head's)");
  refused([](PlanOptions& o) { o.arch = "90"; }, "arch `90` is not of the form sm_<digits>");
  refused([](PlanOptions& o) { o.arch = "sm_90x"; }, "arch `sm_90x`");
  refused([](PlanOptions& o) { o.arch = "sm_75"; }, "arch sm_75 is below sm_80");
  CHECK_THROWS_WITH_AS(fp8_mode_from_name("on"), doctest::Contains("fp8 mode `on`"), Error);
  CHECK_THROWS_WITH_AS(attention_split_from_name("fast"),
                       doctest::Contains("attention split `fast` is not one of per_bucket, same_drafts"), Error);
  const auto tuning_refused = [&](auto edit, const char* message) {
    Tuning t;
    edit(t);
    CHECK_THROWS_WITH_AS(make_plan(h, PlanOptions{}, t), doctest::Contains(message), Error);
  };
  tuning_refused([](Tuning& t) { t.dependent_streams = -1; }, "tuning: dependent_streams = -1 is outside 0..16");
  tuning_refused([](Tuning& t) { t.dependent_streams = 17; }, "tuning: dependent_streams = 17 is outside 0..16");
  tuning_refused([](Tuning& t) { t.dependent_streams_fp8 = -1; }, "dependent_streams_fp8 = -1 is outside 0..16");
  tuning_refused([](Tuning& t) { t.dependent_streams_fp8 = 17; }, "dependent_streams_fp8 = 17 is outside 0..16");
}

TEST_CASE("make_plan: cand_k overrides the header's candidates for a two_stage head, within its limits") {
  // A dense head has no candidates: a nonzero cand_k is refused, naming the field.
  PlanOptions o;
  o.cand_k = 8;
  CHECK_THROWS_WITH_AS(make_plan(preset_header("tiny"), o),
                       doctest::Contains("cand_k = 8 is set, but the head is dense"), Error);
  // At most the head's draft_vocab (tiny-two-stage: 300).
  const HeadHeader h = preset_header("tiny-two-stage");
  REQUIRE(h.draft_vocab == 300);
  o.cand_k = 301;
  CHECK_THROWS_WITH_AS(make_plan(h, o), doctest::Contains("cand_k = 301 is outside 1..300 (the head's draft_vocab)"),
                       Error);
  // 0 takes the header's; a value in range takes its place in every node and buffer that holds candidates.
  for (const int cand_k : {0, 1, 40, 300}) {
    CAPTURE(cand_k);
    o.cand_k = cand_k;
    const int64_t expected = cand_k ? cand_k : h.cand_k;
    const Plan p = make_plan(h, o);
    CHECK(plan_cand_k(p.header, p.options) == expected);
    CHECK(p.arena.at("cand").shape == std::vector<int64_t>{16, expected});
    CHECK(p.arena.at("exact").shape == std::vector<int64_t>{16, expected});
    int seen = 0;
    for (const auto& s : p.specs)
      if (s.kernel == "topk" || s.kernel == "rescore") {
        CHECK(s.constant("CAND_K") == expected);
        ++seen;
      }
    CHECK(seen >= 2);
    const auto rescore = std::find_if(p.choices.begin(), p.choices.end(),
                                      [](const Choice& c) { return c.subject == "target_head draft"; });
    REQUIRE(rescore != p.choices.end());
    CHECK(rescore->reason.starts_with(fmt::format("only the {} candidate rows", expected)));
    // The override is plan data: it survives the YAML.
    CHECK(load_plan_yaml(dump_plan_yaml(p)) == p);
  }
  // A loaded plan is held to the same limits: a dense plan's YAML with a cand_k is refused.
  const std::string dense = dump_plan_yaml(make_plan(preset_header("tiny"), golden_options()));
  CHECK_THROWS_WITH_AS(load_plan_yaml(replace_once(dense, "cand_k: 0\n  first_ranks", "cand_k: 4\n  first_ranks")),
                       doctest::Contains("cand_k = 4 is set, but the head is dense"), Error);
}

TEST_CASE("plan_options_differences: names each differing option by its YAML key with both values") {
  const PlanOptions a;
  CHECK(plan_options_differences(a, a).empty());
  const auto differs = [&](auto&& mend, const char* expected) {
    PlanOptions b = a;
    mend(b);
    CAPTURE(expected);
    CHECK(plan_options_differences(a, b) == expected);
  };
  differs([](PlanOptions& o) { o.buckets = {1, 4}; }, "buckets 1,2,4,8,16 against 1,4");
  differs([](PlanOptions& o) { o.max_steps = 4; }, "max_steps 8 against 4");
  differs([](PlanOptions& o) { o.fp8 = Fp8Mode::off; }, "fp8 auto against off");
  differs([](PlanOptions& o) { o.arch = "sm_100"; }, "arch sm_90 against sm_100");
  differs([](PlanOptions& o) { o.max_slots = 32; }, "max_slots 64 against 32");
  differs([](PlanOptions& o) { o.extend_rows = 512; }, "extend_rows 1024 against 512");
  differs([](PlanOptions& o) { o.attention_split = AttentionSplit::same_drafts; },
          "attention_split per_bucket against same_drafts");
  differs([](PlanOptions& o) { o.cand_k = 32; }, "cand_k 0 against 32");
  differs([](PlanOptions& o) { o.max_steps = 2, o.cand_k = 32; }, "max_steps 8 against 2; cand_k 0 against 32");
  differs([](PlanOptions& o) { o.first_ranks = true; }, "first_ranks false against true");
}

TEST_CASE("make_plan: first_ranks plans step 1 as logits and ranked, the ranks beside the ids, dense heads only") {
  const HeadHeader h = preset_header("tiny");
  const Plan chain = make_plan(h, golden_options());
  PlanOptions o = golden_options();
  o.first_ranks = true;
  const Plan p = make_plan(h, o);
  const int64_t largest = o.buckets.back();
  CHECK(p.arena.at("logits").shape == std::vector<int64_t>{largest, h.draft_vocab});
  CHECK(p.arena.at("rank").shape == std::vector<int64_t>{largest});
  CHECK(p.arena.at("draft_ranks").role == BufferRole::input);
  CHECK(p.host.at("host_ranks").shape == std::vector<int64_t>{largest});
  for (const char* name : {"logits", "rank", "draft_ranks"}) CHECK(chain.arena.find(name) == nullptr);
  CHECK(chain.host.find("host_ranks") == nullptr);
  const auto arg = [](const Node& n, std::string_view param) -> const Arg& {
    for (const Arg& a : n.args)
      if (a.param == param) return a;
    FAIL("no arg ", param);
    return n.args.front();
  };
  const auto spec = [&](const Plan& plan, const Node& n) -> const KernelSpec& {
    for (const auto& s : plan.specs)
      if (s.uri() == n.spec) return s;
    FAIL("no spec ", n.spec);
    return plan.specs.front();
  };
  for (const Bucket& b : p.buckets) {
    CAPTURE(b.streams);
    const Node& first = b.nodes.front();
    CHECK(spec(p, first).constant("RANKS") == 1);
    CHECK(arg(first, "ranks").buffer == "host_ranks");
    CHECK(arg(first, "rank").buffer == "rank");
    CHECK(arg(first, "max_rank").i == kMaxFirstRank);
    std::vector<std::string> heads;  // each step's lm_head epilogue and the kernel after it
    for (size_t i = 0; i + 1 < b.nodes.size(); ++i)
      if (b.nodes[i].name.ends_with(".lm_head"))
        heads.push_back(fmt::format("{}:{}:{}", b.nodes[i].step, spec(p, b.nodes[i]).constant("EPILOGUE"),
                                    spec(p, b.nodes[i + 1]).kernel));
    REQUIRE(heads.size() == static_cast<size_t>(o.max_steps));
    CHECK(heads.front() == fmt::format("1:{}:ranked", kc::kEpilogueF32));
    for (size_t s = 1; s < heads.size(); ++s) CHECK(heads[s] == fmt::format("{}:{}:top1", s + 1, kc::kEpilogueTop1));
  }
  for (const Bucket& b : chain.buckets) {
    CHECK(spec(chain, b.nodes.front()).constant("RANKS") == 0);
    CHECK(arg(b.nodes.front(), "ranks").kind == Arg::Kind::null);
  }
  // The option is plan data: it survives the YAML, and a loaded plan's load_tables must read the ranks.
  CHECK(load_plan_yaml(dump_plan_yaml(p)) == p);
  const std::string yaml = dump_plan_yaml(p);
  CHECK_THROWS_WITH_AS(
      load_plan_yaml(replace_once(yaml, "{param: ranks, kind: buffer, buffer: host_ranks, byte_offset: 0}",
                                  "{param: ranks, kind: buffer, buffer: host_tables, byte_offset: 0}")),
      doctest::Contains("`ranks` must bind host buffer `host_ranks` at byte_offset 0"), Error);
  CHECK_THROWS_WITH_AS(load_plan_yaml(replace_once(yaml, "{param: max_rank, kind: i64, i64: 7}",
                                                   "{param: max_rank, kind: i64, i64: 8}")),
                       doctest::Contains("`max_rank` = 8, but the plan's first ranks are 0..7"), Error);
  // A two_stage head drafts its best token only.
  CHECK_THROWS_WITH_AS(make_plan(preset_header("tiny-two-stage"), o),
                       doctest::Contains("first_ranks is on, but a two_stage head drafts its best token only"), Error);
}

TEST_CASE("check_knock_out: takes draft node names without their step, refuses unknown and needed ones") {
  const Plan plan = make_plan(preset_header("tiny"), PlanOptions{});
  Node n;
  n.name = "s3.post_norm";
  CHECK(node_base_name(n) == "post_norm");
  n.name = "extend.fc";
  CHECK(node_base_name(n) == "fc");
  CHECK_NOTHROW(check_knock_out(plan, {}));
  CHECK_NOTHROW(check_knock_out(plan, {"post_norm", "final_norm", "top1", "prepare_x", "attention"}));
  CHECK_THROWS_WITH_AS(check_knock_out(plan, {"top1", "s1.top1"}),
                       doctest::Contains("no draft node is named `s1.top1` (the draft nodes: "), Error);
  // An extend node is not a draft node.
  CHECK_THROWS_WITH_AS(check_knock_out(plan, {"fc"}), doctest::Contains("no draft node is named `fc`"), Error);
  CHECK_THROWS_WITH_AS(check_knock_out(plan, {"store_outputs"}),
                       doctest::Contains("`store_outputs` cannot be left out"), Error);
  CHECK_THROWS_WITH_AS(check_knock_out(plan, {"load_tables"}), doctest::Contains("`load_tables` cannot be left out"),
                       Error);
}

TEST_CASE("make_plan: fp8 = require names each linear without an FP8 form") {
  HeadHeader h = preset_header("tiny-two-stage");
  h.fp8 = linears_in_use(h);
  std::mt19937_64 rng(std::random_device{}());
  const auto in_use = linears_in_use(h);
  const std::string missing = in_use[rng() % in_use.size()];
  CAPTURE(missing);
  h.fp8.erase(std::find(h.fp8.begin(), h.fp8.end(), missing));
  PlanOptions o;
  o.fp8 = Fp8Mode::require;
  try {
    make_plan(h, o);
    FAIL("fp8 = require planned a head lacking the FP8 form of " << missing);
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("fp8 = require") != std::string::npos);
    CHECK(what.find("form for " + missing + " (") != std::string::npos);
    for (const auto& l : in_use)
      if (l != missing) CHECK_MESSAGE(what.find(" " + l + " ") == std::string::npos, l << " named wrongly: " << what);
  }
  h.fp8.push_back(missing);
  const Plan p = make_plan(h, o);
  CHECK(p.fp8);
  for (const auto& b : p.weights.buffers)
    if (b.name == "fc" || b.name == "wqkv" || b.name == "w_gate_up" || b.name == "target_head")
      CHECK_MESSAGE(b.dtype == DType::F8_E4M3, b.name);
}

TEST_CASE("make_plan: a fusion is FP8 only when every part has its form") {
  HeadHeader h = preset_header("tiny");
  h.fp8 = {"wq", "wk", "w_gate", "w_up", "wo"};
  const Plan p = make_plan(h, PlanOptions{});
  CHECK(p.weights.at("wqkv").dtype == DType::BF16);
  CHECK(p.weights.at("wqkv").from == std::vector<std::string>{"wq", "wk", "wv"});
  CHECK(p.weights.find("wqkv.scale") == nullptr);
  CHECK(p.weights.at("w_gate_up").dtype == DType::F8_E4M3);
  CHECK(p.weights.at("w_gate_up").from == std::vector<std::string>{"w_gate.fp8", "w_up.fp8"});
  CHECK(p.weights.at("w_gate_up.scale").from == std::vector<std::string>{"w_gate.scale", "w_up.scale"});
  CHECK(p.weights.at("wo").dtype == DType::F8_E4M3);
  bool wqkv_reason = false, wq_reason = false;
  for (const auto& c : p.choices) {
    if (c.subject == "wqkv")
      wqkv_reason = c.decision.find("bf16") != std::string::npos && c.reason.find("wv") != std::string::npos;
    if (c.subject == "wq") wq_reason = c.decision == "bf16" && c.reason.find("fused") != std::string::npos;
  }
  CHECK(wqkv_reason);
  CHECK(wq_reason);
  // fp8 = off uses no form at all.
  PlanOptions off;
  off.fp8 = Fp8Mode::off;
  const Plan q = make_plan(h, off);
  CHECK_FALSE(q.fp8);
  for (const auto& b : q.weights.buffers) CHECK(b.dtype != DType::F8_E4M3);
}

TEST_CASE("make_plan: weights are the tensors in use, 256-byte aligned, each from its file tensors") {
  for (const auto& [name, h] : golden_heads()) {
    CAPTURE(name);
    const Plan p = make_plan(h, golden_options());
    std::set<std::string> file;
    for (const auto& t : expected_tensors(h)) file.insert(t.name);
    for (const auto& b : p.weights.buffers) {
      CAPTURE(b.name);
      CHECK(b.offset % 256 == 0);
      for (const auto& f : b.from) CHECK((file.count(f) || f == "computed:rope_inv_freq"));
    }
    CHECK(p.weights.at("rope_inv_freq").shape == std::vector<int64_t>{h.head_dim / 2});
    // The other head type's vocabulary weights are not loaded.
    CHECK((p.weights.find("lm_head") != nullptr) == (h.head_type == HeadType::dense));
    CHECK((p.weights.find("target_head") != nullptr) == (h.head_type == HeadType::two_stage));
    CHECK(p.ring_rows == h.window + 1 + golden_options().max_steps);
  }
}

namespace {

// The weight, host or arena buffer of that name.
const Buffer& buffer_of(const Plan& p, const std::string& name) {
  if (const Buffer* b = p.weights.find(name)) return *b;
  if (const Buffer* b = p.host.find(name)) return *b;
  return p.arena.at(name);
}

}  // namespace

TEST_CASE("make_plan: every buffer argument binds an existing buffer of the role its parameter needs") {
  // What each pointer parameter may bind. An extend reads the tables the host uploaded (for device rows,
  // gather_taps fills taps and row_tok from the uploaded addresses); a draft pass reads its tables as
  // activations, which its first node (load_tables) fills from slot ids (host memory, or draft_slots for
  // an enqueued pass) and slot_state, and its later steps read the tokens it drafted itself. Only a
  // blocking draft's ids and outputs, and the error record, live in host memory.
  using R = BufferRole;
  const std::map<std::string, std::set<R>> roles = {
      {"w", {R::weight}},
      {"scale", {R::weight}},
      {"embed", {R::weight}},
      {"input_norm", {R::weight}},
      {"hidden_norm", {R::weight}},
      {"q_norm", {R::weight}},
      {"k_norm", {R::weight}},
      {"inv_freq", {R::weight}},
      {"d2t", {R::weight}},
      {"target_head", {R::weight}},
      {"slot", {R::table, R::activation}},
      {"pos", {R::table, R::activation}},
      {"first_pos", {R::table, R::activation}},
      {"src_index", {R::table, R::activation}},
      {"dst_index", {R::table}},
      {"tokens", {R::table, R::activation}},
      {"tok", {R::activation}},
      {"ids", {R::host}},
      {"slot_state", {R::state}},
      {"error", {R::host}},
      {"row_taps_src", {R::table}},
      {"row_tok_src", {R::table}},
      {"taps", {R::table}},
      {"row_tok", {R::table}},
      {"row_slot", {R::table}},
      {"row_pos", {R::table}},
      {"last_row", {R::table}},
      {"last_slot", {R::table}},
      {"last_first", {R::table}},
      {"host_token", {R::host}},
      {"host_conf", {R::host}},
      {"host_done", {R::host}},
      {"ring_k", {R::state}},
      {"ring_v", {R::state}},
      {"out_token", {R::output}},
      {"out_conf", {R::output}},
      {"src", {R::state, R::activation}},
      {"dst", {R::state, R::activation}},
      // rmsnorm normalizes the uploaded taps in place; every other row operand is an activation.
      {"x", {R::activation, R::table}},
      {"y", {R::activation, R::table}},
      {"g", {R::activation}},
      {"residual", {R::activation}},
      {"qkv", {R::activation}},
      {"q_out", {R::activation}},
      {"q", {R::activation}},
      {"o", {R::activation}},
      {"part", {R::activation}},
      {"next_token", {R::activation}},
      {"scores", {R::activation}},
      {"cand", {R::activation}},
      {"exact", {R::activation}},
      {"n", {R::activation}},
      {"arrivals", {R::activation}}};
  for (const auto& [name, h] : golden_heads()) {
    CAPTURE(name);
    const Plan p = make_plan(h, golden_options());
    std::vector<const Node*> nodes;
    for (const auto& b : p.buckets)
      for (const auto& n : b.nodes) nodes.push_back(&n);
    for (const auto& n : p.extend) nodes.push_back(&n);
    for (const Node* n : nodes) {
      CAPTURE(n->name);
      if (n->kind == Node::Kind::gemm) {
        CHECK(buffer_of(p, n->gemm.w).role == R::weight);
        CHECK(buffer_of(p, n->gemm.y).role == R::activation);
        continue;
      }
      const KernelDef& def = kernel_def(p.spec(n->spec).kernel);
      REQUIRE(n->args.size() == def.params.size());
      for (size_t i = 0; i < n->args.size(); ++i) {
        const Arg& a = n->args[i];
        CAPTURE(a.param);
        CHECK(a.param == def.params[i].name);
        if (a.kind != Arg::Kind::buffer) continue;
        const Buffer& b = buffer_of(p, a.buffer);
        REQUIRE(roles.count(a.param));
        CHECK_MESSAGE(roles.at(a.param).count(b.role), "binds " << b.name << " of role " << buffer_role_name(b.role));
        if (b.role == R::table && param_writes(p.spec(n->spec).kernel, a.param))
          CHECK((n->name.starts_with("extend.tap_norm") || n->name == "extend.gather_taps"));
        CHECK(a.byte_offset < b.bytes);
      }
    }
  }
}

TEST_CASE("make_plan: the nodes of step <= s form the (B, s) pass") {
  // Data flow: walking the prefix of steps <= s in order (less the last_step_only nodes of steps below s,
  // as the runtime launches it), every activation a node reads was written by an earlier node of the
  // pass; the pass writes step s's outputs, and ends by copying them into host memory.
  for (const auto& [name, h] : golden_heads()) {
    const Plan p = make_plan(h, golden_options());
    for (const auto& bucket : p.buckets) {
      for (int s = 1; s <= p.options.max_steps; ++s) {
        CAPTURE(name);
        CAPTURE(bucket.streams);
        CAPTURE(s);
        size_t end = 0;
        while (end < bucket.nodes.size() && bucket.nodes[end].step <= s) ++end;
        for (size_t i = end; i < bucket.nodes.size(); ++i) CHECK(bucket.nodes[i].step > s);
        std::set<std::string> written;
        const Node* last_output = nullptr;  // the last node with a `step` argument: the step's output writer
        for (size_t i = 0; i < end; ++i) {
          const Node& n = bucket.nodes[i];
          if (n.last_step_only && n.step < s) continue;
          const std::string kernel = p.spec(n.spec).kernel;
          for (const auto& a : n.args)
            if (a.param == "step") last_output = &n;
          for (const auto& a : n.args) {
            if (a.kind == Arg::Kind::i64 && a.param == "rows") CHECK(a.i == bucket.streams);
            if (a.kind != Arg::Kind::buffer || param_writes(kernel, a.param)) continue;
            const bool device_buffer = !p.weights.find(a.buffer) && !p.host.find(a.buffer);
            if (device_buffer && p.arena.at(a.buffer).role == BufferRole::activation)
              CHECK_MESSAGE(written.count(a.buffer), n.name << " reads " << a.buffer << " before the prefix writes it");
          }
          // residual reads are reads; everything else a kernel writes becomes available.
          for (const auto& a : n.args)
            if (a.kind == Arg::Kind::buffer && param_writes(kernel, a.param)) written.insert(a.buffer);
        }
        REQUIRE(end > 0);
        const Node& last = bucket.nodes[end - 1];
        CHECK(last.step == s);
        CHECK(last.name == fmt::format("s{}.store_outputs", s));
        CHECK(last.last_step_only);
        REQUIRE(last_output != nullptr);
        CHECK(last_output->step == s);
        const auto step = std::find_if(last_output->args.begin(), last_output->args.end(),
                                       [](const Arg& a) { return a.param == "step"; });
        REQUIRE(step != last_output->args.end());
        CHECK(step->i == s);
        CHECK(written.count("out_token"));
        CHECK(written.count("host_token"));
        CHECK(written.count("host_conf"));
        CHECK(written.count("host_done"));
      }
    }
  }
}

TEST_CASE("make_plan: buffers never overlap, stay inside their arena, and the tables are one region") {
  for (const auto& [name, h] : golden_heads()) {
    CAPTURE(name);
    const Plan p = make_plan(h, golden_options());
    for (const Arena* a : {&p.weights, &p.arena, &p.host}) {
      std::vector<const Buffer*> bs;
      for (const auto& b : a->buffers) bs.push_back(&b);
      for (size_t i = 0; i < bs.size(); ++i) {
        CHECK(bs[i]->offset + bs[i]->bytes <= a->bytes);
        for (size_t j = i + 1; j < bs.size(); ++j)
          CHECK_MESSAGE(
              (bs[i]->offset + bs[i]->bytes <= bs[j]->offset || bs[j]->offset + bs[j]->bytes <= bs[i]->offset),
              bs[i]->name << " overlaps " << bs[j]->name);
      }
    }
    int64_t lo = INT64_MAX, hi = 0;
    for (const auto& b : p.arena.buffers)
      if (b.role == BufferRole::table) lo = std::min(lo, b.offset), hi = std::max(hi, b.offset + b.bytes);
    CHECK(lo == p.tables_offset);
    CHECK(hi == p.tables_offset + p.tables_bytes);
    for (const auto& b : p.arena.buffers)
      if (b.role != BufferRole::table) CHECK((b.offset + b.bytes <= lo || b.offset >= hi));
    const int64_t slots = p.options.max_slots + 1;
    CHECK(p.arena.at("ring_k").shape == std::vector<int64_t>{slots, p.ring_rows, h.kv_heads, h.head_dim});
    CHECK(p.arena.at("slot_g").shape == std::vector<int64_t>{slots, h.hidden});
    CHECK(p.device_bytes == p.weights.bytes + p.arena.bytes + p.cublaslt_workspace);
  }
}

TEST_CASE("make_plan: a draft pass reads its slot ids from the host arena once, and writes its outputs there") {
  for (const auto& [name, h] : golden_heads()) {
    CAPTURE(name);
    const Plan p = make_plan(h, golden_options());
    const int64_t B = p.options.buckets.back(), steps = p.options.max_steps;
    // host_tables: a row's slot id; host_error: the record of bad device input, one int64.
    std::map<std::string, std::vector<int64_t>> want = {{"host_tables", {B}},
                                                        {"host_token", {B, steps}},
                                                        {"host_conf", {B, steps}},
                                                        {"host_done", {1}},
                                                        {"host_error", {1}}};
    REQUIRE(p.host.buffers.size() == want.size());
    for (const Buffer& b : p.host.buffers) {
      CAPTURE(b.name);
      REQUIRE(want.count(b.name));
      CHECK(b.role == BufferRole::host);
      CHECK(b.shape == want.at(b.name));
    }
    for (const Bucket& bucket : p.buckets) {
      CAPTURE(bucket.streams);
      // The first node reads the ids; no other node reads host memory, and only each step's
      // store_outputs, which runs in the pass that ends at its step, writes host memory (but the error
      // record, which load_tables writes only for a bad id).
      const Node& first = bucket.nodes.front();
      CHECK(first.name == "s1.load_tables");
      CHECK(p.spec(first.spec).kernel == "load_tables");
      for (const Node& n : bucket.nodes) {
        const std::string kernel = p.spec(n.spec).kernel;
        for (const Arg& a : n.args) {
          if (a.kind != Arg::Kind::buffer || !p.host.find(a.buffer)) continue;
          CAPTURE(n.name);
          CAPTURE(a.param);
          if (a.buffer == "host_error")
            CHECK(&n == &first);
          else if (param_writes(kernel, a.param))
            CHECK((kernel == "store_outputs" && n.last_step_only));
          else
            CHECK(&n == &first);
        }
      }
    }
    // An extend touches host memory only through gather_taps' error record.
    for (const Node& n : p.extend)
      for (const Arg& a : n.args)
        if (p.host.find(a.buffer))
          CHECK_MESSAGE((n.name == "extend.gather_taps" && a.buffer == "host_error"), n.name << " binds host memory");
  }
  // One CTA fills the tables, a row a thread: more rows than it covers are refused, not truncated.
  const KernelSpec load = make_spec("load_tables", {{"RANKS", 0}});
  CHECK(launch_shape(load, 128).block == 128);
  CHECK_THROWS_WITH_AS(launch_shape(load, 129), doctest::Contains("rows is 129; load_tables fills at most 128"), Error);
}

TEST_CASE(
    "make_plan: a head whose attention does not fit the arch's shared memory, or whose head_dim is over "
    "512, is refused by its header fields") {
  HeadHeader h = preset_header("tiny");
  h.window = 511;
  // 128 query heads over one kv head: at SPLIT 8 the chunk's scores, the per-warp outputs (4 x 128 x 128
  // floats) and the partial take 361472 bytes, over sm_90's 232448.
  h.heads = 128;
  h.kv_heads = 1;
  h.head_dim = 128;
  CHECK_THROWS_WITH_AS(
      make_plan(h, PlanOptions{}),
      "plan: ring_attention needs 361472 bytes of shared memory a CTA for heads = 128 over kv_heads = 1 "
      "(128 a group), head_dim = 128 and window = 511 (SPLIT 8 at 1 streams); sm_90 allows at most "
      "232448",
      Error);
  // 32 a group fits sm_90 but not sm_89's 99 KB (SPLIT 1 there: the whole window's scores in one CTA).
  h.heads = 32;
  PlanOptions o;
  CHECK_NOTHROW(make_plan(h, o));
  o.arch = "sm_89";
  CHECK_THROWS_WITH_AS(make_plan(h, o), doctest::Contains("(SPLIT 1 at 1 streams); sm_89 allows at most 101376"),
                       Error);
  o.arch = "sm_80";
  CHECK_NOTHROW(make_plan(h, o));
  h.heads = 8;
  h.kv_heads = 8;
  h.head_dim = 1024;
  CHECK_THROWS_WITH_AS(make_plan(h, PlanOptions{}), "plan: head_dim = 1024 is above 512, the most ring_attention takes",
                       Error);
  h.head_dim = 512;
  CHECK_NOTHROW(make_plan(h, PlanOptions{}));
}
