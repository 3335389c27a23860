// The key of one captured draft pass: the padded batch it serves and nothing else.
#pragma once
#include <compare>
#include <string>

#include <fmt/format.h>

namespace tfe {

struct GraphKey {
  int streams = 0;        // the bucket: rows of the pass (real slots + scratch padding)
  int steps = 0;          // draft steps, 1..max_steps
  bool enqueued = false;  // slot ids from the arena, outputs left there (Runtime::draft_async)
  auto operator<=>(const GraphKey&) const = default;
  std::string str() const {
    return fmt::format("(streams {}, steps {}{})", streams, steps, enqueued ? ", enqueued" : "");
  }
};

}  // namespace tfe
