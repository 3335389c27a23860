// The options every planning subcommand takes (`dump`, `compile`): the head, as a .tfe file or a preset,
// and the PlanOptions fields, with one spelling and one set of defaults.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "plan/plan.h"

namespace tfe::cli {

struct PlanArgs {
  std::string head_path;  // positional; exclusive with `preset`
  std::string preset;
  bool preset_fp8 = false;  // --preset-fp8: the preset as `tfe-plan random --fp8` makes it
  std::string fp8 = std::string(fp8_mode_name(PlanOptions{}.fp8));
  PlanOptions options;
};

// Adds `HEAD.tfe`, `--preset`, `--preset-fp8`, `--buckets`, `--max-steps`, `--fp8`, `--arch`, `--max-slots`,
// `--extend-rows` and the tuning options below to `cmd`, bound to `*args` (which must outlive parsing).
void add_plan_options(CLI::App* cmd, const std::shared_ptr<PlanArgs>& args);

// Adds the PlanOptions fields that choose how a plan runs rather than what it holds (`--dependent-streams`,
// `--dependent-streams-fp8`, `--dependent-safe-nodes`, `--rope-in-wqkv`, `--gemv-cluster`, `--tiled-weights`,
// `--attention-split-per-bucket`) to `cmd`, bound to `options` (which must outlive parsing; its values are
// the defaults shown). Returns them, so that a tool that also takes a finished plan (tfe-bench's
// `--artifact`) can make each exclude it. tfe-plan and tfe-bench share this one declaration.
std::vector<CLI::Option*> add_plan_tuning_options(CLI::App* cmd, PlanOptions& options);

// Reads the head (the file's header and its sha256, or the preset's header) and plans it under the
// options. Throws tfe::Error naming the option or the file.
Plan plan_from_args(const PlanArgs& args);

}  // namespace tfe::cli
