// tfe::fail: throws the project's one exception type (<tfe/error.h>) with a formatted message, its text
// arguments as printable() (<tfe/error.h>) shows them.
#pragma once
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <fmt/format.h>

#include <tfe/error.h>

namespace tfe {

// Text the program wrote itself, line breaks and all (a compiler's log), that fail() passes on as it is.
struct Verbatim {
  std::string_view text;
};

namespace detail {

// fail()'s arguments: every string as printable() shows it, since any of them may come from input.
template <typename T>
decltype(auto) message_arg(const T& arg) {
  if constexpr (std::is_same_v<T, Verbatim>)
    return arg.text;
  else if constexpr (std::is_convertible_v<const T&, std::string_view>)
    return printable(std::string_view(arg));
  else
    return (arg);
}

template <typename... Args>
std::string message(fmt::string_view f, const Args&... args) {
  const auto shown = std::tuple<decltype(message_arg(args))...>(message_arg(args)...);
  return std::apply([&](const auto&... a) { return fmt::vformat(f, fmt::make_format_args(a...)); }, shown);
}

}  // namespace detail

// Throws tfe::Error with a fmt-formatted message, its string arguments as printable() shows them.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(detail::message(fmt::string_view(f), args...));
}

// Throws tfe::CudaError: for a failure of the device, not of the caller's input.
template <typename... Args>
[[noreturn]] void fail_cuda(fmt::format_string<Args...> f, Args&&... args) {
  throw CudaError(detail::message(fmt::string_view(f), args...));
}

}  // namespace tfe

template <>
struct fmt::formatter<tfe::Verbatim> : fmt::formatter<std::string_view> {
  auto format(const tfe::Verbatim& v, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(v.text, ctx);
  }
};
