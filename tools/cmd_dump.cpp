// tfe-plan dump: plans a head (a .tfe file or a preset's header) and writes the plan as YAML
// (docs/plan-schema.md), to stdout or to a file.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tools/commands.h"
#include "tools/plan_options.h"
#include "core/error.h"
#include "core/files.h"
#include "plan/plan_yaml.h"

namespace tfe::cli {

void add_dump(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("dump", "plan a head and write the plan as YAML");
  add_plan_options(cmd, args);
  cmd->add_option("-o,--output", *out, "write the plan here (default: stdout)");
  cmd->callback([args, out] {
    const bool to_file = !out->empty() && *out != "-";
    if (to_file) files::check_output(*out, "dump: -o", std::vector<std::filesystem::path>{args->head_path});
    const Plan plan = plan_from_args(*args);
    const std::string text = dump_plan_yaml(plan);
    if (!to_file) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      files::write_atomic(*out, text, "plan");
      fmt::print("wrote {}: the plan of {} (buckets {}, max_steps {}, max_slots {})\n", *out, shown(plan.header.name),
                 fmt::join(plan.options.buckets, ","), plan.options.max_steps, plan.options.max_slots);
    }
  });
}

}  // namespace tfe::cli
