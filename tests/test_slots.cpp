#include <doctest/doctest.h>

#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/extend_check.h"
#include <tfe/slots.h>

using namespace tfe;

namespace {

// window 3, max_steps 2 -> ring of 6 rows; 4 slots; vocab 100; at most 2 slots per draft.
SlotLimits limits() {
  SlotLimits l;
  l.max_slots = 4;
  l.window = 3;
  l.max_steps = 2;
  l.ring_rows = ring_rows(l.window, l.max_steps);
  l.vocab = 100;
  l.max_streams = 2;
  return l;
}

std::vector<int32_t> random_tokens(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, 99);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Everything a slot table exposes, for "nothing changed" checks.
struct Snapshot {
  std::vector<int64_t> values;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snapshot(const SlotTable& t) {
  Snapshot s;
  for (int i = 0; i < t.limits().max_slots; ++i) {
    s.values.push_back(t.empty(i));
    if (!t.empty(i)) s.values.insert(s.values.end(), {t.first_pos(i), t.last_pos(i), t.last_token(i)});
  }
  return s;
}

}  // namespace

TEST_CASE("slots: ring rows are window + 1 + max_steps") {
  CHECK(ring_rows(15, 8) == 24);
  CHECK(ring_rows(511, 16) == 528);
  CHECK(ring_row(25, 24) == 1);
}

TEST_CASE("slots: extend continues a slot and records its last position and token, and reset empties it") {
  std::mt19937 rng(std::random_device{}());
  SlotTable t(limits());
  CHECK(t.empty(1));
  const auto a = random_tokens(6, rng);
  t.commit_extend(1, 0, 6, a);
  CHECK_FALSE(t.empty(1));
  CHECK(t.first_pos(1) == 0);
  CHECK(t.last_pos(1) == 5);
  CHECK(t.last_token(1) == a.back());
  const auto b = random_tokens(2, rng);
  t.commit_extend(1, 6, 2, b);
  CHECK(t.first_pos(1) == 0);
  CHECK(t.last_pos(1) == 7);
  CHECK(t.last_token(1) == b.back());
  CHECK(t.key_begin(1, 7) == 4);  // 7 - window
  CHECK(t.key_begin(1, 2) == 0);  // clipped at the slot's first position
  t.reset(1);
  CHECK(t.empty(1));
  CHECK_THROWS_WITH_AS(t.last_pos(1), doctest::Contains("slot 1 is empty"), Error);
}

TEST_CASE("slots: a fresh slot may start mid-sequence and attends only from its first position") {
  std::mt19937 rng(std::random_device{}());
  SlotTable t(limits());
  t.commit_extend(2, 1000, 3, random_tokens(3, rng));
  CHECK(t.first_pos(2) == 1000);
  CHECK(t.last_pos(2) == 1002);
  CHECK(t.key_begin(2, 1002) == 1000);  // not 1002 - 3 = 999: position 999 was never seen
  CHECK(t.key_begin(2, 1005) == 1002);
  // After a reset the slot starts over anywhere, even before its old positions.
  t.reset(2);
  CHECK_NOTHROW(t.commit_extend(2, 7, 1, random_tokens(1, rng)));
  CHECK(t.first_pos(2) == 7);
}

TEST_CASE("slots: every extend refusal names what was wrong and changes nothing") {
  std::mt19937 rng(std::random_device{}());
  SlotTable t(limits());
  t.commit_extend(0, 0, 4, random_tokens(4, rng));
  t.commit_extend(3, 10, 2, random_tokens(2, rng));
  const Snapshot before = snapshot(t);
  auto refuse = [&](int slot, int64_t first, int64_t n, std::vector<int32_t> tokens, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(t.check_extend(slot, first, n, tokens), doctest::Contains(message), Error);
    CHECK_THROWS_WITH_AS(t.commit_extend(slot, first, n, tokens), doctest::Contains(message), Error);
    CHECK(snapshot(t) == before);
  };
  refuse(4, 0, 1, random_tokens(1, rng), "slot 4 is outside 0..3 (max_slots = 4)");
  refuse(-1, 0, 1, random_tokens(1, rng), "slot -1 is outside 0..3");
  refuse(1, 0, 7, random_tokens(7, rng), "span of 7 rows exceeds the ring of 6 rows");
  refuse(1, 0, 0, {}, "a span of 0 rows");
  refuse(1, 0, 3, random_tokens(2, rng), "2 tokens for 3 rows");
  refuse(1, -5, 1, random_tokens(1, rng), "first position -5 is negative");
  refuse(0, 6, 1, random_tokens(1, rng), "first position 6 does not continue the slot (expected 4; a gap");
  refuse(0, 2, 1, random_tokens(1, rng), "first position 2 does not continue the slot (expected 4; a step back");
  refuse(0, 3, 1, random_tokens(1, rng), "(expected 4; a step back");  // rewriting the last row is a step back too
  auto bad = random_tokens(3, rng);
  bad[2] = 100;
  refuse(0, 4, 3, bad, "tokens[2] = 100 is outside [0, 100)");
  bad[2] = 1;
  bad[1] = -3;
  refuse(1, 0, 3, bad, "tokens[1] = -3 is outside [0, 100)");
  refuse(1, max_position(2), 2, random_tokens(2, rng), "exceeds 2147483645");
  // Positions at the integer limits: refused by the same check, never wrapped (UBSan runs this).
  constexpr int64_t i64_max = std::numeric_limits<int64_t>::max(), i32_max = std::numeric_limits<int32_t>::max();
  refuse(1, i64_max, 2, random_tokens(2, rng), "last position 9223372036854775807 + 1 exceeds 2147483645");
  refuse(1, i64_max - 4, 6, random_tokens(6, rng), "exceeds 2147483645");
  refuse(1, i64_max, 1, random_tokens(1, rng), "exceeds 2147483645");
  refuse(1, i32_max, 1, random_tokens(1, rng), "last position 2147483647 + 0 exceeds 2147483645");
  refuse(1, std::numeric_limits<int64_t>::min(), 1, random_tokens(1, rng), "is negative");
  refuse(1, 0, i64_max, {}, "span of 9223372036854775807 rows exceeds the ring");
  refuse(1, 0, std::numeric_limits<int64_t>::min(), {}, "a span of -9223372036854775808 rows");
  refuse(0, i64_max, 1, random_tokens(1, rng), "exceeds 2147483645");  // a filled slot too
  CHECK_NOTHROW(t.check_extend(1, max_position(2), 1, random_tokens(1, rng)));
}

TEST_CASE("slots: rows whose tokens are on the device are checked and recorded by position alone") {
  std::mt19937 rng(std::random_device{}());
  SlotTable t(limits());
  t.commit_extend(0, 0, 4, random_tokens(4, rng));
  t.commit_rows(0, 4, 2);
  CHECK(t.last_pos(0) == 5);
  CHECK(t.first_pos(0) == 0);
  CHECK_THROWS_WITH_AS(t.last_token(0), doctest::Contains("slot 0: its last token is in device memory"), Error);
  const auto c = random_tokens(1, rng);
  t.commit_extend(0, 6, 1, c);  // a host extend makes it known again
  CHECK(t.last_token(0) == c.back());
  t.commit_rows(2, 50, 3);  // a fresh slot starts where its rows do
  CHECK(t.first_pos(2) == 50);
  CHECK_THROWS_WITH_AS(t.commit_rows(2, 54, 1), doctest::Contains("expected 53; a gap"), Error);
  CHECK_THROWS_WITH_AS(t.check_rows(1, 0, 7), doctest::Contains("exceeds the ring of 6 rows"), Error);
  CHECK(t.last_pos(2) == 52);

  // The whole call's check: pointers set, a stride that holds a row, one request per slot.
  const bf16_bits taps[1] = {};
  const int32_t tokens[1] = {};
  auto request = [&](int slot, int64_t first, int64_t stride) {
    return DeviceExtendRequest{slot, first, 1, taps, stride, tokens};
  };
  const int64_t width = 8;
  CHECK_NOTHROW(check_extend_requests(t, std::vector{request(1, 0, 0), request(3, 0, width + 5)}, width));
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{request(1, 0, width - 1)}, width),
                       doctest::Contains("taps_stride = 7 is below a row's 8 values"), Error);
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{request(1, 0, 0), request(1, 1, 0)}, width),
                       doctest::Contains("slot 1 appears in requests[0] and requests[1]"), Error);
  DeviceExtendRequest no_taps = request(1, 0, 0);
  no_taps.taps = nullptr;
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{no_taps}, width), doctest::Contains("taps is null"), Error);
  DeviceExtendRequest no_tokens = request(1, 0, 0);
  no_tokens.tokens = nullptr;
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{no_tokens}, width), doctest::Contains("tokens is null"),
                       Error);
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{request(0, 3, 0)}, width), doctest::Contains("a step back"),
                       Error);
  // Positions and strides at the integer limits: refused before any address is formed from them.
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{request(1, std::numeric_limits<int64_t>::max(), 0)}, width),
                       doctest::Contains("exceeds"), Error);
  DeviceExtendRequest far = request(1, 0, std::numeric_limits<int64_t>::max());
  far.n_rows = 2;
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{far}, width),
                       doctest::Contains("taps_stride = 9223372036854775807 values puts 2 rows past any address"),
                       Error);
  far.taps_stride = std::numeric_limits<int64_t>::min();
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{far}, width), doctest::Contains("is below a row's"), Error);
  far.n_rows = std::numeric_limits<int64_t>::max();
  far.taps_stride = 0;
  CHECK_THROWS_WITH_AS(check_extend_requests(t, std::vector{far}, width), doctest::Contains("exceeds the ring"), Error);
}

TEST_CASE("slots: every draft refusal names what was wrong") {
  std::mt19937 rng(std::random_device{}());
  SlotTable t(limits());
  t.commit_extend(0, 0, 2, random_tokens(2, rng));
  t.commit_extend(2, 5, 1, random_tokens(1, rng));
  const Snapshot before = snapshot(t);
  auto refuse = [&](std::vector<int> slots, int steps, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(t.check_draft(slots, steps), doctest::Contains(message), Error);
    CHECK(snapshot(t) == before);
  };
  CHECK_NOTHROW(t.check_draft(std::vector<int>{2, 0}, 2));
  refuse({}, 1, "no slots given");
  refuse({0, 2, 1}, 1, "3 slots exceed the largest streams bucket of 2");
  refuse({0, 0}, 1, "slot 0 appears twice (slots[0] and slots[1])");
  refuse({0, 1}, 1, "slot 1 is empty");
  refuse({9}, 1, "slot 9 is outside 0..3");
  refuse({0}, 0, "steps = 0 is outside 1..2");
  refuse({0}, 3, "steps = 3 is outside 1..2");
}

TEST_CASE("slots: limits are checked at construction") {
  auto l = limits();
  l.ring_rows = 5;
  CHECK_THROWS_WITH_AS(SlotTable{l}, doctest::Contains("ring_rows = 5 is below window + 1 + max_steps = 6"), Error);
  l = limits();
  l.max_slots = 0;
  CHECK_THROWS_WITH_AS(SlotTable{l}, doctest::Contains("max_slots = 0"), Error);
  l = limits();
  l.vocab = 0;
  CHECK_THROWS_WITH_AS(SlotTable{l}, doctest::Contains("vocab = 0"), Error);
}
