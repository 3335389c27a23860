#include "plan/tuning.h"

#include "core/error.h"

namespace tfe {

void validate(const Tuning& t) {
  if (t.dependent_streams < 0 || t.dependent_streams > 16)
    fail("tuning: dependent_streams = {} is outside 0..16", t.dependent_streams);
  if (t.dependent_streams_fp8 < 0 || t.dependent_streams_fp8 > 16)
    fail("tuning: dependent_streams_fp8 = {} is outside 0..16", t.dependent_streams_fp8);
}

}  // namespace tfe
