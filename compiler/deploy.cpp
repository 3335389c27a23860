// <tfe/deploy.h>: the deploy steps of tfe-plan as calls, each a thin layer over its stage.
#include <tfe/deploy.h>

#include <filesystem>
#include <vector>

#include "compiler/artifact.h"
#include "core/error.h"
#include "core/files.h"
#include "head/convert.h"
#include "head/fp8.h"
#include "head/header_yaml.h"
#include "head/presets.h"
#include "head/random_head.h"
#include "plan/plan_yaml.h"

namespace tfe {

static_assert(kDefaultConvertWindow == CheckpointOptions{}.window, "convert's default window is the CLI's");

HeadHeader write_random_head(const RandomHeadOptions& o, const std::string& out_path) {
  if (o.preset.empty() == o.config_path.empty())
    fail("random head: give exactly one of a preset and a config file (got {})", o.preset.empty() ? "neither" : "both");
  files::check_output(out_path, "random head: out", std::vector<std::filesystem::path>{o.config_path});
  HeadHeader h;
  if (!o.preset.empty()) {
    h = preset_header(o.preset);
  } else {
    const std::string text = files::read_regular(o.config_path, "random head: config", kMaxHeaderYamlBytes);
    try {
      h = header_from_yaml_text(text);
    } catch (const Error& e) {
      fail("random head: config {}: {}", o.config_path, e.what());
    }
  }
  const HeadWriter writer = random_head(h, o.seed, o.fp8, o.threads);
  writer.write(out_path);
  return writer.header();
}

namespace {
ConvertOptions convert_options(const CheckpointOptions& o) {
  ConvertOptions c;
  c.eagle_dir = o.eagle_dir;
  c.target_dir = o.target_dir;
  c.window = o.window;
  c.fp8 = o.fp8;
  c.threads = o.threads;
  return c;
}
}  // namespace

HeadHeader convert_checkpoint(const CheckpointOptions& o, const std::string& out_path) {
  files::check_output(out_path, "convert: out",
                      std::vector<std::filesystem::path>{o.eagle_dir, o.target_dir.value_or(std::string())});
  const HeadWriter writer = convert_eagle3(convert_options(o));
  writer.write(out_path);
  return writer.header();
}

std::vector<std::string> checkpoint_warnings(const CheckpointOptions& o) { return eagle3_warnings(convert_options(o)); }

PlanSource PlanSource::file(const std::string& head_path) { return head(HeadFile::open(head_path)); }

PlanSource PlanSource::head(const HeadFile& head) { return {head.header(), head.header_sha256()}; }

PlanSource PlanSource::preset(std::string_view name, bool fp8) {
  PlanSource s{preset_header(name), {}};
  if (fp8) mark_fp8_forms(s.header);
  return s;
}

std::string plan_yaml(const PlanSource& source, const PlanOptions& options) {
  return dump_plan_yaml(make_plan(source.header, options, {}, source.header_sha256));
}

ArtifactSummary compile_artifact(const PlanSource& source, const PlanOptions& options, const std::string& out_dir,
                                 const ArtifactProgress& progress) {
  const Plan plan = make_plan(source.header, options, {}, source.header_sha256);
  const KernelCache cache = KernelCache::from_environment();
  ProgressFn report;
  if (progress) report = [&progress](const CompileProgress& p) { progress(format_progress(p)); };
  const CompileSummary s = compile_plan(plan, out_dir, report, cache);
  return {s.specs, s.hits, s.misses, s.wall_ms, s.out_dir, cache.dir(plan.options.arch).string()};
}

ArtifactInfo verify_artifact(const std::string& dir, const std::string& head_path) {
  const Artifact a = load_artifact(dir);
  ArtifactInfo info{dir, a.arch, a.nvrtc_version, a.plan.head_sha256, a.kernels.size(), 0};
  for (const auto& k : a.kernels) info.cubin_bytes += k.cubin.size();
  if (!head_path.empty()) {
    const std::string sha = HeadFile::open(head_path).header_sha256();
    if (info.head_sha256.empty())
      fail("artifact {}: compiled from a preset, not for head {} (sha256 {})", dir, head_path, sha);
    if (sha != info.head_sha256)
      fail("artifact {}: compiled for the head with sha256 {}, but {} has sha256 {}; compile it for this head", dir,
           info.head_sha256, head_path, sha);
  }
  return info;
}

}  // namespace tfe
