// The plan as YAML (docs/plan-schema.md): what `tfe-plan dump` writes and the runtime may load instead
// of planning. dump -> load gives back an equal Plan (operator==), floats included: each is written in
// its shortest form that reads back to the same bits.
#pragma once
#include <string>
#include <string_view>

#include "plan/plan.h"

namespace tfe {

std::string dump_plan_yaml(const Plan& plan);

// Reads a plan: schema_version first (another version is refused naming both), then every field,
// strictly (a missing, unknown or mistyped key is refused by its path and line), then validate(plan).
// Safe on hostile input: every failure is a tfe::Error.
Plan load_plan_yaml(std::string_view text);

}  // namespace tfe
