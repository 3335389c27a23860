// The plans the plan tests share: each preset at the golden options (tests/golden).
#pragma once
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tfe/header.h>
#include <tfe/options.h>
#include "head/presets.h"

namespace tfe::test {

// Smaller than the defaults so that the golden files stay readable; every code path is still taken
// (a one-stream bucket, a padded middle one, the 16-row GEMV tile).
inline PlanOptions golden_options() {
  PlanOptions o;
  o.buckets = {1, 4, 16};
  o.max_steps = 4;
  return o;
}

// The golden cases: each preset, and the two full-size ones with an FP8 form for every linear in use.
inline std::vector<std::pair<std::string, HeadHeader>> golden_heads() {
  std::vector<std::pair<std::string, HeadHeader>> out;
  for (const auto& name : preset_names()) out.emplace_back(name, preset_header(name));
  for (const auto* name : {"llama3-8b-eagle3", "tfe-two-stage"}) {
    HeadHeader h = preset_header(name);
    h.fp8 = linears_in_use(h);
    out.emplace_back(std::string(name) + "-fp8", h);
  }
  return out;
}

// `s` with the first `from` replaced by `to`; fails the case where `from` is not in `s`.
inline std::string replace_once(std::string s, std::string_view from, std::string_view to) {
  const auto at = s.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "`" << from << "` not in the text");
  s.replace(at, from.size(), to);
  return s;
}

}  // namespace tfe::test
