// The environment's overrides of OpenOptions (runtime/environment.h), the one place they are read.
#include <doctest/doctest.h>

#include <cstdlib>

#include <tfe/runtime.h>

#include "runtime/environment.h"

using namespace tfe;

namespace {

constexpr const char* kVariables[] = {"TFE_GRAPHS", "TFE_ACCEPT_LOG", "TFE_ACCEPT_LOG_FILE", "TFE_TAP_DUMP",
                                      "TFE_CHECK"};

// Every variable unset, on entry and again on exit, so that no case sees another's.
struct CleanEnvironment {
  CleanEnvironment() { unset(); }
  ~CleanEnvironment() { unset(); }
  static void unset() {
    for (const char* v : kVariables) ::unsetenv(v);
  }
};

OpenOptions asked() {
  OpenOptions o;
  o.graphs = true;
  o.accept_log.every = 3;
  o.accept_log.path = "asked.jsonl";
  o.tap_dump.path = "asked.safetensors";
  o.tap_dump.max_rows = 5;
  o.self_check = true;
  return o;
}

}  // namespace

TEST_CASE("environment: unset or empty variables leave the options as asked") {
  CleanEnvironment clean;
  OpenOptions e = open_options_from_environment(asked());
  CHECK(e.graphs);
  CHECK(e.accept_log.every == 3);
  CHECK(e.accept_log.path == "asked.jsonl");
  CHECK(e.tap_dump.path == "asked.safetensors");
  CHECK(e.self_check);
  for (const char* v : kVariables) ::setenv(v, "", 1);
  e = open_options_from_environment(asked());
  CHECK(e.graphs);
  CHECK(e.accept_log.every == 3);
  CHECK(e.accept_log.path == "asked.jsonl");
  CHECK(e.tap_dump.path == "asked.safetensors");
  CHECK(e.self_check);
  CHECK_FALSE(open_options_from_environment(OpenOptions{}).self_check);
}

TEST_CASE("environment: TFE_GRAPHS=0 turns graphs off, and nothing turns them on") {
  CleanEnvironment clean;
  ::setenv("TFE_GRAPHS", "0", 1);
  CHECK_FALSE(open_options_from_environment(asked()).graphs);
  ::setenv("TFE_GRAPHS", "1", 1);
  CHECK(open_options_from_environment(asked()).graphs);
  OpenOptions off = asked();
  off.graphs = false;
  CHECK_FALSE(open_options_from_environment(off).graphs);
}

TEST_CASE("environment: TFE_ACCEPT_LOG and TFE_ACCEPT_LOG_FILE") {
  CleanEnvironment clean;
  ::setenv("TFE_ACCEPT_LOG", "10", 1);
  ::setenv("TFE_ACCEPT_LOG_FILE", "env.jsonl", 1);
  const OpenOptions e = open_options_from_environment(asked());
  CHECK(e.accept_log.every == 10);
  CHECK(e.accept_log.path == "env.jsonl");
  for (const char* bad : {"x", "10x", "-1", " 5"}) {
    CAPTURE(bad);
    ::setenv("TFE_ACCEPT_LOG", bad, 1);
    CHECK_THROWS_WITH_AS(open_options_from_environment(asked()), doctest::Contains("TFE_ACCEPT_LOG: `"), Error);
  }
}

TEST_CASE("environment: TFE_TAP_DUMP sets the path and keeps max_rows") {
  CleanEnvironment clean;
  ::setenv("TFE_TAP_DUMP", "env.safetensors", 1);
  const OpenOptions e = open_options_from_environment(asked());
  CHECK(e.tap_dump.path == "env.safetensors");
  CHECK(e.tap_dump.max_rows == 5);
  CHECK(open_options_from_environment(OpenOptions{}).tap_dump.path == "env.safetensors");
}

TEST_CASE("environment: TFE_CHECK is 0 or 1, and overrides the option") {
  CleanEnvironment clean;
  ::setenv("TFE_CHECK", "1", 1);
  CHECK(open_options_from_environment(OpenOptions{}).self_check);
  ::setenv("TFE_CHECK", "0", 1);
  CHECK_FALSE(open_options_from_environment(asked()).self_check);
  for (const char* bad : {"yes", "2", "1 ", "true"}) {
    CAPTURE(bad);
    ::setenv("TFE_CHECK", bad, 1);
    CHECK_THROWS_WITH_AS(open_options_from_environment(OpenOptions{}), doctest::Contains("TFE_CHECK: `"), Error);
  }
}
