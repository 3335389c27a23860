#include <doctest/doctest.h>

#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tfe/accept_log.h>
#include "test_util.h"

using namespace tfe;

namespace {

std::vector<nlohmann::json> read_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

AcceptLogOptions options(const std::filesystem::path& path, int every, std::string label = "code") {
  AcceptLogOptions o;
  o.every = every;
  o.path = path.string();
  o.label = std::move(label);
  return o;
}

}  // namespace

TEST_CASE("accept log: counts by window position") {
  AcceptLog log;  // no lines: the totals only
  // Round 1 (3 steps): kept 0, 2, 3. Round 2 (3 steps): kept 1.
  const std::vector<int> r1 = {0, 2, 3}, r2 = {1};
  log.record(r1, 3);
  log.record(r2, 3);
  const AcceptCounts& t = log.totals();
  CHECK(t.rounds == 2);
  CHECK(t.sequences == 4);
  CHECK(t.kept_tokens == 6);
  CHECK(t.mean_kept() == doctest::Approx(1.5));
  // Position 1 is asked of every sequence; position p of those that kept p - 1 or more.
  CHECK(t.asked == std::vector<uint64_t>{4, 3, 2});
  CHECK(t.kept == std::vector<uint64_t>{3, 2, 1});
  // A longer round widens the window; a shorter one counts only its positions.
  const std::vector<int> r3 = {4}, r4 = {1, 1};
  log.record(r3, 4);
  log.record(r4, 1);
  CHECK(t.asked == std::vector<uint64_t>{7, 4, 3, 1});
  CHECK(t.kept == std::vector<uint64_t>{6, 3, 2, 1});
}

TEST_CASE("accept log: one line every N rounds, the label in each, flush writes the rest") {
  test::TempDir dir;
  const auto path = dir.path / "accept.jsonl";
  const std::vector<int> all = {2, 2}, none = {0, 0};
  {
    AcceptLog log(options(path, 2, "chat"));
    log.record(all, 2);
    CHECK(read_lines(path).empty());  // 1 round of 2: nothing yet
    log.record(none, 2);
    auto lines = read_lines(path);
    REQUIRE(lines.size() == 1);
    const auto& l = lines[0];
    CHECK(l["label"] == "chat");
    CHECK(l["round"] == 2);
    CHECK(l["rounds"] == 2);
    CHECK(l["sequences"] == 4);
    CHECK(l["mean_kept"].get<double>() == doctest::Approx(1.0));
    CHECK(l["tokens_per_round"].get<double>() == doctest::Approx(2.0));
    REQUIRE(l["window"].size() == 2);
    CHECK(l["window"][0]["position"] == 1);
    CHECK(l["window"][0]["asked"] == 4);
    CHECK(l["window"][0]["kept"] == 2);
    CHECK(l["window"][0]["rate"].get<double>() == doctest::Approx(0.5));
    CHECK(l["window"][1]["asked"] == 2);
    CHECK(l["window"][1]["kept"] == 2);
    CHECK(l["window"][1]["rate"].get<double>() == doctest::Approx(1.0));
    // The next line covers only the rounds after the first.
    log.record(none, 2);
    log.record(none, 2);
    lines = read_lines(path);
    REQUIRE(lines.size() == 2);
    CHECK(lines[1]["round"] == 4);
    CHECK(lines[1]["rounds"] == 2);
    CHECK(lines[1]["window"][0]["kept"] == 0);
    CHECK(lines[1]["window"][1]["asked"] == 0);
    CHECK(lines[1]["window"][1]["rate"].is_null());  // nothing examined at position 2
    // A partial interval: written by flush, once.
    log.record(all, 2);
    CHECK(read_lines(path).size() == 2);
    log.flush();
    log.flush();
    lines = read_lines(path);
    REQUIRE(lines.size() == 3);
    CHECK(lines[2]["round"] == 5);
    CHECK(lines[2]["rounds"] == 1);
    log.record(all, 2);  // left for the destructor
    CHECK(log.totals().rounds == 6);
  }
  auto lines = read_lines(path);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3]["round"] == 6);
  CHECK(lines[3]["mean_kept"].get<double>() == doctest::Approx(2.0));
  // The file is appended to, never truncated.
  {
    AcceptLog log(options(path, 1, "code"));
    log.record(all, 2);
  }
  lines = read_lines(path);
  REQUIRE(lines.size() == 5);
  CHECK(lines[4]["label"] == "code");
  CHECK(lines[4]["round"] == 1);
}

TEST_CASE("accept log: a refused round records nothing") {
  test::TempDir dir;
  const auto path = dir.path / "accept.jsonl";
  AcceptLog log(options(path, 1));
  const std::vector<int> good = {1, 2};
  log.record(good, 2);
  const AcceptCounts before = log.totals();
  auto refused = [&](std::vector<int> kept, int steps, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(log.record(kept, steps), doctest::Contains(message.c_str()), Error);
    CHECK(log.totals().rounds == before.rounds);
    CHECK(log.totals().sequences == before.sequences);
    CHECK(log.totals().kept_tokens == before.kept_tokens);
    CHECK(log.totals().asked == before.asked);
    CHECK(log.totals().kept == before.kept);
  };
  refused({1, 3}, 2, "kept[1] = 3 is outside 0..2");
  refused({-1}, 2, "kept[0] = -1 is outside 0..2");
  refused({0}, 0, "steps 0 is outside 1..256");
  // The counts are sized by steps: a huge one is refused, not a resize to gigabytes.
  refused({0}, kMaxAcceptSteps + 1, "steps 257 is outside 1..256");
  refused({0}, std::numeric_limits<int>::max(), "steps 2147483647 is outside 1..256");
  refused({}, 2, "no sequences");
  log.flush();
  CHECK(read_lines(path).size() == 1);  // only the good round's line
}

TEST_CASE("accept log: an unwritable path is refused by name") {
  test::TempDir dir;
  const auto path = dir.path / "missing" / "accept.jsonl";
  CHECK_THROWS_WITH_AS(AcceptLog(options(path, 1)), doctest::Contains(path.string().c_str()), Error);
  // Off (every 0): no file is opened, so nothing is refused.
  CHECK_NOTHROW(AcceptLog(options(path, 0)));
}
