#include "tools/plan_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <regex>

#include "core/error.h"
#include "head/fp8.h"
#include <tfe/head_file.h>
#include "head/presets.h"

namespace tfe::cli {

namespace {

// The planner would plan for sm_80, but every kernel uses sm_90's dependent launch (griddepcontrol), so no
// device below it could run the plan; the arch is refused before anything is planned or compiled.
void check_arch(const std::string& arch) {
  static const std::regex form("sm_([1-9][0-9]{1,3})");
  std::smatch m;
  if (!std::regex_match(arch, m, form)) fail("--arch {}: not of the form sm_<digits> (e.g. sm_90)", arch);
  if (std::stoi(m[1].str()) < 90) fail("--arch {}: tfe needs sm_90 or newer", arch);
}

}  // namespace

void add_plan_options(CLI::App* cmd, const std::shared_ptr<PlanArgs>& args) {
  const PlanOptions d;
  auto* head = cmd->add_option("head", args->head_path, "head file (.tfe)")->check(CLI::ExistingFile);
  auto* preset =
      cmd->add_option("--preset", args->preset,
                      fmt::format("plan a built-in head shape instead of a file: {}", fmt::join(preset_names(), ", ")));
  head->excludes(preset);
  preset->excludes(head);
  // A preset is a bare header; this gives it the FP8 forms `tfe-plan random --preset NAME --fp8` writes,
  // so an FP8 plan or artifact of a preset needs no multi-gigabyte head file.
  cmd->add_flag("--preset-fp8", args->preset_fp8,
                "with --preset: plan the preset with FP8 forms of every linear in use (as random --fp8 makes it)")
      ->needs(preset);
  cmd->add_option("--buckets", args->options.buckets,
                  fmt::format("streams buckets, ascending, each 1..16 (default {})", fmt::join(d.buckets, ",")))
      ->delimiter(',');
  cmd->add_option("--max-steps", args->options.max_steps, "draft steps a pass runs at most (1..16)")
      ->capture_default_str();
  cmd->add_option("--fp8", args->fp8, "FP8 forms: auto (where the head has them), off, require")
      ->check(CLI::IsMember({"auto", "off", "require"}))
      ->capture_default_str();
  cmd->add_option("--arch", args->options.arch, "target architecture, sm_<digits>, sm_90 or newer")
      ->capture_default_str();
  cmd->add_option("--max-slots", args->options.max_slots, "sequences held at once (1..4096)")->capture_default_str();
  cmd->add_option("--extend-rows", args->options.extend_rows, "rows of one extend chunk (16..8192)")
      ->capture_default_str();
  add_attention_split_option(cmd, args->options);
  cmd->add_option("--cand-k", args->options.cand_k,
                  "candidates a two_stage head rescores per row (1..512, at most draft_vocab; 0: the head's)")
      ->capture_default_str();
  cmd->add_flag("--first-ranks", args->options.first_ranks,
                "step 1 may draft another rank than the best per slot (the branches of a draft tree; a dense head's)");
  add_plan_tuning_options(cmd, args->tuning);
}

CLI::Option* add_attention_split_option(CLI::App* cmd, PlanOptions& options) {
  return cmd
      ->add_option_function<std::string>(
          "--attention-split",
          [&options](const std::string& name) { options.attention_split = attention_split_from_name(name); },
          "ring_attention's key split: per_bucket (each bucket's fastest), or same_drafts (the largest bucket's in "
          "every bucket, so that a slot drafts the same tokens in every bucket)")
      ->check(CLI::IsMember({"per_bucket", "same_drafts"}))
      ->default_str(std::string(attention_split_name(options.attention_split)));
}

std::vector<CLI::Option*> add_plan_tuning_options(CLI::App* cmd, Tuning& tuning) {
  CLI::Option_group* group =
      cmd->add_option_group("tuning", "measured speed choices; the defaults measured fastest (BENCHMARKS.md)");
  const auto add = [&](const char* name, auto& field, const char* description) {
    return group->add_option(name, field, description)->capture_default_str();
  };
  return {
      add("--dependent-streams", tuning.dependent_streams,
          "draft passes of buckets up to this many streams launch their kernels dependent (0..16, 0: none)"),
      add("--dependent-streams-fp8", tuning.dependent_streams_fp8,
          "--dependent-streams for a plan whose layer linears all run in FP8 (0..16, 0: none)"),
      add("--dependent-safe-nodes", tuning.dependent_safe_nodes,
          "in buckets above that limit, every node but a GEMV after a grid of one CTA an SM or more "
          "launches dependent (true), or none (false)"),
      add("--rope-in-wqkv", tuning.rope_in_wqkv,
          "the draft's RoPE in the wqkv gemv's epilogue where the head has no qk_norm (true, false)"),
      add("--gemv-cluster", tuning.gemv_cluster,
          "a narrow FP8 output's gemv with each column tile's K split over a cluster of CTAs (true, false)"),
      add("--tiled-weights", tuning.tiled_weights,
          "matrices only gemvs read in the tiled layout, a warp's load 512 consecutive bytes (true, false)"),
  };
}

Plan plan_from_args(const PlanArgs& args) {
  check_arch(args.options.arch);
  PlanOptions options = args.options;
  options.fp8 = fp8_mode_from_name(args.fp8);
  if (!args.preset.empty()) {
    HeadHeader header = preset_header(args.preset);
    if (args.preset_fp8) mark_fp8_forms(header);
    return make_plan(header, options, args.tuning);
  }
  if (args.head_path.empty())
    fail("no head given: pass a .tfe file or --preset NAME ({})", fmt::join(preset_names(), ", "));
  const HeadFile head = HeadFile::open(args.head_path);
  return make_plan(head.header(), options, args.tuning, head.header_sha256());
}

}  // namespace tfe::cli
