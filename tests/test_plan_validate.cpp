// validate(): a plan edited out of shape is refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <vector>
#include <utility>

#include "core/error.h"
#include "plan/plan.h"
#include "head/presets.h"
#include "plan_cases.h"
#include "plan_edits.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::check_refused;
using tfe::test::golden_options;
using tfe::test::node_arg;
using tfe::test::plan_node;

namespace {
// The tiny preset with every linear in its FP8 form, planned and valid: the plan the refusal cases edit.
Plan valid_fp8_tiny_plan() {
  HeadHeader h = preset_header("tiny");
  h.fp8 = linears_in_use(h);
  const Plan plan = make_plan(h, golden_options());
  REQUIRE(plan.fp8);
  CHECK_NOTHROW(validate(plan));
  return plan;
}
}  // namespace

TEST_CASE(
    "validate: a node whose buffers are smaller than its kernel reaches, or whose launch, rows, step, "
    "position offset or strides are not its kernel's, is refused by name") {
  const Plan good = valid_fp8_tiny_plan();
  // Nodes of the last bucket (16 streams) or the extend.
  const auto find = plan_node;
  const auto param = node_arg;
  auto refused = [&](const char* what, const std::function<void(Plan&)>& edit, const char* message) {
    check_refused(good, what, edit, message);
  };
  // 16 rows of the SwiGLU's ffn-wide output do not fit h1's 16 rows of hidden.
  refused(
      "a gemv output bound to a smaller buffer", [&](Plan& p) { param(find(p, "s1.w_gate_up"), "y").buffer = "h1"; },
      "node s1.w_gate_up arg `y`: kernel gemv reaches");
  refused(
      "an input read past its buffer's end", [&](Plan& p) { param(find(p, "s2.wo"), "x").byte_offset = 256; },
      "node s2.wo arg `x`: kernel gemv reaches");
  refused(
      "an FP8 gemv without its row scales",
      [&](Plan& p) {
        Arg& a = param(find(p, "s1.wqkv"), "scale");
        a.kind = Arg::Kind::null;
        a.buffer.clear();
      },
      "node s1.wqkv arg `scale` is null, but kernel gemv_rope_kv reaches");
  refused(
      "a grid wider than the kernel's mapping", [&](Plan& p) { ++find(p, "s1.lm_head").launch.grid[0]; },
      "node s1.lm_head: launch grid");
  // load_tables reads one slot id a row: host_tables of half the bucket's rows is refused.
  refused(
      "the draft's slot ids for half the rows",
      [&](Plan& p) {
        for (Buffer& b : p.host.buffers)
          if (b.name == "host_tables") {
            b.shape = {b.shape[0] / 2};
            b.bytes /= 2;
          }
      },
      "node s1.load_tables arg `ids`: kernel load_tables reaches 64 bytes");
  // ... and each slot's state in one 16-byte load: slot_state moved 4 bytes on (alignment 4, still within
  // the arena and overlapping nothing) is refused.
  refused(
      "the slots' state 4 bytes off a 16-byte row",
      [&](Plan& p) {
        for (Buffer& b : p.arena.buffers)
          if (b.name == "slot_state") {
            b.alignment = 4;
            b.offset += 4;
          }
      },
      "loads it in 16-byte units, but `slot_state` offset");
  // A plan made for sm_80 (attention in one CTA a cluster, the GEMV's 96 KB ring within 163 KB), whose
  // attention node is then made to ask for more than sm_80's 163 KB.
  {
    PlanOptions sm80 = golden_options();
    sm80.arch = "sm_80";
    Plan p = make_plan(good.header, sm80);
    CHECK_NOTHROW(validate(p));
    find(p, "s1.attention").launch.smem = 200 * 1024;
    const char* refusal = "node s1.attention: 204800 bytes of dynamic shared memory a CTA; sm_80 allows at most 166912";
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(refusal), Error);
  }
  // Sets constant `name` of every spec of `kernel`.
  const auto set_constant = [](Plan& p, std::string_view kernel, std::string_view name, int64_t value) {
    for (KernelSpec& spec : p.specs)
      if (spec.kernel == kernel)
        for (auto& [n, v] : spec.constants)
          if (n == name) v = value;
  };
  refused(
      "a ring_attention head_dim over the kernel's limit",
      [&](Plan& p) { set_constant(p, "ring_attention", "HEAD_DIM", 1024); },
      "HEAD_DIM = 1024 is above 512, the most ring_attention takes");
  // A cluster kernel's SPLIT is its cluster: the portable 8 at most, and 1 below sm_90.
  refused(
      "a ring_attention cluster over the portable size",
      [&](Plan& p) { set_constant(p, "ring_attention", "SPLIT", 9); },
      "SPLIT = 9 is above 8, the most CTAs a cluster takes on sm_90");
  refused(
      "a ring_attention cluster below sm_90",
      [&](Plan& p) {
        p.options.arch = "sm_80";
        set_constant(p, "ring_attention", "SPLIT", 2);
      },
      "SPLIT = 2 is above 1, the most CTAs a cluster takes on sm_80");
  const Plan two_stage = make_plan(preset_header("tiny-two-stage"), golden_options());
  CHECK_NOTHROW(validate(two_stage));
  for (const auto& [what, name, value, message] :
       std::vector<std::tuple<const char*, const char*, int64_t, const char*>>{
           {"a topk cluster over the portable size", "SPLIT", 9, "SPLIT = 9 is above 8, the most CTAs a cluster"},
           {"topk asked for more candidates than scores", "CAND_K", 1 << 20, "CAND_K = 1048576 is above VOCAB"}}) {
    CAPTURE(what);
    Plan p = two_stage;
    set_constant(p, "topk", name, value);
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(message), Error);
  }
  refused(
      "a block other than the kernel's", [&](Plan& p) { find(p, "s1.attention").launch.block = 256; },
      "is not kernel ring_attention's for 16 rows");
  refused(
      "rows other than the bucket's", [&](Plan& p) { param(find(p, "s1.final_norm"), "rows").i = 17; },
      "node s1.final_norm arg `rows` = 17, but the node is launched for 16 rows");
  refused(
      "a step past MAX_STEPS", [&](Plan& p) { param(find(p, "s4.top1"), "step").i = 5; },
      "node s4.top1 arg `step` = 5");
  refused(
      "a step other than the node's", [&](Plan& p) { param(find(p, "s2.top1"), "step").i = 3; },
      "node s2.top1 arg `step` = 3");
  refused(
      "a node past max_steps", [&](Plan& p) { find(p, "s4.wo").step = 5; }, "node s4.wo has step 5, outside 1..4");
  refused(
      "a negative position offset", [&](Plan& p) { param(find(p, "s1.wqkv"), "pos_offset").i = -1; },
      "arg `pos_offset` = -1 is outside 0..3");
  refused(
      "a ring write past the ring", [&](Plan& p) { param(find(p, "s2.wqkv"), "ring_v").byte_offset = 256; },
      "node s2.wqkv arg `ring_v`: kernel gemv_rope_kv reaches");
  // gemv_cluster's CSPLIT is its cluster, and every warp of the cluster needs a K step of its own.
  HeadHeader fp8_two_stage = preset_header("tfe-two-stage");
  fp8_two_stage.fp8 = linears_in_use(fp8_two_stage);
  PlanOptions one_bucket;
  one_bucket.buckets = {1};
  const Plan clustered = make_plan(fp8_two_stage, one_bucket);
  CHECK_NOTHROW(validate(clustered));
  for (const auto& [value, message] : std::vector<std::pair<int64_t, const char*>>{
           {16, "CSPLIT = 16 is above 8, the most CTAs a cluster takes on sm_90"},
           {8, "CSPLIT = 8 is above 4, the most this shape's K splits into"}}) {
    Plan p = clustered;
    set_constant(p, "gemv_cluster", "CSPLIT", value);
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(message), Error);
  }
  Plan ampere = clustered;  // below sm_90 no kernel declares a cluster
  ampere.options.arch = "sm_80";
  CHECK_THROWS_WITH_AS(validate(ampere),
                       doctest::Contains("CSPLIT = 4 is above 1, the most CTAs a cluster takes on sm_80"), Error);
  refused(
      "a gemv_rope_kv head_dim that splits rotate-half pairs across tiles",
      [&](Plan& p) { set_constant(p, "gemv_rope_kv", "HEAD_DIM", 24); }, "HEAD_DIM = 24 is not a multiple of 16");
  refused(
      "a row stride below the width", [&](Plan& p) { param(find(p, "s1.post_norm"), "x_stride").i = 1; },
      "arg `x_stride` = 1 is outside");
  refused(
      "rows copied through a table of positions",
      [&](Plan& p) { param(find(p, "s1.gather_g"), "src_index").buffer = "pos"; }, "which is neither a slot table");
  refused(
      "an extend node launched past its chunk", [&](Plan& p) { ++find(p, "extend.kv").launch.grid[1]; },
      "node extend.kv: launch grid");
  // A bf16 plan's extend runs its linears through cuBLASLt: a chunk's rows must fit both operands.
  Plan bf16 = make_plan(preset_header("tiny"), golden_options());
  Node* fc = nullptr;
  for (Node& n : bf16.extend)
    if (n.name == "extend.fc") fc = &n;
  REQUIRE(fc != nullptr);
  REQUIRE(fc->kind == Node::Kind::gemm);
  fc->gemm.y = "g";  // 16 rows of [hidden], the draft's; a chunk takes up to extend_rows
  CHECK_THROWS_WITH_AS(validate(bf16), doctest::Contains("gemm node extend.fc: `g` holds 16 rows, a chunk takes up to"),
                       Error);
  // Spec constants: sizes from 1 (some divide), switches within their values, nothing near int64's range.
  auto constant = [](Plan& p, std::string_view kernel, std::string_view name) -> int64_t& {
    for (KernelSpec& s : p.specs)
      if (s.kernel == kernel)
        for (auto& [k, v] : s.constants)
          if (k == name) return v;
    FAIL("no constant " << name);
    throw std::logic_error("unreachable");
  };
  refused(
      "a join whose output layout is not the plan's max_steps",
      [&](Plan& p) {
        constant(p, "top1", "MAX_STEPS") = 8;
        for (Bucket& b : p.buckets)
          for (Node& n : b.nodes)
            if (n.name.ends_with(".top1")) n.spec = "top1__vocab_300__cols_16__max_steps_8";
      },
      "has MAX_STEPS = 8, but the plan's max_steps is 4");
  refused(
      "a top1 spec of 0 columns", [&](Plan& p) { constant(p, "top1", "COLS") = 0; }, "COLS = 0 is outside 1..16777216");
  refused(
      "an unknown epilogue", [&](Plan& p) { constant(p, "gemv", "EPILOGUE") = 5; }, "EPILOGUE = 5 is outside 0..4");
  // The outputs' copy to host memory has the layout the runtime reads, and only a draft pass ends.
  refused(
      "a store_outputs of another step count", [&](Plan& p) { constant(p, "store_outputs", "MAX_STEPS") = 8; },
      "store_outputs__max_steps_8 has MAX_STEPS = 8, but the plan's max_steps is 4");
  refused(
      "a last_step_only extend node", [&](Plan& p) { p.extend.front().last_step_only = true; },
      "is last_step_only; only draft nodes may be");
  refused(
      "a width past the constants' range", [&](Plan& p) { constant(p, "rmsnorm", "WIDTH") = int64_t{1} << 40; },
      "WIDTH = 1099511627776 is outside 1..16777216");
}

TEST_CASE("validate: an extend node naming a spec the plan lacks is refused by name, first or last") {
  const Plan good = make_plan(preset_header("tiny"), golden_options());
  REQUIRE(good.extend.size() >= 2);
  check_refused(
      good, "the first extend node", [](Plan& p) { p.extend.front().spec = "nope"; },
      "names spec `nope`, which the plan's specs lack");
  check_refused(
      good, "the last extend node", [](Plan& p) { p.extend.back().spec = "nope"; },
      "names spec `nope`, which the plan's specs lack");
}

TEST_CASE("validate: a kernel argument bound to a buffer of another dtype or role is refused by name") {
  const Plan good = valid_fp8_tiny_plan();
  const auto find = plan_node;
  const auto param = node_arg;
  auto refused = [&](const char* what, const std::function<void(Plan&)>& edit, const char* message) {
    check_refused(good, what, edit, message);
  };
  // Each buffer is large enough for what the kernel reaches, so only its dtype or role is wrong.
  refused(
      "an e4m3 matrix read as a bf16 norm weight", [&](Plan& p) { param(find(p, "s1.final_norm"), "w").buffer = "wo"; },
      "node s1.final_norm arg `w`: buffer `wo` is F8_E4M3, but kernel rmsnorm takes BF16 there");
  refused(
      "a bf16 matrix read by an FP8 gemv", [&](Plan& p) { param(find(p, "s1.wo"), "w").buffer = "embed"; },
      "node s1.wo arg `w`: buffer `embed` is BF16, but kernel gemv takes F8_E4M3 there");
  refused(
      "bf16 activations read as top1 records", [&](Plan& p) { param(find(p, "s1.top1"), "part").buffer = "m"; },
      "node s1.top1 arg `part`: buffer `m` is BF16, but kernel top1 takes F32 there");
  refused(
      "token ids read as rows", [&](Plan& p) { param(find(p, "s1.post_norm"), "x").buffer = "slot"; },
      "node s1.post_norm arg `x`: buffer `slot` is I32, but kernel rmsnorm takes BF16 there");
  refused(
      "a weight read as a gemv's x", [&](Plan& p) { param(find(p, "s1.wo"), "x").buffer = "embed"; },
      "node s1.wo arg `x`: buffer `embed` has role weight, but kernel gemv takes state, table, activation or output "
      "there");
  refused(
      "an activation as the key ring", [&](Plan& p) { param(find(p, "s1.attention"), "ring_k").buffer = "x"; },
      "node s1.attention arg `ring_k`: buffer `x` has role activation, but kernel ring_attention takes state there");
  refused(
      "the draft map read from host memory", [&](Plan& p) { param(find(p, "s1.top1"), "d2t").buffer = "host_tables"; },
      "node s1.top1 arg `d2t`: buffer `host_tables` has role host, but kernel top1 takes weight there");
  refused(
      "the outputs' host copy written into the arena",
      [&](Plan& p) { param(find(p, "s1.store_outputs"), "host_token").buffer = "next_token"; },
      "node s1.store_outputs arg `host_token`: buffer `next_token` has role activation, but kernel store_outputs "
      "takes host there");
}

TEST_CASE(
    "validate: a draft pass must begin with load_tables of host_tables and end every step with its "
    "store_outputs to host_token, host_conf and host_done, and an extend must begin with gather_taps and end with "
    "keep_state") {
  const Plan good = make_plan(preset_header("tiny"), golden_options());
  CHECK_NOTHROW(validate(good));
  const auto nodes = [](Plan& p) -> std::vector<Node>& { return p.buckets.back().nodes; };
  const auto find = plan_node;
  const auto param = node_arg;
  auto refused = [&](const char* what, const std::function<void(Plan&)>& edit, const char* message) {
    check_refused(good, what, edit, message);
  };
  // Each edit keeps every node's own checks (reach, alignment, launch) satisfied: only the pass's contract
  // with the runtime is broken.
  refused(
      "the slot ids read from another host buffer",
      [&](Plan& p) { param(find(p, "s1.load_tables"), "ids").buffer = "host_token"; },
      "bucket 16 node s1.load_tables: `ids` must bind host buffer `host_tables` at byte_offset 0, which "
      "the runtime writes before the launch");
  refused(
      "slot ids checked against another max_slots",
      [&](Plan& p) {
        for (auto& b : p.buckets) param(b.nodes.front(), "max_slots").i += 1;
      },
      "`max_slots` = 65, the plan's max_slots is 64");
  refused(
      "an extend that keeps no state", [&](Plan& p) { p.extend.pop_back(); },
      "the extend pass must end with keep_state");
  refused(
      "an extend that gathers device rows after the tap norms", [&](Plan& p) { std::swap(p.extend[0], p.extend[1]); },
      "the extend pass must begin with gather_taps");
  refused(
      "the completion word written into the outputs",
      [&](Plan& p) { param(find(p, "s3.store_outputs"), "host_done").buffer = "host_token"; },
      "bucket 16 node s3.store_outputs: `host_done` must bind host buffer `host_done`");
  refused(
      "a pass that reads the tables after its first node", [&](Plan& p) { std::swap(nodes(p)[0], nodes(p)[1]); },
      "bucket 16: the pass begins with node s1.gather_g (kernel copy_rows); it must begin with load_tables");
  // Run in every longer pass, step 2's store_outputs would set host_done while steps 3 and 4 still run.
  refused(
      "a store_outputs in every pass", [&](Plan& p) { find(p, "s2.store_outputs").last_step_only = false; },
      "bucket 16 node s2.store_outputs: store_outputs is not last_step_only");
  refused(
      "another node left out of longer passes", [&](Plan& p) { find(p, "s2.top1").last_step_only = true; },
      "bucket 16 node s2.top1: only store_outputs may be last_step_only");
  refused(
      "a step without its store_outputs",
      [&](Plan& p) {
        auto& n = nodes(p);
        n.erase(std::find_if(n.begin(), n.end(), [](const Node& x) { return x.name == "s3.store_outputs"; }));
      },
      "a node other than store_outputs ends step 3");
  refused(
      "a store_outputs before its step's last node",
      [&](Plan& p) {
        auto& n = nodes(p);
        const auto at = std::find_if(n.begin(), n.end(), [](const Node& x) { return x.name == "s2.store_outputs"; });
        std::iter_swap(at, at - 1);
      },
      "bucket 16 node s2.store_outputs: store_outputs does not end step 2");
}

TEST_CASE("validate: the buffers the runtime reads and writes itself are refused by name when not as it uses them") {
  const Plan good = make_plan(preset_header("tiny"), golden_options());
  const auto buffer = [](Arena& a, std::string_view name) -> Buffer& {
    const auto b = std::find_if(a.buffers.begin(), a.buffers.end(), [&](const Buffer& x) { return x.name == name; });
    REQUIRE(b != a.buffers.end());
    return *b;
  };
  // One more element of a host buffer: still what every kernel reaches, but not what the host reads.
  const auto widen = [&](Plan& p, std::string_view name) {
    Buffer& b = buffer(p.host, name);
    b.shape = {2};
    b.bytes = 2 * dtype_size(b.dtype);
    p.host.bytes = std::max(p.host.bytes, b.offset + b.bytes);
  };
  check_refused(
      good, "host_done of two words", [&](Plan& p) { widen(p, "host_done"); },
      "plan: host buffer `host_done` holds 8 bytes; the pass's completion word is one int32");
  check_refused(
      good, "host_error of two records", [&](Plan& p) { widen(p, "host_error"); },
      "plan: host buffer `host_error` holds 16 bytes; the error record is one int64");
  // An extend chunk's tables upload as one copy from row_slot to taps.
  check_refused(
      good, "row_pos before row_slot",
      [&](Plan& p) {
        Buffer& slot = buffer(p.arena, "row_slot");
        Buffer& pos = buffer(p.arena, "row_pos");
        REQUIRE(slot.bytes == pos.bytes);
        std::swap(slot.offset, pos.offset);
      },
      "plan: table `row_pos` is not between row_slot and taps");
}
