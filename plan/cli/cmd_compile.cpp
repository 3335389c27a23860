#include "plan/cli/commands.h"

namespace tfe::cli {

void add_compile(CLI::App& app) { app.add_subcommand("compile", "(not yet built)"); }

}  // namespace tfe::cli
