// tfe-plan: head files, plans and compiled artifacts, all without a GPU.
#include <cstdio>

#include "tools/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tfe-plan: make, import, inspect, plan and compile EAGLE-style draft heads"};
  app.require_subcommand(1);
  tfe::cli::add_random(app);
  tfe::cli::add_convert(app);
  tfe::cli::add_inspect(app);
  tfe::cli::add_reference(app);
  tfe::cli::add_dump(app);
  tfe::cli::add_compile(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tfe::Error& e) {
    std::fprintf(stderr, "tfe-plan: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
