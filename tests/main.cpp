// The CPU test binary. ctest runs it once per test case (doctest_discover_tests, tests/CMakeLists.txt), so
// the exit code is that case's verdict, and two outcomes that doctest reports as success must not read as
// a pass there:
// - every case that ran called test::skip (a missing optional tool): exit 77, ctest's SKIP_RETURN_CODE;
// - the filters matched no case at all (a name mangled on its way through CMake runs zero assertions):
//   exit 1, naming the filter.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <iostream>
#include <set>
#include <string>

#include "test_util.h"

namespace {

constexpr int kSkipExitCode = 77;

struct RunRecord {
  std::set<std::string> started;
  std::set<std::string> skipped;
  const doctest::TestCaseData* current = nullptr;
  bool ran = false;  // test_run_end came: cases were run, not listed or counted
  unsigned matched = 0;
};
RunRecord& record() {
  static RunRecord r;
  return r;
}

// Only listens: doctest's own console reporter still prints everything.
struct RunListener : doctest::IReporter {
  explicit RunListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    record().ran = true;
    record().matched = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    record().current = &tc;
    record().started.insert(tc.m_name);
  }
  void test_case_reenter(const doctest::TestCaseData& tc) override { record().current = &tc; }
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("tfe_run_record", 1, RunListener);

}  // namespace

namespace tfe::test {

void skip(const std::string& why) {
  const doctest::TestCaseData* tc = record().current;
  if (!tc) fail("test::skip called outside a test case: {}", why);
  record().skipped.insert(tc->m_name);
  std::cout << "skipped: " << tc->m_name << ": " << why << std::endl;
}

}  // namespace tfe::test

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || !record().ran || rc != 0) return rc;
  if (record().matched == 0) {
    std::string filters;
    for (int i = 1; i < argc; ++i) filters += std::string(filters.empty() ? "" : " ") + argv[i];
    std::fprintf(stderr, "no test case matches the filters [%s]: nothing was checked\n", filters.c_str());
    return 1;
  }
  if (record().skipped == record().started) return kSkipExitCode;
  return rc;
}
