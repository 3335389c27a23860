// Subcommands of tfe-plan. Each file tools/cmd_<name>.cpp adds one to the app.
#pragma once
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace tfe::cli {

// Text from a file (a head's name, a tensor's) as printed to a terminal: as it is when every byte is
// printable ASCII, else quoted with its escapes shown (\x1b, \n, ...), so that no byte of it acts on the
// terminal.
inline std::string shown(std::string_view s) {
  for (const unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return fmt::format("{:?}", s);
  return std::string(s);
}

// A seed as decimal digits within uint64. CLI11's own conversion takes -1, 2^64 and 1e23 alike as
// 2^64 - 1; a validator sees the text before that.
inline CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return "`" + s + "` is not a seed: give an integer 0.." + std::to_string(UINT64_MAX);
        return {};
      },
      "UINT64");
}

void add_random(CLI::App& app);     // tfe-plan random
void add_convert(CLI::App& app);    // tfe-plan convert
void add_inspect(CLI::App& app);    // tfe-plan inspect
void add_reference(CLI::App& app);  // tfe-plan reference
void add_dump(CLI::App& app);       // tfe-plan dump
void add_compile(CLI::App& app);    // tfe-plan compile

}  // namespace tfe::cli
