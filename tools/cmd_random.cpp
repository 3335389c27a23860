// tfe-plan random: a head of random weights for a preset or a YAML header, for tests and benchmarks.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <filesystem>
#include <memory>
#include <vector>

#include "tools/commands.h"
#include "core/error.h"
#include "head/fp8.h"
#include "core/files.h"
#include "head/header_yaml.h"
#include "head/presets.h"
#include "head/random_head.h"

namespace tfe::cli {

namespace {

struct RandomArgs {
  std::string preset;
  std::string config;
  uint64_t seed = 0;
  bool fp8 = false;
  std::string out;
};

HeadHeader read_config(const std::string& path) {
  const std::string text = files::read_regular(path, "random: --config", kMaxHeaderYamlBytes);
  try {
    return header_from_yaml_text(text);
  } catch (const Error& e) {
    fail("random: --config {}: {}", path, e.what());
  }
}

void run(const RandomArgs& a) {
  files::check_output(a.out, "random: -o", std::vector<std::filesystem::path>{a.config});
  const HeadHeader h = a.config.empty() ? preset_header(a.preset) : read_config(a.config);
  // Said before the work: an 8B-shaped head is about 2 GB, drawn and written in seconds to minutes.
  HeadHeader with_forms = h;
  if (a.fp8) mark_fp8_forms(with_forms);
  const std::vector<TensorSpec> specs = expected_tensors(with_forms);
  int64_t bytes = 0;
  for (const TensorSpec& t : specs) {
    int64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= d;
    bytes += n;
  }
  const double b = static_cast<double>(bytes);
  fmt::print("writing {}: {} tensors, {} of random weights\n", a.out, specs.size(),
             b < 1e9 ? fmt::format("{:.1f} MB", b / 1e6) : fmt::format("{:.2f} GB", b / 1e9));
  std::fflush(stdout);
  const auto writer = random_head(h, a.seed, a.fp8);
  writer.write(a.out);
  const auto& w = writer.header();
  fmt::print("wrote {}: {} ({} head, hidden {}, vocab {} / draft {}), seed {}, {} FP8 forms\n", a.out, shown(w.name),
             head_type_name(w.head_type), w.hidden, w.vocab, w.draft_vocab, a.seed, w.fp8.size());
}

}  // namespace

void add_random(CLI::App& app) {
  auto args = std::make_shared<RandomArgs>();
  auto* cmd = app.add_subcommand("random", "write a head of random weights (deterministic by seed)");
  auto* preset = cmd->add_option(
      "--preset", args->preset, "built-in header: " + [] {
        std::string s;
        for (const auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
        return s;
      }());
  auto* config = cmd->add_option("--config", args->config, "header as YAML (the header section of a dumped plan)")
                     ->check(CLI::ExistingFile);
  preset->excludes(config);
  cmd->add_option("--seed", args->seed, "generator seed")->capture_default_str()->check(seed_validator());
  cmd->add_flag("--fp8", args->fp8, "add the FP8 e4m3 form of every linear in use");
  cmd->add_option("-o,--output", args->out, "the .tfe file to write")->required();
  cmd->callback([args, preset, config] {
    if (preset->count() + config->count() != 1) fail("random: give exactly one of --preset and --config");
    run(*args);
  });
}

}  // namespace tfe::cli
