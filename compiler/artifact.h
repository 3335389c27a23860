// The deploy artifact: a plan and every CUBIN it names, so a deployment loads kernels without compiling.
//
//   <dir>/plan.yaml                 the plan (plan/plan_yaml.h)
//   <dir>/kernels/<uri>.cubin       one per specialization of plan.specs
//   <dir>/manifest.json             schema, arch, NVRTC and toolkit versions, the head's sha256, and the
//                                   sha256 and size of plan.yaml and of every CUBIN, with its lowered name
//
// The manifest is written last and removed first, so a directory whose compile was interrupted has no
// manifest and does not load.
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "compiler/cache.h"
#include "plan/plan.h"

namespace tfe {

// Bump when the directory layout or the manifest's fields change; a loader refuses other versions.
inline constexpr int kArtifactSchemaVersion = 1;

struct ArtifactKernel {
  std::string uri;
  std::string kernel;        // registry name
  std::string lowered_name;  // the symbol to look up in the CUBIN
  std::string sha256;        // of the CUBIN
  std::string cubin;
};

struct Artifact {
  Plan plan;
  std::string arch;
  std::string nvrtc_version;
  std::vector<ArtifactKernel> kernels;                       // in plan.specs order
  const ArtifactKernel& kernel(std::string_view uri) const;  // throws naming the uri
};

// One finished specialization, reported as it completes (from worker threads, one call at a time).
struct CompileProgress {
  size_t done = 0;  // 1-based count of finished specializations
  size_t total = 0;
  std::string uri;
  bool hit = false;
  double ms = 0;
};
// "[12/87] gemv__rows_16__k_4096... (miss, 143 ms)"
std::string format_progress(const CompileProgress& p);
using ProgressFn = std::function<void(const CompileProgress&)>;

struct CompileSummary {
  size_t specs = 0;
  size_t hits = 0;
  size_t misses = 0;
  double wall_ms = 0;
  std::string out_dir;
};

// The output directory `out_dir` names ("deploy/" is "deploy"); "", ".", ".." and "/" are refused.
std::filesystem::path artifact_output_dir(const std::string& out_dir);
// Refuses an output directory compile_plan would refuse (what it holds, where it is), before any work.
void check_artifact_output(const std::string& out_dir);

// Compiles every spec of `plan` for plan.options.arch through `cache`, on hardware_concurrency threads,
// and writes the artifact to `out_dir`: a new directory, an empty one, or an earlier artifact (a manifest
// that parses and names every file there), which is replaced whole once the new one is complete (a
// failure leaves it as it was). Anything else there is refused before any work, and a directory created
// or changed there while the compile runs is left as it is (the compile then fails). The first compile
// error is rethrown once the workers stop.
CompileSummary compile_plan(const Plan& plan, const std::string& out_dir, const ProgressFn& progress,
                            const KernelCache& cache, const CompileOptions& base_options = {});
// The same through KernelCache::from_environment().
CompileSummary compile_plan(const Plan& plan, const std::string& out_dir, const ProgressFn& progress = {});

// Reads an artifact and verifies it whole: manifest schema, the sha256 and size of plan.yaml and of every
// CUBIN, the head's sha256 against the plan's, one CUBIN per spec defining its lowered name. Throws
// tfe::Error naming the file and the mismatch.
Artifact load_artifact(const std::string& dir);

}  // namespace tfe
