#include "compiler/resolve.h"

#include <future>
#include <optional>
#include <vector>

#include "compiler/artifact.h"
#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "core/error.h"

namespace tfe {

namespace {

// How the asked plan options differ from an artifact's, but for the arch, which is always the device's;
// empty where they agree.
std::string differences_except_arch(PlanOptions asked, const PlanOptions& artifact) {
  asked.arch = artifact.arch;
  return plan_options_differences(artifact, asked);
}

}  // namespace

Resolved plan_and_compile(const HeadHeader& header, const std::string& header_sha256, const PlanOptions& options,
                          const Tuning& tuning) {
  Resolved out;
  out.plan = make_plan(header, options, tuning, header_sha256);
  const KernelCache cache = KernelCache::from_environment();
  CompileOptions copt;
  copt.arch = options.arch;
  // Specializations compile independently; the cache serializes writers of one key.
  std::vector<std::future<CachedKernel>> jobs;
  for (const KernelSpec& spec : out.plan.specs)
    jobs.push_back(
        std::async(std::launch::async, [&cache, &copt, spec] { return cache.get(make_compile_unit(spec), copt); }));
  std::optional<Error> first;
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      CachedKernel k = jobs[i].get();
      out.images[out.plan.specs[i].uri()] = KernelImage{k.kernel.lowered_name, std::move(k.kernel.cubin)};
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
  return out;
}

Resolved resolve(const HeadFile& file, const ResolveRequest& rq) {
  const std::string sha = file.header_sha256();
  PlanOptions wanted = rq.options.value_or(PlanOptions{});
  wanted.arch = rq.arch;
  if (rq.artifact_dir.empty()) return plan_and_compile(file.header(), sha, wanted, rq.tuning);

  Artifact art = load_artifact(rq.artifact_dir);
  std::string mismatch;
  if (art.plan.head_sha256 != sha)
    mismatch = fmt::format("it was compiled for the head with header sha256 {}, but {} has {}", art.plan.head_sha256,
                           file.file().path(), sha);
  else if (art.arch != rq.arch || art.plan.options.arch != rq.arch)
    mismatch = fmt::format("it was compiled for {}, but device {} is {}", art.arch, rq.device, rq.arch);
  else if (const std::string d = rq.options ? differences_except_arch(*rq.options, art.plan.options) : ""; !d.empty())
    mismatch = fmt::format("its plan options differ from those asked (the artifact's against the asked): {}", d);
  if (!mismatch.empty()) {
    if (!rq.recompile_mismatched_artifact)
      fail(
          "artifact {}: {}; compile one for this head and device (tfe-plan compile), or open with "
          "recompile_mismatched_artifact",
          rq.artifact_dir, mismatch);
    if (!rq.options) wanted = art.plan.options, wanted.arch = rq.arch;
    return plan_and_compile(file.header(), sha, wanted, rq.tuning);
  }
  validate(art.plan);
  Resolved out;
  out.plan = std::move(art.plan);
  for (ArtifactKernel& k : art.kernels) out.images[k.uri] = KernelImage{k.lowered_name, std::move(k.cubin)};
  return out;
}

}  // namespace tfe
