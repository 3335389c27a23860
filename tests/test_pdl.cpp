// Programmatic dependent launch: a kernel launched with the attribute may start while its predecessor still
// runs, so every kernel must execute pdl_wait() before it returns, reads an activation or writes anything
// (kernels/common.cuh). This checks the embedded sources, so a new kernel without the wait fails here.
#include <doctest/doctest.h>

#include <cctype>
#include <string>
#include <vector>

#include "compiler/embedded_kernels.h"

namespace {

struct KernelBody {
  std::string source;
  std::string name;
  std::string text;  // from the opening brace to its match
};

std::vector<KernelBody> kernel_bodies() {
  std::vector<KernelBody> out;
  for (const tfe::EmbeddedSource& s : tfe::embedded_kernel_sources()) {
    for (size_t at = s.text.find("__global__"); at != std::string::npos; at = s.text.find("__global__", at + 1)) {
      const size_t paren = s.text.find('(', s.text.find(')', at) + 1);
      const size_t name_begin = s.text.rfind(' ', paren);
      const std::string name = s.text.substr(name_begin + 1, paren - name_begin - 1);
      const size_t open = s.text.find('{', paren);
      REQUIRE(open != std::string::npos);
      int depth = 0;
      size_t close = open;
      for (; close < s.text.size(); ++close) {
        if (s.text[close] == '{') ++depth;
        if (s.text[close] == '}' && --depth == 0) break;
      }
      REQUIRE(close < s.text.size());
      out.push_back({s.name, name, s.text.substr(open, close - open + 1)});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("pdl: every kernel waits on its predecessor before returning, then lets its successor launch") {
  const std::vector<KernelBody> bodies = kernel_bodies();
  // The draft chain's kernels and the two-stage tail: a source that lost its kernels would pass vacuously.
  CHECK(bodies.size() >= 12);
  for (const KernelBody& k : bodies) {
    CAPTURE(k.source);
    CAPTURE(k.name);
    const size_t wait = k.text.find("pdl_wait();");
    REQUIRE(wait != std::string::npos);
    CHECK(k.text.find("pdl_wait();", wait + 1) == std::string::npos);
    const size_t first_return = k.text.find("return");
    CHECK((first_return == std::string::npos || wait < first_return));
    const size_t launch = k.text.find("pdl_launch_dependents();");
    REQUIRE(launch != std::string::npos);
    CHECK(wait < launch);
    // Before the wait only weights may be touched: no parameter other than the weight pointer is read.
    const std::string before = k.text.substr(0, wait);
    for (size_t p = before.find("p."); p != std::string::npos; p = before.find("p.", p + 1)) {
      if (p > 0 && (std::isalnum(static_cast<unsigned char>(before[p - 1])) || before[p - 1] == '_')) continue;
      CHECK(before.compare(p, 4, "p.w)") == 0);
    }
  }
}
