// tfe::Error: the one exception type of the library. Its message says what was wrong, where, and the
// limit. A CUDA failure is reported as a tfe::Error too, naming the call that failed.
#pragma once
#include <stdexcept>
#include <string>

namespace tfe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tfe
