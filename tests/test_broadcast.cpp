// tfe::DraftBroadcast's checks that come before any NCCL or CUDA call (the broadcasts themselves run in
// tests/gpu/broadcast_ranks.cpp, one process per GPU).
#include <doctest/doctest.h>

#include <tfe/broadcast.h>

using namespace tfe;

TEST_CASE("broadcast: options and ranks out of range are refused by name before NCCL is called") {
  const BroadcastOptions good{.max_streams = 16, .max_steps = 4, .device = 0};
  const ncclUniqueId id{};
  auto refused = [&](BroadcastOptions o, int ranks, int rank, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(DraftBroadcast::create(id, ranks, rank, o), doctest::Contains(message), Error);
  };
  BroadcastOptions o = good;
  o.max_streams = 0;
  refused(o, 2, 0, "max_streams = 0 must be >= 1");
  o = good;
  o.max_steps = -1;
  refused(o, 2, 0, "max_steps = -1 must be >= 1");
  o = good;
  o.timeout = std::chrono::milliseconds(0);
  refused(o, 2, 0, "timeout = 0 ms must be > 0");
  refused(good, 0, 0, "ranks = 0 must be >= 1");
  refused(good, 2, 2, "rank 2 is outside 0..1");
  refused(good, 2, -1, "rank -1 is outside 0..1");
  CHECK_THROWS_WITH_AS(DraftBroadcast::attach(nullptr, good), doctest::Contains("the communicator is null"), Error);
}
