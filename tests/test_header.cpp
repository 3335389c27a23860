#include <doctest/doctest.h>

#include "core/error.h"
#include <tfe/header.h>
#include "head/presets.h"

using namespace tfe;

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
