// The kernel sources (kernels/*.cuh), embedded at build time.
#pragma once
#include <string>
#include <vector>

namespace tfe {

struct EmbeddedSource {
  std::string name;  // file name, e.g. "gemv.cuh"; sources include each other by this name
  std::string text;
};
const std::vector<EmbeddedSource>& embedded_kernel_sources();

}  // namespace tfe
