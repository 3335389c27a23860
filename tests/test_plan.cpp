#include <chrono>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <span>
#include <tuple>

#include "kernels/registry.h"
#include "core/error.h"
#include <tfe/head_file.h>
#include "head/header_yaml.h"
#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "head/presets.h"
#include "hostile_inputs.h"
#include "plan_edits.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::check_refused;
using tfe::test::node_arg;
using tfe::test::plan_node;
using tfe::test::read_text;

namespace {

std::string emit(const YAML::Node& n) {
  YAML::Emitter e;
  e << n;
  return e.c_str();
}

}  // namespace

TEST_CASE("header YAML: every preset round-trips exactly") {
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    auto h = preset_header(name);
    if (name == "tfe-two-stage") h.fp8 = {"wq", "wk", "wv", "target_head"};
    const std::string text = emit(header_to_yaml(h));
    CHECK(header_from_yaml_text(text) == h);
  }
}

TEST_CASE("header YAML: missing, unknown and mistyped keys are refused by name and line") {
  const std::string good = emit(header_to_yaml(preset_header("tiny")));
  auto replace = [&](std::string_view from, std::string_view to) {
    std::string s = good;
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    return s;
  };
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160\n", "")), doctest::Contains("missing key `ffn`"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160", "ffn: 160\nfnn: 3")),
                       doctest::Contains("unknown key `fnn`"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160", "ffn: 16O")),
                       doctest::Contains("ffn: expected an integer, found `16O`"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("qk_norm: false", "qk_norm: maybe")),
                       doctest::Contains("qk_norm: expected `true` or `false`"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("layer: final", "layer: last")),
                       doctest::Contains("taps[2].layer: expected an integer, found `last`"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("rms_eps: 1e-06", "rms_eps: .nan")),
                       doctest::Contains("rms_eps: expected a finite float"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("window: 15", "window: 600")),
                       doctest::Contains("window = 600 is outside 1..511"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("rms_eps: 1e-06", "rms_eps: 1e-300")),
                       doctest::Contains("rms_eps: `1e-300` does not fit a 32-bit float"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("window: 15", "window: 4294967296")),
                       doctest::Contains("window: 4294967296 is outside 1..511"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("vocab: 1000", "vocab: 99999999999999999999")),
                       doctest::Contains("vocab: 99999999999999999999 is outside 1..16777216"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160", "ffn: 160\n\"f\\x1b[2Jn\\x07\": 3")),
                       doctest::Contains("unknown key `f\\x1b[2Jn\\x07`"), Error);
  // yaml-cpp's own message for this is "bad file".
  const std::string deep = "ffn: " + std::string(600, '[') + "1" + std::string(600, ']');
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160", deep)),
                       doctest::Contains("header YAML: nesting deeper than 499 levels (line"), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(replace("ffn: 160", "ffn: 160\nffn: 161")),
                       doctest::Contains("key `ffn` appears twice"), Error);
  // The line of the offending key is named.
  const auto bad = replace("ffn: 160", "ffn: [1]");
  const int line = 1 + static_cast<int>(std::count(bad.begin(), bad.begin() + bad.find("ffn:"), '\n'));
  const std::string where = fmt::format("(line {})", line);
  CHECK_THROWS_WITH_AS(header_from_yaml_text(bad), doctest::Contains(where.c_str()), Error);
  CHECK_THROWS_WITH_AS(header_from_yaml_text("{a: [}"), doctest::Contains("not valid YAML"), Error);
}

TEST_CASE("make_plan: every preset plans and validates") {
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    const Plan p = make_plan(preset_header(name), PlanOptions{});
    CHECK_NOTHROW(validate(p));
    CHECK(p.buckets.size() == 5);
  }
}

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
  CHECK(plain.find("  attention_split: per_bucket\n  cand_k: 0\nring_rows:") != std::string::npos);
  Tuning t;
  t.dependent_streams = 2;
  t.rope_in_wqkv = false;
  const Plan p = make_plan(h, PlanOptions{}, t);
  const std::string text = dump_plan_yaml(p);
  CHECK(text.find("  cand_k: 0\ntuning:\n  dependent_streams: 2\n  rope_in_wqkv: false\nring_rows:") !=
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

namespace {

// Smaller than the defaults so that the golden files stay readable; every code path is still taken
// (a one-stream bucket, a padded middle one, the 16-row GEMV tile).
PlanOptions golden_options() {
  PlanOptions o;
  o.buckets = {1, 4, 16};
  o.max_steps = 4;
  return o;
}

// The golden cases: each preset, and the two full-size ones with an FP8 form for every linear in use.
std::vector<std::pair<std::string, HeadHeader>> golden_heads() {
  std::vector<std::pair<std::string, HeadHeader>> out;
  for (const auto& name : preset_names()) out.emplace_back(name, preset_header(name));
  for (const auto* name : {"llama3-8b-eagle3", "tfe-two-stage"}) {
    HeadHeader h = preset_header(name);
    h.fp8 = linears_in_use(h);
    out.emplace_back(std::string(name) + "-fp8", h);
  }
  return out;
}

std::string replace_once(std::string s, std::string_view from, std::string_view to) {
  const auto at = s.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "`" << from << "` not in the text");
  s.replace(at, from.size(), to);
  return s;
}

const Buffer& buffer_of(const Plan& p, const std::string& name) {
  if (const Buffer* b = p.weights.find(name)) return *b;
  if (const Buffer* b = p.host.find(name)) return *b;
  return p.arena.at(name);
}

}  // namespace

namespace {

// The golden plans (tests/golden, README.md there): the tiny presets' whole dumped plans; for the full-size
// presets, what a reviewer reads of theirs (golden_summary), with the sha256 of the whole dump.
bool full_golden(const std::string& name) { return name.starts_with("tiny"); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

// A dumped plan's top-level sections in order, each its key and its lines verbatim.
std::vector<std::pair<std::string, std::string>> top_level_sections(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& line : lines_of(text)) {
    if (!line.empty() && line[0] != ' ') out.emplace_back(line.substr(0, line.find(':')), "");
    REQUIRE(!out.empty());
    out.back().second += line + "\n";
  }
  return out;
}

// A full-size preset's golden: the options, tuning, choices, arenas and kernel specs of its plan, the draft
// pass of its first (1-stream) bucket, and the sha256 of the whole dump, which covers the header, the other
// buckets and the extend.
std::string golden_summary(const std::string& name, const std::string& text) {
  const bool fp8 = name.ends_with("-fp8");
  const std::string preset = fp8 ? name.substr(0, name.size() - 4) : name;
  std::string out = fmt::format(
      "# tfe-plan dump --preset {}{} --buckets 1,4,16 --max-steps 4\n"
      "# less its head, extend and buckets past the first; plan_sha256: the whole dump's (tests/golden/README.md)\n",
      preset, fp8 ? " --preset-fp8" : "");
  out += fmt::format("plan_sha256: {}\n", sha256_hex(std::as_bytes(std::span(text.data(), text.size()))));
  for (const auto& [key, section] : top_level_sections(text)) {
    if (key == "head" || key == "extend") continue;
    if (key != "buckets") {
      out += section;
      continue;
    }
    const size_t second = section.find("\n  - streams:", section.find("  - streams:") + 1);
    out += section.substr(0, second == std::string::npos ? std::string::npos : second + 1);
  }
  return out;
}

// The first difference between two texts, as a unified diff's hunk: up to three lines of context, the
// stored lines (-) and the new ones (+) that differ, at most eight of each.
std::string first_difference(const std::string& stored, const std::string& now) {
  const auto a = lines_of(stored), b = lines_of(now);
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  size_t ea = a.size(), eb = b.size();
  while (ea > i && eb > i && a[ea - 1] == b[eb - 1]) --ea, --eb;
  std::string out = fmt::format("@@ -{},{} +{},{} @@\n", i + 1, ea - i, i + 1, eb - i);
  for (size_t k = i < 3 ? 0 : i - 3; k < i; ++k) out += " " + a[k] + "\n";
  const auto side = [&](const std::vector<std::string>& v, size_t end, char sign) {
    for (size_t k = i; k < end && k < i + 8; ++k) out += sign + v[k] + "\n";
    if (end > i + 8) out += fmt::format("{} ... {} more lines\n", sign, end - i - 8);
  };
  side(a, ea, '-');
  side(b, eb, '+');
  for (size_t k = eb; k < b.size() && k < eb + 3; ++k) out += " " + b[k] + "\n";
  return out;
}

}  // namespace

TEST_CASE("plan golden: each preset's plan YAML, or what a reviewer reads of it and its sha256, is the stored one") {
  const std::filesystem::path dir = std::filesystem::path(TFE_SOURCE_DIR) / "tests" / "golden";
  const bool update = std::getenv("TFE_UPDATE_GOLDEN") != nullptr;
  const std::string regenerate =
      "if the change is intended, regenerate with TFE_UPDATE_GOLDEN=1 (tests/golden/README.md) and review the diff";
  for (const auto& [name, header] : golden_heads()) {
    CAPTURE(name);
    const Plan plan = make_plan(header, golden_options());
    const std::string text = dump_plan_yaml(plan);
    const std::string golden = full_golden(name) ? text : golden_summary(name, text);
    const auto path = dir / (name + ".yaml");
    if (update) {
      std::filesystem::create_directories(dir);
      std::ofstream(path, std::ios::binary) << golden;
    }
    REQUIRE_MESSAGE(std::filesystem::exists(path), path.string() << " is missing; regenerate with TFE_UPDATE_GOLDEN=1");
    const std::string stored = read_text(path);
    // The readable part first, so that a change there shows as its lines; the sha256 apart from it.
    const auto without_sha = [](std::string s) {
      const std::string key = "\nplan_sha256: ";
      const size_t at = s.find(key);
      return at == std::string::npos ? s : s.replace(at + key.size(), s.find('\n', at + 1) - at - key.size(), "-");
    };
    if (without_sha(stored) != without_sha(golden))
      FAIL_CHECK("the plan of " << name << " differs from " << path.string() << ":\n"
                                << first_difference(without_sha(stored), without_sha(golden)) << regenerate);
    else if (stored != golden)
      FAIL_CHECK(
          "the plan of " << name << " differs from " << path.string()
                         << " outside what it stores (the sha256 of the whole dump changed: the header, a bucket "
                            "past the first or the extend); diff `tfe-plan dump` against the previous tree's; "
                         << regenerate);
    // The whole plan round-trips through its YAML; a full golden loads as the plan itself.
    CHECK(load_plan_yaml(text) == plan);
    if (full_golden(name)) CHECK(load_plan_yaml(stored) == plan);
  }
}

TEST_CASE("plan golden: a changed plan is reported by its first differing lines") {
  CHECK(first_difference("a\nb\nc\nd\ne\n", "a\nb\nC\nd\ne\n") == "@@ -3,1 +3,1 @@\n a\n b\n-c\n+C\n d\n e\n");
  CHECK(first_difference("a\nb\n", "a\nb\nc\n") == "@@ -3,0 +3,1 @@\n a\n b\n+c\n");
  // A summary keeps a plan's sections but its head and extend, and its first bucket alone.
  const std::string text = dump_plan_yaml(make_plan(preset_header("tiny"), golden_options()));
  const std::string summary = golden_summary("tiny", text);
  CHECK(summary.find("\nplan_sha256: ") != std::string::npos);
  CHECK(summary.find("\noptions:\n") != std::string::npos);
  CHECK(summary.find("\nspecs:\n") != std::string::npos);
  CHECK(summary.find("\nhead:") == std::string::npos);
  CHECK(summary.find("\nextend:") == std::string::npos);
  CHECK(summary.find("  - streams: 1\n") != std::string::npos);
  CHECK(summary.find("  - streams: 4\n") == std::string::npos);
  CHECK(summary.ends_with("\n"));
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
  CHECK_THROWS_WITH_AS(load_plan_yaml(replace_once(dense, "cand_k: 0\nring_rows", "cand_k: 4\nring_rows")),
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
  const KernelSpec load = make_spec("load_tables", {});
  CHECK(launch_shape(load, 128).block == 128);
  CHECK_THROWS_WITH_AS(launch_shape(load, 129), doctest::Contains("rows is 129; load_tables fills at most 128"), Error);
}

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

TEST_CASE(
    "validate: a node whose buffers are smaller than its kernel reaches, or whose launch, rows, step, "
    "position offset or strides are not its kernel's, is refused by name") {
  HeadHeader fp8_head = preset_header("tiny");
  fp8_head.fp8 = linears_in_use(fp8_head);
  const Plan good = make_plan(fp8_head, golden_options());
  REQUIRE(good.fp8);
  CHECK_NOTHROW(validate(good));
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
    Plan p = make_plan(fp8_head, sm80);
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
  HeadHeader fp8_head = preset_header("tiny");
  fp8_head.fp8 = linears_in_use(fp8_head);
  const Plan good = make_plan(fp8_head, golden_options());
  REQUIRE(good.fp8);
  CHECK_NOTHROW(validate(good));
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
