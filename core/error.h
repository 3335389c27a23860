// tfe::fail: throws the project's one exception type (<tfe/error.h>) with a formatted message.
#pragma once
#include <string>
#include <fmt/format.h>

#include <tfe/error.h>

namespace tfe {

// Throws tfe::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// Throws tfe::CudaError: for a failure of the device, not of the caller's input.
template <typename... Args>
[[noreturn]] void fail_cuda(fmt::format_string<Args...> f, Args&&... args) {
  throw CudaError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tfe
