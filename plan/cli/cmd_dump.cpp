// tfe-plan dump: plans a head (a .tfe file or a preset's header) and writes the plan as YAML
// (docs/plan-schema.md), to stdout or to a file.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "plan/cli/commands.h"
#include "plan/error.h"
#include "plan/head_file.h"
#include "plan/plan_yaml.h"
#include "plan/presets.h"

namespace tfe::cli {

namespace {

struct DumpArgs {
  std::string head;
  std::string preset;
  PlanOptions options;
  std::string fp8 = "auto";
  std::string out;
};

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

void run(DumpArgs& a) {
  a.options.fp8 = fp8_mode_from_name(a.fp8);
  HeadHeader header;
  std::string sha;
  if (!a.preset.empty()) {
    header = preset_header(a.preset);
  } else {
    const HeadFile file = HeadFile::open(a.head);
    header = file.header();
    sha = file.header_sha256();
  }
  const std::string text = dump_plan_yaml(make_plan(header, a.options, sha));
  if (a.out.empty() || a.out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    write_file(a.out, text);
  }
}

}  // namespace

void add_dump(CLI::App& app) {
  auto args = std::make_shared<DumpArgs>();
  auto* cmd = app.add_subcommand("dump", "plan a head and write the plan as YAML");
  auto* head = cmd->add_option("head", args->head, ".tfe head file")->check(CLI::ExistingFile);
  auto* preset = cmd->add_option("--preset", args->preset, "plan a preset's header instead of a file");
  head->excludes(preset);
  preset->excludes(head);
  cmd->add_option("--buckets", args->options.buckets, "streams buckets, ascending, each 1..16")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--max-steps", args->options.max_steps, "draft steps a pass runs at most (1..16)")
      ->capture_default_str();
  cmd->add_option("--fp8", args->fp8, "FP8 forms: auto (where the head has them), off, require")
      ->check(CLI::IsMember({"auto", "off", "require"}))
      ->capture_default_str();
  cmd->add_option("--arch", args->options.arch, "target architecture, sm_<digits>")->capture_default_str();
  cmd->add_option("--max-slots", args->options.max_slots, "sequences held at once (1..4096)")->capture_default_str();
  cmd->add_option("--extend-rows", args->options.extend_rows, "rows of one extend chunk (16..8192)")
      ->capture_default_str();
  cmd->add_option("-o,--output", args->out, "write the plan here (default: stdout)");
  cmd->callback([args] {
    if (args->head.empty() && args->preset.empty()) fail("dump: give a .tfe head file or --preset NAME");
    run(*args);
  });
}

}  // namespace tfe::cli
