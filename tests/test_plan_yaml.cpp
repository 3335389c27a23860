// The plan YAML: its round trip, its refusals of what is not a plan, the YAML reader's bounds, and
// `tfe-plan dump`.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"
#include <tfe/head_file.h>
#include "head/header_yaml.h"
#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "head/presets.h"
#include "hostile_inputs.h"
#include "plan_cases.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::golden_options;
using tfe::test::read_text;
using tfe::test::replace_once;

TEST_CASE("plan YAML: dump -> load -> equal -> dump equal") {
  // Default options; the full-size presets round-trip in the golden test.
  for (const auto* name : {"tiny", "tiny-two-stage"}) {
    CAPTURE(name);
    const Plan p = make_plan(preset_header(name), PlanOptions{}, {}, "ab12");
    const std::string text = dump_plan_yaml(p);
    const Plan q = load_plan_yaml(text);
    CHECK(q == p);
    CHECK(dump_plan_yaml(q) == text);
  }
}

TEST_CASE("plan YAML: options hold PlanOptions alone, and tuning only the fields off their defaults") {
  const HeadHeader h = preset_header("tiny");
  const std::string plain = dump_plan_yaml(make_plan(h, PlanOptions{}));
  CHECK(plain.find("\ntuning:") == std::string::npos);
  CHECK(plain.find("  attention_split: per_bucket\n  cand_k: 0\n  first_ranks: false\nring_rows:") !=
        std::string::npos);
  Tuning t;
  t.dependent_streams = 2;
  t.rope_in_wqkv = false;
  const Plan p = make_plan(h, PlanOptions{}, t);
  const std::string text = dump_plan_yaml(p);
  CHECK(text.find(
            "  cand_k: 0\n  first_ranks: false\ntuning:\n  dependent_streams: 2\n  rope_in_wqkv: false\nring_rows:") !=
        std::string::npos);
  CHECK(load_plan_yaml(text) == p);
  CHECK(load_plan_yaml(text).tuning == t);
  const auto refused = [&](std::string_view from, std::string_view to, const char* message) {
    CAPTURE(to);
    std::string s = text;
    s.replace(s.find(from), from.size(), to);
    CHECK_THROWS_WITH_AS(load_plan_yaml(s), doctest::Contains(message), Error);
  };
  refused("  dependent_streams: 2\n", "  dependent_streams: 17\n", "tuning.dependent_streams: 17 is outside 0..16");
  refused("  rope_in_wqkv: false\n", "  rope_in_wqkv: false\n  fast: true\n", "unknown key `fast`");
  refused("  rope_in_wqkv: false\n", "  rope_in_wqkv: no\n", "rope_in_wqkv: expected `true` or `false`");
}

TEST_CASE("plan YAML: round trip under varied options and FP8 forms") {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 6; ++trial) {
    const auto names = preset_names();
    HeadHeader h = preset_header(names[rng() % 2]);  // the tiny ones: fast
    for (const auto& l : linears_in_use(h))
      if (rng() % 2) h.fp8.push_back(l);
    PlanOptions o;
    o.buckets.clear();
    for (int b = 1; b <= 16; ++b)
      if (rng() % 4 == 0) o.buckets.push_back(b);
    if (o.buckets.empty()) o.buckets = {static_cast<int>(1 + rng() % 16)};
    o.max_steps = static_cast<int>(1 + rng() % 16);
    o.fp8 = rng() % 2 ? Fp8Mode::automatic : Fp8Mode::off;
    o.max_slots = 16 + static_cast<int>(rng() % 100);
    o.extend_rows = 16 + static_cast<int>(rng() % 2000);
    o.attention_split = rng() % 2 ? AttentionSplit::per_bucket : AttentionSplit::same_drafts;
    if (h.head_type == HeadType::two_stage && rng() % 2) o.cand_k = 1 + static_cast<int>(rng() % h.draft_vocab);
    o.arch = rng() % 2 ? "sm_90" : "sm_100";
    Tuning t;
    t.dependent_streams = static_cast<int>(rng() % 17);
    t.dependent_streams_fp8 = static_cast<int>(rng() % 17);
    t.dependent_safe_nodes = rng() % 2 == 0;
    t.rope_in_wqkv = rng() % 2 == 0;
    t.gemv_cluster = rng() % 2 == 0;
    t.tiled_weights = rng() % 2 == 0;
    const std::string sha = fmt::format("{:016x}", rng());
    const Plan p = make_plan(h, o, t, sha);
    CAPTURE(dump_plan_yaml(p).substr(0, 2000));
    const std::string text = dump_plan_yaml(p);
    const Plan q = load_plan_yaml(text);
    CHECK(q == p);
    CHECK(dump_plan_yaml(q) == text);
  }
}

TEST_CASE("plan YAML: another schema_version is refused naming both versions") {
  const std::string text = dump_plan_yaml(make_plan(preset_header("tiny"), golden_options()));
  const std::string now = fmt::format("schema_version: {}", kPlanSchemaVersion);
  const std::string refusal =
      fmt::format("schema_version 99 is not supported; this build reads schema_version {}", kPlanSchemaVersion);
  CHECK_THROWS_WITH_AS(load_plan_yaml(replace_once(text, now, "schema_version: 99")),
                       doctest::Contains(refusal.c_str()), Error);
  // Checked before anything else: a future plan with other fields is still refused for its version.
  CHECK_THROWS_WITH_AS(load_plan_yaml("schema_version: 99\nsomething_new: 1\n"), doctest::Contains("schema_version 99"),
                       Error);
}

TEST_CASE("plan YAML: corrupted plans are refused by name, never loaded") {
  const std::string text = dump_plan_yaml(make_plan(preset_header("tiny-two-stage"), golden_options()));
  auto refused = [&](std::string_view from, std::string_view to, const char* message) {
    CAPTURE(from);
    CHECK_THROWS_WITH_AS(load_plan_yaml(replace_once(text, from, to)), doctest::Contains(message), Error);
  };
  refused("ring_rows: 20", "ring_rows: 19", "ring_rows = 19 is outside 20..");
  refused("ring_rows: 20", "ring_rows: twenty", "ring_rows: expected an integer, found `twenty`");
  refused("ring_rows: 20\n", "", "missing key `ring_rows`");
  refused("ring_rows: 20", "ring_rows: 20\nring_cols: 3", "unknown key `ring_cols`");
  refused("buffer: slot_g, byte_offset: 0", "buffer: slot_h, byte_offset: 0",
          "node s1.gather_g: arg `src` names buffer `slot_h`, which no arena holds");
  refused("{param: src, kind: buffer", "{param: source, kind: buffer",
          "binds `source`, kernel copy_rows expects `src`");
  // Host memory holds the host arena's buffers only, and they live nowhere else.
  refused("{name: host_tables, role: host", "{name: host_tables, role: activation",
          "buffer `host_tables` of role activation cannot live in the host arena");
  refused("{name: tok, role: activation", "{name: tok, role: host",
          "buffer `tok` of role host cannot live in the arena");
  refused("kind: buffer, buffer: slot_g, byte_offset: 0", "kind: buffer, buffer: slot_g, byte_offset: 99999999",
          "byte_offset 99999999 is outside `slot_g`");
  refused("kind: buffer, buffer: slot_g, byte_offset: 0", "kind: i64, i64: 3", "a ptr parameter cannot take");
  refused("max_steps: 4", "max_steps: 3", "has MAX_STEPS = 4, but the plan's max_steps is 3");
  refused("buckets: [1, 4, 16]", "buckets: [1, 4, 8]", "buckets[2] has streams = 16, options list 8");
  refused("spec: copy_rows__width_64__threads_32", "spec: copy_rows__width_64__threads_64",
          "names spec `copy_rows__width_64__threads_64`, which the plan's specs lack");
  refused("{WIDTH: 64, THREADS: 32}", "{WIDTH: 64, THREADS: 64}", "does not match kernel and constants");
  refused("{name: ring_v, role: state, dtype: BF16, shape: [65, 20, 2, 16], offset: 83200",
          "{name: ring_v, role: state, dtype: BF16, shape: [65, 20, 2, 16], offset: 256",
          "buffers `ring_k` and `ring_v` overlap in the arena");
  refused("role: state, dtype: BF16, shape: [65, 64]", "role: state, dtype: BF16, shape: [65, 65]",
          "buffer `slot_g` has bytes = 8320, its shape and dtype make 8450");
  // The weights' layout is read by name; a tiled matrix changed to rows no longer matches its gemvs.
  refused("from: [wo], layout: tiled", "from: [wo], layout: tiles", "`tiles` is not one of rows, tiled");
  refused("from: [wo], layout: tiled", "from: [wo], layout: rows", "has TILED = 1, but `wo` is rows");
  refused("dtype: F32, shape: [8]", "dtype: F64, shape: [8]", "dtype `F64` is not one of");
  refused("rows: fixed", "rows: some", "`some` is not one of fixed, chunk_rows, chunk_slots");
  refused("f32: 0.25", "f32: .inf", "expected a finite float");
  refused("device_bytes: ", "device_bytes: 1", "device_bytes = 1");
  refused("fp8: auto", "fp8: sometimes", "`sometimes` is not one of auto, off, require");
  refused("head_type: two_stage", "head_type: dense", "cand_k = 16 is set but head_type is dense");
  // The path and the line name the place.
  const std::string bad = replace_once(text, "buffer: slot_g, byte_offset: 0", "buffer: slot_g, byte_offset: -4");
  const int line = 1 + static_cast<int>(std::count(bad.begin(), bad.begin() + bad.find("byte_offset: -4"), '\n'));
  const std::string where = fmt::format("buckets[0].nodes[1].args[0].byte_offset: -4 is outside 0..");
  const std::string at_line = fmt::format("(line {})", line);
  CHECK_THROWS_WITH_AS(load_plan_yaml(bad), doctest::Contains(where.c_str()), Error);
  CHECK_THROWS_WITH_AS(load_plan_yaml(bad), doctest::Contains(at_line.c_str()), Error);
  CHECK_THROWS_WITH_AS(load_plan_yaml(text.substr(0, text.size() / 2)), doctest::Contains("plan YAML"), Error);
  CHECK_THROWS_WITH_AS(load_plan_yaml(""), doctest::Contains("plan YAML"), Error);
  CHECK_THROWS_WITH_AS(load_plan_yaml("[1, 2"), doctest::Contains("not valid YAML"), Error);
}

TEST_CASE("yaml reader: aliases that expand exponentially stop at the visit budget") {
  // 8^12 leaves described in a few hundred bytes.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 12; ++i) {
    bomb += fmt::format("a{}: &a{} [", i, i);
    for (int j = 0; j < 8; ++j) bomb += fmt::format("{}*a{}", j ? ", " : "", i - 1);
    bomb += "]\n";
  }
  yaml::Context ctx{"test YAML"};
  std::function<void(const yaml::Field&)> walk = [&](const yaml::Field& f) {
    if (f.node.IsSequence()) {
      for (const auto& x : f.seq(100)) walk(x);
    } else if (f.node.IsMap()) {
      yaml::Map m(f);
      for (int i = 0; i <= 12; ++i) walk(m.at(fmt::format("a{}", i)));
    }
  };
  CHECK_THROWS_WITH_AS(walk(yaml::parse(ctx, bomb)), doctest::Contains("visits more nodes"), Error);
}

// A mapping of 60000 keys (about 1 MiB) reads in linear time: refused for its first missing key in well
// under a second, where a key-by-key scan for duplicates took minutes.
TEST_CASE("yaml reader: a mapping with many keys is read in linear time") {
  std::string text;
  for (int i = 0; i < 60000; ++i) text += fmt::format("k{}: {}\n", i, i);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(header_from_yaml_text(text), doctest::Contains("missing key `format_version`"), Error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  text += "k17: again\n";
  yaml::Context ctx{"test YAML"};
  CHECK_THROWS_WITH_AS(yaml::Map(yaml::parse(ctx, text)), doctest::Contains("key `k17` appears twice"), Error);
}

// The fuzz target's seeds (tests/fuzz/seeds/fuzz_plan_yaml.cpp), refused by name within seconds: yaml-cpp
// parses the 1 MiB map in about 0.5 s on one free core (over 1 s on a loaded one, and slower under a
// sanitizer), where a reader that scanned the map for each key took minutes.
TEST_CASE("plan YAML: a 1 MiB map of many keys and deep nesting are refused by name in < 3 s") {
  const auto refused_quickly = [](const std::string& text, const char* message) {
    CAPTURE(message);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(load_plan_yaml(text), doctest::Contains(message), Error);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  };
  refused_quickly(test::many_keys_yaml(size_t{1} << 20), "plan YAML: <root>: missing key `schema_version`");
  refused_quickly(test::deep_yaml(1000), "plan YAML: nesting deeper than 499 levels (line 1");
}

TEST_CASE("plan YAML: random corruption of a plan is refused with tfe::Error or loads a valid plan") {
  const std::string text = dump_plan_yaml(make_plan(preset_header("tiny"), golden_options()));
  const uint64_t seed =
      std::getenv("TFE_TEST_SEED") ? std::stoull(std::getenv("TFE_TEST_SEED")) : std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const std::string alphabet = "0123456789-:,[]{}&*!|>'\"\n #abcxyz_.";
  int refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::string s = text;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        default:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
    }
    try {
      const Plan p = load_plan_yaml(s);
      CHECK_NOTHROW(validate(p));  // a harmless edit (e.g. a choice's text) loads a consistent plan
    } catch (const Error&) {
      ++refused;
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("tfe-plan dump: a .tfe and a preset plan as make_plan does") {
  const auto dir = test::temp_dir();
  const std::string head = (dir / "dump_tiny.tfe").string();
  const std::string out = (dir / "dump_tiny.yaml").string();
  const HeadHeader h = preset_header("tiny-two-stage");
  {
    std::mt19937_64 rng(std::random_device{}());
    const auto bytes = test::random_head_bytes(h, rng());
    std::ofstream(head, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string cmd = fmt::format("{} dump {} --buckets 2,8 --max-steps 3 --max-slots 9 --extend-rows 32 -o {}",
                                      TFE_PLAN_EXE, head, out);
  REQUIRE(std::system(cmd.c_str()) == 0);
  PlanOptions o;
  o.buckets = {2, 8};
  o.max_steps = 3;
  o.max_slots = 9;
  o.extend_rows = 32;
  const Plan p = load_plan_yaml(read_text(out));
  CHECK(p == make_plan(h, o, {}, HeadFile::open(head).header_sha256()));
  CHECK(p.head_sha256.size() == 64);
  const std::string bad = fmt::format("{} dump --preset tiny --buckets 1,2,2 -o {} 2> {}", TFE_PLAN_EXE, out,
                                      (dir / "dump_err.txt").string());
  CHECK(std::system(bad.c_str()) != 0);
  CHECK(read_text(dir / "dump_err.txt").find("buckets[2] = 2 follows 2") != std::string::npos);
  // --rope-in-wqkv false: the option reaches the plan, and a head without qk_norm keeps the qk_rope_kv node.
  const std::string off =
      fmt::format("{} dump --preset tiny --buckets 1 --rope-in-wqkv false -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(off.c_str()) == 0);
  PlanOptions one_bucket;
  one_bucket.buckets = {1};
  Tuning no_fold;
  no_fold.rope_in_wqkv = false;
  const Plan q = load_plan_yaml(read_text(out));
  CHECK(q == make_plan(preset_header("tiny"), one_bucket, no_fold));
  CHECK(std::any_of(q.buckets[0].nodes.begin(), q.buckets[0].nodes.end(),
                    [](const Node& n) { return n.name == "s1.qk_rope_kv"; }));
  // --gemv-cluster false: tfe-two-stage's FP8 lr_a stays a plain gemv.
  const std::string plain = fmt::format(
      "{} dump --preset tfe-two-stage --preset-fp8 --buckets 1 --gemv-cluster false -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(plain.c_str()) == 0);
  const Plan r = load_plan_yaml(read_text(out));
  CHECK_FALSE(r.tuning.gemv_cluster);
  CHECK(std::none_of(r.specs.begin(), r.specs.end(), [](const KernelSpec& k) { return k.kernel == "gemv_cluster"; }));
  CHECK(std::any_of(r.specs.begin(), r.specs.end(), [](const KernelSpec& k) { return k.kernel == "gemv"; }));
  // --tiled-weights false: every matrix row-major, every gemv TILED 0, and no wkv copy.
  const std::string rows =
      fmt::format("{} dump --preset tiny --buckets 1 --tiled-weights false -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(rows.c_str()) == 0);
  const Plan t = load_plan_yaml(read_text(out));
  CHECK_FALSE(t.tuning.tiled_weights);
  CHECK(std::none_of(t.weights.buffers.begin(), t.weights.buffers.end(),
                     [](const Buffer& b) { return b.layout == Layout::tiled; }));
  CHECK(t.weights.find("wkv") == nullptr);
  CHECK(std::all_of(t.specs.begin(), t.specs.end(),
                    [](const KernelSpec& k) { return !k.kernel.starts_with("gemv") || k.constant("TILED") == 0; }));
  // --attention-split same_drafts: one ring_attention specialization for every bucket.
  const std::string one_split =
      fmt::format("{} dump --preset llama3-8b-eagle3 --attention-split same_drafts -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(one_split.c_str()) == 0);
  const Plan a = load_plan_yaml(read_text(out));
  CHECK(a.options.attention_split == AttentionSplit::same_drafts);
  const auto attention = [](const KernelSpec& k) { return k.kernel == "ring_attention"; };
  CHECK(std::count_if(a.specs.begin(), a.specs.end(), attention) == 1);
  // --dependent-safe-nodes false: no node of a bucket above dependent_streams (4) launches dependent.
  const std::string no_safe = fmt::format(
      "{} dump --preset llama3-8b-eagle3 --buckets 4,8 --dependent-safe-nodes false -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(no_safe.c_str()) == 0);
  const Plan d = load_plan_yaml(read_text(out));
  CHECK_FALSE(d.tuning.dependent_safe_nodes);
  const auto dependent = [](const Node& n) { return n.dependent; };
  CHECK(std::all_of(d.buckets[0].nodes.begin(), d.buckets[0].nodes.end(), dependent));
  CHECK(std::none_of(d.buckets[1].nodes.begin(), d.buckets[1].nodes.end(), dependent));
}

TEST_CASE("tfe-plan dump --preset-fp8: the preset with the FP8 forms random --fp8 writes") {
  const auto dir = test::temp_dir();
  const std::string out = (dir / "dump_preset_fp8.yaml").string();
  const std::string cmd =
      fmt::format("{} dump --preset tiny-two-stage --preset-fp8 --fp8 require -o {}", TFE_PLAN_EXE, out);
  REQUIRE(std::system(cmd.c_str()) == 0);
  const Plan p = load_plan_yaml(read_text(out));
  CHECK(p.fp8);
  HeadHeader h = preset_header("tiny-two-stage");
  CHECK(p.header.fp8 == linears_in_use(h));  // every linear in use, in that order
  // Without the flag a preset has no FP8 forms, so `require` is refused naming a linear.
  const std::string bad = fmt::format("{} dump --preset tiny-two-stage --fp8 require -o {} 2> {}", TFE_PLAN_EXE, out,
                                      (dir / "dump_fp8_err.txt").string());
  CHECK(std::system(bad.c_str()) != 0);
  CHECK(read_text(dir / "dump_fp8_err.txt").find("fp8 = require, but the head has no FP8 form for fc") !=
        std::string::npos);
}
