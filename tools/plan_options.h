// The options every planning subcommand takes (`dump`, `compile`): the head, as a .tfe file or a preset,
// the PlanOptions fields and the tuning fields, with one spelling and one set of defaults.
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
  Tuning tuning;
};

// Adds `HEAD.tfe`, `--preset`, `--preset-fp8`, the PlanOptions flags (`--buckets`, `--max-steps`, `--fp8`,
// `--arch`, `--max-slots`, `--extend-rows`, `--attention-split`, `--cand-k`) and, in a group of their own,
// the tuning flags below to `cmd`, bound to `*args` (which must outlive parsing).
void add_plan_options(CLI::App* cmd, const std::shared_ptr<PlanArgs>& args);

// Adds `--attention-split` (per_bucket, same_drafts), bound to `options.attention_split`.
CLI::Option* add_attention_split_option(CLI::App* cmd, PlanOptions& options);

// Adds the tuning flags, one per Tuning field (`--dependent-streams`, `--dependent-streams-fp8`,
// `--dependent-safe-nodes`, `--rope-in-wqkv`, `--gemv-cluster`, `--tiled-weights`), as the group "tuning"
// of `cmd`, bound to `tuning` (which must outlive parsing; its values are the defaults shown). Returns
// them, so that a tool that also takes a finished plan (tfe-bench's `--artifact`) can make each exclude
// it. tfe-plan and tfe-bench share this one declaration.
std::vector<CLI::Option*> add_plan_tuning_options(CLI::App* cmd, Tuning& tuning);

// Reads the head (the file's header and its sha256, or the preset's header) and plans it under the
// options and tuning. Throws tfe::Error naming the option or the file.
Plan plan_from_args(const PlanArgs& args);

}  // namespace tfe::cli
