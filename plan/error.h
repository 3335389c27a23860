// tfe::Error: the one exception type of the project. Messages say what was wrong, where, and the limit.
#pragma once
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace tfe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws tfe::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tfe
