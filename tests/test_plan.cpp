#include <doctest/doctest.h>

#include <algorithm>

#include "plan/error.h"
#include "plan/header_yaml.h"
#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "plan/presets.h"

using namespace tfe;

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
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    const Plan p = make_plan(preset_header(name), PlanOptions{}, "ab12");
    const std::string text = dump_plan_yaml(p);
    const Plan q = load_plan_yaml(text);
    CHECK(q == p);
    CHECK(dump_plan_yaml(q) == text);
  }
}
