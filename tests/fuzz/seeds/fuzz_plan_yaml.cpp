// Seeds for fuzz_plan_yaml: dumped plans of the tiny presets (dense and two-stage, a single bucket and
// one step so each seed stays small enough for the fuzzer to mutate quickly), with and without FP8.
#include <filesystem>
#include <fstream>
#include <string>

#include "plan/plan.h"
#include "plan/plan_yaml.h"
#include "head/presets.h"
#include "hostile_inputs.h"
#include "seed_corpus.h"

int main(int argc, char** argv) {
  const auto corpus = corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path& dir = *corpus;
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    for (bool fp8 : {false, true}) {
      tfe::HeadHeader h = tfe::preset_header(preset);
      if (fp8)
        for (const auto& l : tfe::linears_in_use(h)) h.fp8.push_back(l);
      tfe::PlanOptions o;
      o.buckets = {1};
      o.max_steps = 1;
      o.max_slots = 2;
      o.extend_rows = 16;
      const std::string yaml = tfe::dump_plan_yaml(tfe::make_plan(h, o));
      std::ofstream(dir / (std::string(preset) + (fp8 ? "-fp8" : "") + ".yaml"), std::ios::trunc) << yaml;
    }
  }
  // Inputs that once took minutes to refuse, or read as "bad file": a 1 MiB map of many keys, deep nesting.
  std::ofstream(dir / "many-keys.yaml", std::ios::trunc) << tfe::test::many_keys_yaml(size_t{1} << 20);
  std::ofstream(dir / "deep.yaml", std::ios::trunc) << tfe::test::deep_yaml(1000);
  return 0;
}
