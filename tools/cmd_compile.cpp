// tfe-plan compile: plans a head and writes the deploy artifact (plan.yaml, one CUBIN per specialization,
// manifest.json), compiling through the kernel cache.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "compiler/artifact.h"
#include "core/error.h"
#include "tools/commands.h"
#include "tools/plan_options.h"

namespace tfe::cli {

namespace {

namespace fs = std::filesystem;

// The artifact is written only after every kernel has compiled, which may take minutes; a directory that
// cannot be written is refused before that. The directory itself is not created here, so that a refused
// head or option leaves nothing behind.
void check_output_dir(const std::string& dir) {
  if (dir.empty()) fail("compile: -o names no directory");
  const fs::path path = dir;
  fs::path existing = path;  // the nearest part of `path` that exists
  std::error_code ec;
  while (!fs::exists(fs::status(existing, ec))) {
    fs::path up = existing.parent_path();
    if (up.empty()) up = ".";
    if (up == existing) fail("compile: -o {}: no part of that path exists", dir);  // the working directory is gone
    existing = up;
  }
  if (existing == path) {
    if (!fs::is_directory(fs::status(path, ec))) fail("compile: -o {} is a file, not a directory", dir);
    if (::access(path.c_str(), W_OK | X_OK) != 0)
      fail("compile: -o {}: cannot write into it: {}", dir, std::strerror(errno));
    return;
  }
  if (!fs::is_directory(fs::status(existing, ec)))
    fail("compile: -o {} cannot be created: {} is a file, not a directory", dir, existing.string());
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    fail("compile: -o {} cannot be created in {}: {}", dir, existing.string(), std::strerror(errno));
}

}  // namespace

void add_compile(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("compile", "plan a head and compile every kernel it needs into a deploy artifact");
  add_plan_options(cmd, args);
  cmd->add_option("-o,--output", *out, "output directory")->required();
  cmd->footer(
      "Kernels are compiled through the cache in $TFE_CACHE_DIR (else $XDG_CACHE_HOME/tfe, else ~/.cache/tfe);\n"
      "TFE_JIT=off makes a cache miss an error.");
  cmd->callback([args, out] {
    check_output_dir(*out);
    const Plan plan = plan_from_args(*args);
    const KernelCache cache = KernelCache::from_environment();
    const CompileSummary s = compile_plan(
        plan, *out, [](const CompileProgress& p) { std::fprintf(stderr, "%s\n", format_progress(p).c_str()); }, cache);
    fmt::print("specs:   {}\nhits:    {}\nmisses:  {}\nwall:    {:.0f} ms\ncache:   {}\noutput:  {}\n", s.specs, s.hits,
               s.misses, s.wall_ms, cache.dir(plan.options.arch).string(), s.out_dir);
  });
}

}  // namespace tfe::cli
