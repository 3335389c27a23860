// tfe-bench: what a draft head costs on this GPU, against the memory floor, in one run.
//
//   copy bandwidth  cudaMemcpyAsync device-to-device of a large buffer (bytes read + written), timed by
//                   events, median of 10: the rate the floor below is measured against.
//   open            Runtime::open, with lazy capture so that open and graph capture are timed apart; then
//                   the first draft of every (bucket, steps) captures its graph. "capture of every graph"
//                   is the sum over keys of (first call - second call), so the one replay inside each first
//                   call is not counted as capture.
//   prefix          every slot drafted takes window + 1 real rows (positions 0..W), so each draft step
//                   attends a full window of keys, as a slot deep into a sequence does.
//   draft           per (streams B, steps S): the host-side time of a whole draft() call (tables into host
//                   memory, one graph replay, the wait for its completion word, tokens and confidences read
//                   from host memory), median over --iters after
//                   --warmup; per step = call / S. The same on a second runtime with graphs off (every
//                   node launched eagerly). Per B, a least-squares line over S splits a call into a fixed
//                   cost and a marginal cost per step.
//   floor           step_bytes(h, B, fp8 in use).total() / copy bandwidth: the time one step takes if it only
//                   moved its bytes at copy speed. ratio = measured per-step time / floor.
//   extend          extend() of 1, 16 and 512 rows (the ring's rows when it is shorter) on one slot, with
//                   the synchronize that makes it complete.
//   drafts          (--drafts-out) for slots 0..B-1 after the prefix, max_steps steps: tfe's draft tokens and
//                   confidences with the exact inputs (taps, tokens, positions), in the layout of
//                   `tfe-plan reference` vectors, so that bench/torch_head.py replays them.
//
// Each part fails on its own: its error is printed and recorded in the JSON, and the parts that do not
// depend on it still run. Exit status 1 when any part failed.
//
// --profile (for `ncu --profile-from-start off`): after the prefix, one warm draft step per --streams value
// between cudaProfilerStart and cudaProfilerStop, and nothing else is timed: the profiler sees exactly the
// kernels of one graph replay of (streams, 1 step). bench/profile.sh drives it.
//
// --reference (no GPU): only the drafts file, from the same prefix through the CPU reference, to check a
// port (torch_head.py) on a machine without a device.
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/tfe_bench.h"
#include "core/files.h"
#include "device/cuda_check.h"
#include "tools/plan_options.h"

using namespace tfe::bench;

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tfe-bench: draft-pass time per (streams, steps) against the memory floor, eager vs graph, extend, "
      "open and capture"};
  app.add_option("--head", o.head, "head file (.tfe)")->required();
  CLI::Option* artifact = app.add_option("--artifact", o.artifact,
                                         "deploy artifact directory (tfe-plan compile); else plan and compile now");
  app.add_option("--fp8", o.fp8, "FP8 mode without an artifact: auto, off, require")
      ->check(CLI::IsMember({"auto", "off", "require"}));
  app.add_option("--dependent-launch", o.dependent_launch,
                 "programmatic dependent launch of the draft kernels: plan (where the plan marks it), off, all")
      ->check(CLI::IsMember({"plan", "off", "all"}));
  app.add_option("--l2-resident-mb", o.l2_resident_mb,
                 "MiB of L2 set aside so that part of the draft GEMVs' weights stays in L2 from one step to the "
                 "next (0: none)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--knock-out", o.knock_out,
                 "draft nodes (names without the step prefix, e.g. post_norm,final_norm) left out of every pass, "
                 "to time what the rest costs; the drafts are then wrong")
      ->delimiter(',');
  // The attention split and the tuning as tfe-plan declares them; an artifact's plan is fixed when it is
  // compiled (tfe-plan compile --dependent-streams ...), so beside --artifact they are refused, not ignored.
  tfe::cli::add_attention_split_option(&app, o.plan)->excludes(artifact);
  for (CLI::Option* option : tfe::cli::add_plan_tuning_options(&app, o.tuning)) option->excludes(artifact);
  app.add_option("--streams", o.streams, "slots per draft call: a list (1,2,4) or range (1..4)");
  app.add_option("--steps", o.steps, "draft steps per call: a list or range");
  app.add_option("--iters", o.iters, "timed calls per (streams, steps)");
  app.add_option("--warmup", o.warmup, "untimed calls before them");
  app.add_option("--extend-iters", o.extend_iters, "timed extend calls per size");
  app.add_option("--copy-gib", o.copy_gib, "size of the device-to-device copy that measures bandwidth");
  app.add_option("--seed", o.seed, "seed of the prefix taps and tokens");
  app.add_flag("!--no-eager", o.eager, "skip the runtime with graphs off");
  app.add_option("--json", o.json_out, "write the results as JSON");
  app.add_option("--csv", o.csv_out, "write the draft rows as CSV");
  app.add_option("--drafts-out", o.drafts_out,
                 "write the prefix inputs and tfe's drafts (safetensors, tfe-plan reference layout)");
  app.add_flag("--profile", o.profile,
               "one draft step per --streams value inside cudaProfilerStart/Stop (for ncu --profile-from-start off)");
  bool reference = false;
  app.add_flag("--reference", reference,
               "no GPU: only --drafts-out, through the CPU reference (the largest --streams slots, 8 steps)");
  CLI11_PARSE(app, argc, argv);
  // The outputs follow tfe-plan's rule (core/files.h), checked before the GPU or the head is touched.
  try {
    const std::vector<std::filesystem::path> inputs = {o.head, o.artifact};
    for (const auto& [flag, path] :
         {std::pair{"--json", &o.json_out}, {"--csv", &o.csv_out}, {"--drafts-out", &o.drafts_out}})
      if (!path->empty()) tfe::files::check_output(*path, flag, inputs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-bench: %s\n", e.what());
    return 1;
  }

  if (reference) {
    try {
      return run_reference(o, parse_list("--streams", o.streams, 1, 16));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tfe-bench: %s\n", e.what());
      return 1;
    }
  }
  if (tfe::cuda::device_count() == 0) {
    std::fprintf(stderr, "tfe-bench: no CUDA device found; the benchmark needs a GPU\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe-bench: %s\n", e.what());
    return 1;
  }
}
