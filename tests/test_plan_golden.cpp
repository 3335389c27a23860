// The golden plans (tests/golden, README.md there): what a reviewer reads of each preset's plan
// (golden_summary), with the sha256 of the whole dump.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>
#include <utility>

#include <tfe/head_file.h>
#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "head/presets.h"
#include "plan_cases.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::golden_heads;
using tfe::test::golden_options;
using tfe::test::read_text;

namespace {

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

// A preset's golden: the options, tuning, choices, arenas and kernel specs of its plan, the draft
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
    const std::string golden = golden_summary(name, text);
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
    // The whole plan round-trips through its YAML.
    CHECK(load_plan_yaml(text) == plan);
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
