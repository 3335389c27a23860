#include <tfe/accept_log.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tfe {

namespace {

void add(AcceptCounts& to, std::span<const int> kept, int steps) {
  const size_t s = static_cast<size_t>(steps);
  if (to.asked.size() < s) {
    to.asked.resize(s, 0);
    to.kept.resize(s, 0);
  }
  to.rounds += 1;
  to.sequences += kept.size();
  for (int k : kept) {
    to.kept_tokens += static_cast<uint64_t>(k);
    // Positions 1..k+1 were examined (the first rejected one included, where k < steps); 1..k were kept.
    for (int p = 1; p <= steps && p <= k + 1; ++p) to.asked[static_cast<size_t>(p - 1)] += 1;
    for (int p = 1; p <= k; ++p) to.kept[static_cast<size_t>(p - 1)] += 1;
  }
}

}  // namespace

AcceptLog::AcceptLog(AcceptLogOptions options) : options_(std::move(options)) {
  if (options_.every < 0) fail("accept log: every {} must be 0 (no lines) or more", options_.every);
  if (options_.every == 0) return;
  if (options_.path.empty()) {
    out_ = stderr;
    return;
  }
  out_ = std::fopen(options_.path.c_str(), "a");
  if (!out_) fail("accept log: cannot open {} for appending ({})", options_.path, std::strerror(errno));
}

AcceptLog::~AcceptLog() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe: %s\n", e.what());
  }
  if (out_ && out_ != stderr) std::fclose(out_);
}

void AcceptLog::record(std::span<const int> kept, int steps) {
  if (steps < 1 || steps > kMaxAcceptSteps)
    fail("accept log: steps {} is outside 1..{} (kMaxAcceptSteps)", steps, kMaxAcceptSteps);
  if (kept.empty()) fail("accept log: kept is empty, a round of no sequences");
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] < 0 || kept[i] > steps)
      fail("accept log: kept[{}] = {} is outside 0..{} (the round's steps)", i, kept[i], steps);
  add(totals_, kept, steps);
  if (!out_) return;
  add(pending_, kept, steps);
  if (pending_.rounds >= static_cast<uint64_t>(options_.every)) write_line();
}

void AcceptLog::flush() {
  if (out_ && pending_.rounds > 0) write_line();
}

void AcceptLog::write_line() {
  const AcceptCounts& c = pending_;
  nlohmann::ordered_json window = nlohmann::ordered_json::array();
  for (size_t i = 0; i < c.asked.size(); ++i) {
    nlohmann::ordered_json rate = nullptr;  // no draft at this position was examined
    if (c.asked[i]) rate = static_cast<double>(c.kept[i]) / static_cast<double>(c.asked[i]);
    window.push_back({{"position", i + 1}, {"asked", c.asked[i]}, {"kept", c.kept[i]}, {"rate", rate}});
  }
  const nlohmann::ordered_json line = {
      {"label", options_.label},  {"round", totals_.rounds},    {"rounds", c.rounds},
      {"sequences", c.sequences}, {"mean_kept", c.mean_kept()}, {"tokens_per_round", c.mean_kept() + 1.0},
      {"window", window}};
  pending_ = {};
  const std::string text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  const std::string_view where = out_ == stderr ? std::string_view("stderr") : std::string_view(options_.path);
  if (std::fputs(text.c_str(), out_) < 0 || std::fflush(out_) != 0)
    fail("accept log: cannot write to {} ({})", where, std::strerror(errno));
}

}  // namespace tfe
