// libFuzzer target: load_plan_yaml on arbitrary bytes. Every refusal must be a tfe::Error; any other
// exception, a crash, a hang or unbounded memory is a bug. Seeds: tests/fuzz/seeds/fuzz_plan_yaml.cpp.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "plan/plan_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)tfe::load_plan_yaml(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const tfe::Error&) {
  }
  return 0;
}
