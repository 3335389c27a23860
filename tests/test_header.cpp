#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include <tfe/header.h>
#include "head/header_yaml.h"
#include "head/presets.h"

using namespace tfe;

namespace {

std::string emit(const YAML::Node& n) {
  YAML::Emitter e;
  e << n;
  return e.c_str();
}

}  // namespace

TEST_CASE("every preset validates") {
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    CHECK_NOTHROW(validate(preset_header(name)));
  }
}

TEST_CASE("window outside 1..511 is refused by name") {
  auto h = preset_header("tiny");
  h.window = 512;
  CHECK_THROWS_WITH_AS(validate(h), doctest::Contains("window = 512 is outside 1..511"), Error);
  h.window = 0;
  CHECK_THROWS_WITH_AS(validate(h), doctest::Contains("window = 0"), Error);
}

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
