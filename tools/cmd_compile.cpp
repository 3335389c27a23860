// tfe-plan compile: plans a head and writes the deploy artifact (plan.yaml, one CUBIN per specialization,
// manifest.json), compiling through the kernel cache.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "compiler/artifact.h"
#include "core/error.h"
#include "tools/commands.h"
#include "tools/plan_options.h"

namespace tfe::cli {

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
    // The artifact is written only after every kernel has compiled, which may take minutes: an output it
    // may not replace is refused first.
    check_artifact_output(*out);
    const Plan plan = plan_from_args(*args);
    const KernelCache cache = KernelCache::from_environment();
    const CompileSummary s = compile_plan(
        plan, *out, [](const CompileProgress& p) { std::fprintf(stderr, "%s\n", format_progress(p).c_str()); }, cache);
    fmt::print("specs:   {}\nhits:    {}\nmisses:  {}\nwall:    {:.0f} ms\ncache:   {}\noutput:  {}\n", s.specs, s.hits,
               s.misses, s.wall_ms, cache.dir(plan.options.arch).string(), s.out_dir);
  });
}

}  // namespace tfe::cli
