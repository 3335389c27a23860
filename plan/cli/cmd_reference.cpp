#include "plan/cli/commands.h"

namespace tfe::cli {

void add_reference(CLI::App& app) { app.add_subcommand("reference", "(not yet built)"); }

}  // namespace tfe::cli
