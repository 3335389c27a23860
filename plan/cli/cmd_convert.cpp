#include "plan/cli/commands.h"

namespace tfe::cli {

void add_convert(CLI::App& app) { app.add_subcommand("convert", "(not yet built)"); }

}  // namespace tfe::cli
