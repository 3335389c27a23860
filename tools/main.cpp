// tfe-plan: head files, plans and compiled artifacts, all without a GPU.
#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compiler/nvrtc.h"
#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tfe-plan: make, import, inspect, plan and compile EAGLE-style draft heads"};
  app.require_subcommand(1);
  // The NVRTC a cubin comes from is the one loaded at run time, which may differ from the toolkit built
  // against; a bug report needs both.
  app.set_version_flag("--version", [] {
    return fmt::format("tfe-plan {}\nCUDA toolkit {} (built against), NVRTC {} (loaded)", TFE_VERSION,
                       tfe::cuda_toolkit_version(), tfe::nvrtc_version().str());
  });
  tfe::cli::add_random(app);
  tfe::cli::add_convert(app);
  tfe::cli::add_inspect(app);
  tfe::cli::add_reference(app);
  tfe::cli::add_dump(app);
  tfe::cli::add_compile(app);
  // CLI11 answers a first word that names no subcommand with "A subcommand is required"; the word is named
  // here instead, with the subcommands there are.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::fprintf(stderr, "tfe-plan: unknown subcommand `%s` (subcommands: %s; tfe-plan --help)\n", argv[1],
                   fmt::format("{}", fmt::join(names, ", ")).c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tfe::Error& e) {
    std::fprintf(stderr, "tfe-plan: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // Named as what it is: std::bad_alloc's own text ("std::bad_alloc") says nothing to an operator.
    std::fprintf(stderr, "tfe-plan %s: out of memory (an allocation failed); free memory or use a smaller input\n",
                 argc > 1 ? argv[1] : "");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
