// The environment's overrides of OpenOptions, read in one place: Runtime::open (and testing::open) apply
// them once, before anything else (docs/runtime.md "The environment").
#pragma once
#include <tfe/runtime.h>

namespace tfe {

// `o` as the environment overrides it: TFE_GRAPHS=0 turns `graphs` off; TFE_ACCEPT_LOG=N and
// TFE_ACCEPT_LOG_FILE=PATH set `accept_log.every` and `accept_log.path`; TFE_TAP_DUMP=FILE sets `tap_dump.path`
// (and so turns the dump on); TFE_CHECK=1 or 0 sets `self_check`. A variable unset or empty changes nothing.
// Throws tfe::Error naming the variable for a value it cannot read.
OpenOptions open_options_from_environment(OpenOptions o);

}  // namespace tfe
