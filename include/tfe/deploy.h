// The deploy steps as library calls: what `tfe-plan random`, `convert`, `dump` and `compile` do, for
// programs (and the Python package) that make heads and artifacts without running the CLI. Each call
// gives the same file or text as its command, and throws tfe::Error naming the file, field or option.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tfe/head_file.h>
#include <tfe/header.h>
#include <tfe/options.h>

namespace tfe {

// The built-in head shapes (`--preset`), and the header of one (throws listing the names when unknown).
std::vector<std::string> preset_names();
HeadHeader preset_header(std::string_view name);

// `tfe-plan random`: a head of random weights, a pure function of (header, seed).
struct RandomHeadOptions {
  std::string preset;       // a preset's header, or
  std::string config_path;  // a header as YAML (the header section of a dumped plan); exactly one of the two
  uint64_t seed = 0;
  bool fp8 = false;  // add the FP8 form of every linear in use
  int threads = 0;   // 0: one per hardware thread; the file does not depend on it
};
// Writes the head to `out_path` (atomically) and returns its header.
HeadHeader write_random_head(const RandomHeadOptions& options, const std::string& out_path);

// `tfe-plan convert`: an EAGLE-3 checkpoint (Hugging Face directory: config.json + safetensors).
struct CheckpointOptions {
  std::string eagle_dir;
  std::optional<std::string> target_dir;  // the target model: its config.json and, if needed, its embedding
  int window = kMaxWindow;                // 1 .. kMaxWindow; EAGLE-3 heads attend over the whole context
  bool fp8 = false;                       // add the FP8 form of every linear in use
  int threads = 0;                        // 0: one per hardware thread
};
// Writes the .tfe to `out_path` (atomically) and returns its header.
HeadHeader convert_checkpoint(const CheckpointOptions& options, const std::string& out_path);
// What the conversion allows but a deployer should know, a sentence each naming the field and the numbers
// (e.g. a head whose config.json names more positions than the window keeps).
std::vector<std::string> checkpoint_warnings(const CheckpointOptions& options);

// What a plan is made for: a head's header and the sha256 a plan and an artifact record of it (empty for a
// preset, which has no file).
struct PlanSource {
  HeadHeader header;
  std::string header_sha256;

  static PlanSource file(const std::string& head_path);  // reads and validates the head file
  static PlanSource head(const HeadFile& head);
  // `fp8`: the FP8 forms `tfe-plan random --fp8` gives the preset (`--preset-fp8`).
  static PlanSource preset(std::string_view name, bool fp8 = false);
};

// `tfe-plan dump`: the plan as YAML (docs/plan-schema.md).
std::string plan_yaml(const PlanSource& source, const PlanOptions& options);

// `tfe-plan compile`: plans and writes the deploy artifact (plan.yaml, one cubin per specialization,
// manifest.json) to `out_dir`, compiling through the kernel cache of the environment ($TFE_CACHE_DIR, ...).
struct ArtifactSummary {
  size_t specs = 0;
  size_t hits = 0;  // specializations found in the cache
  size_t misses = 0;
  double wall_ms = 0;
  std::string out_dir;
  std::string cache_dir;
};
// One line per finished specialization ("[12/87] gemv__... (miss, 143 ms)"), from worker threads, one call
// at a time.
using ArtifactProgress = std::function<void(const std::string& line)>;
ArtifactSummary compile_artifact(const PlanSource& source, const PlanOptions& options, const std::string& out_dir,
                                 const ArtifactProgress& progress = {});

// `tfe-plan inspect DIR`: an artifact checked on the CPU, without a GPU: the manifest (schema, fields),
// the sha256 and size of plan.yaml and of every CUBIN, one CUBIN per specialization of the plan defining
// its lowered name, and the head the plan was made for against the manifest's. With `head_path`, that
// head file (its header's sha256) must be the one the artifact was compiled for. Throws tfe::Error naming
// the file and the mismatch.
struct ArtifactInfo {
  std::string dir;
  std::string arch;
  std::string nvrtc_version;
  std::string head_sha256;  // empty for an artifact compiled from a preset
  size_t kernels = 0;
  uint64_t cubin_bytes = 0;
};
ArtifactInfo verify_artifact(const std::string& dir, const std::string& head_path = {});

}  // namespace tfe
