#include "runtime/environment.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace tfe {

namespace {

// The variable's value, or an empty view when it is unset or empty.
std::string_view variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string_view(v) : std::string_view();
}

}  // namespace

OpenOptions open_options_from_environment(OpenOptions o) {
  if (variable("TFE_GRAPHS") == "0") o.graphs = false;
  if (const std::string_view v = variable("TFE_ACCEPT_LOG"); !v.empty()) {
    int n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 0)
      fail("TFE_ACCEPT_LOG: `{}` is not a number of rounds (0: no lines, N: a line every N rounds)", v);
    o.accept_log.every = n;
  }
  if (const std::string_view v = variable("TFE_ACCEPT_LOG_FILE"); !v.empty()) o.accept_log.path = v;
  if (const std::string_view v = variable("TFE_TAP_DUMP"); !v.empty()) o.tap_dump.path = v;
  if (const std::string_view v = variable("TFE_CHECK"); !v.empty()) {
    if (v != "0" && v != "1")
      fail("TFE_CHECK: `{}` is not 0 or 1 (1: draft a fixed case against the CPU reference at open)", v);
    o.self_check = v == "1";
  }
  return o;
}

}  // namespace tfe
