// The accept log's reading of the environment; tfe::AcceptLog itself is public (<tfe/accept_log.h>,
// docs/runtime.md).
#pragma once
#include <tfe/accept_log.h>

namespace tfe {

// `o` with TFE_ACCEPT_LOG=N (every N rounds) and TFE_ACCEPT_LOG_FILE=PATH applied where they are set; a
// malformed TFE_ACCEPT_LOG is refused naming it.
AcceptLogOptions accept_log_options_from_environment(AcceptLogOptions o);

}  // namespace tfe
