#include "plan/cli/commands.h"

namespace tfe::cli {

void add_inspect(CLI::App& app) { app.add_subcommand("inspect", "(not yet built)"); }

}  // namespace tfe::cli
