// Built-in head shapes: `tiny` and `tiny-two-stage` (tests, seconds on a CPU), `llama3-8b-eagle3`
// (the public EAGLE-3 head of Llama-3.1-8B), `tfe-two-stage` (a two-stage head over the same target).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <tfe/header.h>

namespace tfe {

std::vector<std::string> preset_names();
// The header of a preset (no FP8 forms); throws tfe::Error listing the presets for an unknown name.
HeadHeader preset_header(std::string_view name);

}  // namespace tfe
