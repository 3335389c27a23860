// The GPU test binary. Without a CUDA device every case is skipped (doctest::skip) and the process exits
// with 77, the code ctest reports as "Skipped": a machine without a GPU never counts these as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/gpu/gpu_test.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  if (tfe::test::no_gpu()) {
    std::printf("skipped: no CUDA device (%s)\n", tfe::test::no_gpu_reason().c_str());
    return rc != 0 ? rc : 77;
  }
  return rc;
}
