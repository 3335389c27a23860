// tfe-plan dump: plans a head (a .tfe file or a preset's header) and writes the plan as YAML
// (docs/plan-schema.md), to stdout or to a file.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tools/commands.h"
#include "tools/plan_options.h"
#include "core/error.h"
#include "plan/plan_yaml.h"

namespace tfe::cli {

namespace {

// Written next to the target and renamed over it, so that a reader never sees half a plan.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("dump: cannot open {} for writing", tmp);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) fail("dump: writing {} failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("dump: renaming {} to {} failed: {}", tmp, path, ec.message());
}

}  // namespace

void add_dump(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("dump", "plan a head and write the plan as YAML");
  add_plan_options(cmd, args);
  cmd->add_option("-o,--output", *out, "write the plan here (default: stdout)");
  cmd->callback([args, out] {
    const std::string text = dump_plan_yaml(plan_from_args(*args));
    if (out->empty() || *out == "-") {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      write_file(*out, text);
    }
  });
}

}  // namespace tfe::cli
