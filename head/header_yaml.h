// The head header as YAML: the `head.header` block of a plan and the `--config` of `tfe-plan random`.
// Every field is written and every field is required on read:
//
//   format_version: 1
//   name: tiny
//   taps: [{layer: 1, norm: false}, {layer: final, norm: true}]
//   target_hidden: 96 ... draft_vocab: 300
//   window: 15
//   rope: {theta: 10000, llama3: false, factor: 8, low_freq_factor: 1, high_freq_factor: 4,
//          original_max_positions: 8192}
//   rms_eps: 1e-06
//   qk_norm: false
//   head_type: dense            # or two_stage
//   cand_k: 0
//   lowrank: 0
//   fp8: [wq, wk]               # linears with an FP8 form
//
// Floats are written in their shortest form that reads back to the same bits.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include <tfe/header.h>
#include "core/yaml_read.h"

namespace tfe {

// The largest header document read from a file (`random --config`): a header is well under a kilobyte.
inline constexpr uint64_t kMaxHeaderYamlBytes = uint64_t{1} << 20;

YAML::Node header_to_yaml(const HeadHeader& h);
// Refuses a missing, mistyped or unknown key by name (with its line), then validate()s the header.
HeadHeader header_from_yaml(const YAML::Node& node);
// The same, for a document's text (`random --config`): YAML syntax errors name their line.
HeadHeader header_from_yaml_text(std::string_view text);
// Reads the header at `f` (used inside a plan document, so messages carry the plan's path).
HeadHeader header_from_yaml(const yaml::Field& f);

}  // namespace tfe
