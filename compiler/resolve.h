// The plan and kernels a runtime opens with: from a deploy artifact when it fits the head and the device,
// else planned now and compiled through the kernel cache. The one place that decides between the two.
#pragma once
#include <map>
#include <string>

#include <tfe/head_file.h>
#include <tfe/options.h>

#include "plan/plan.h"

namespace tfe {

// A cubin and the symbol to look up in it.
struct KernelImage {
  std::string lowered_name;
  std::string cubin;
};

struct Resolved {
  Plan plan;
  std::map<std::string, KernelImage> images;  // by KernelSpec::uri()
};

struct ResolveRequest {
  std::string artifact_dir;                    // empty: plan and compile now
  std::optional<PlanOptions> options;          // empty: the defaults, or the artifact's
  Tuning tuning;                               // when planning anew; an artifact's plan keeps its own
  bool recompile_mismatched_artifact = false;  // else a mismatched artifact is refused, naming the mismatch
  std::string arch;                            // the device's, e.g. "sm_90"; always wins over options.arch
  int device = 0;                              // for messages
};

// Plans `options` and `tuning` for `header` and compiles every kernel specialization through the cache
// (KernelCache::from_environment), in parallel; the first failure is thrown.
Resolved plan_and_compile(const HeadHeader& header, const std::string& header_sha256, const PlanOptions& options,
                          const Tuning& tuning = {});

// The artifact when its head sha256, arch and (when asked) options match; else refused, or, with
// recompile_mismatched_artifact, planned and compiled anew.
Resolved resolve(const HeadFile& file, const ResolveRequest& request);

}  // namespace tfe
