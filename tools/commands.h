// Subcommands of tfe-plan. Each file tools/cmd_<name>.cpp adds one to the app.
#pragma once
#include <CLI/CLI.hpp>

namespace tfe::cli {

void add_random(CLI::App& app);     // tfe-plan random
void add_convert(CLI::App& app);    // tfe-plan convert
void add_inspect(CLI::App& app);    // tfe-plan inspect
void add_reference(CLI::App& app);  // tfe-plan reference
void add_dump(CLI::App& app);       // tfe-plan dump
void add_compile(CLI::App& app);    // tfe-plan compile

}  // namespace tfe::cli
