#include "plan/cli/commands.h"

namespace tfe::cli {

void add_random(CLI::App& app) { app.add_subcommand("random", "(not yet built)"); }

}  // namespace tfe::cli
