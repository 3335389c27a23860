#include "plan/cli/commands.h"

namespace tfe::cli {

void add_dump(CLI::App& app) { app.add_subcommand("dump", "(not yet built)"); }

}  // namespace tfe::cli
