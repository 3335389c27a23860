// Calls the runtime refuses, with a clear message, leaving its state as it was: the slot table, and the
// next draft's outputs bit for bit.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>

#include "compiler/artifact.h"
#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

struct Snapshot {
  std::vector<int32_t> last_pos, last_token;
  DraftResult draft;
};

Snapshot snapshot(Runtime& rt, const std::vector<int>& slots) {
  Snapshot s;
  for (int x : slots) {
    s.last_pos.push_back(rt.slots().last_pos(x));
    s.last_token.push_back(rt.slots().last_token(x));
  }
  s.draft = rt.draft(slots, 3);
  return s;
}

void check_unchanged(Runtime& rt, const std::vector<int>& slots, const Snapshot& before) {
  const Snapshot now = snapshot(rt, slots);
  CHECK(now.last_pos == before.last_pos);
  CHECK(now.last_token == before.last_token);
  CHECK(now.draft.tokens == before.draft.tokens);
  CHECK(std::memcmp(now.draft.confidences.data(), before.draft.confidences.data(),
                    before.draft.confidences.size() * sizeof(float)) == 0);
}

TFE_GPU_TEST_CASE("refusals: bad extends and drafts are refused by name and change nothing") {
  auto head = random_head_image("tiny", 51, false);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(13);
  const std::vector<Rows> prefix = {random_rows(rng, h, 0, 0, 10), random_rows(rng, h, 1, 0, 4)};
  rt.extend(requests(prefix));
  const std::vector<int> slots = {0, 1};
  const Snapshot before = snapshot(rt, slots);
  const int R = rt.ring_rows();

  auto refused = [&](std::vector<Rows> rows, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(rt.extend(requests(rows)), doctest::Contains(message), Error);
    check_unchanged(rt, slots, before);
  };
  refused({random_rows(rng, h, 2, 0, R + 1)}, "exceeds the ring");
  refused({random_rows(rng, h, 0, 12, 2)}, "does not continue the slot");  // a gap
  refused({random_rows(rng, h, 0, 9, 2)}, "does not continue the slot");   // a step back
  refused({random_rows(rng, h, po.max_slots, 0, 2)}, "is outside 0..");    // the scratch slot is not a slot
  refused({random_rows(rng, h, -1, 0, 2)}, "is outside 0..");
  // Positions at the integer limits: refused by the shared check, never wrapped into a ring row.
  refused({random_rows(rng, h, 2, std::numeric_limits<int64_t>::max(), 2)}, "exceeds");
  refused({random_rows(rng, h, 2, std::numeric_limits<int64_t>::max() - 4, 8)}, "exceeds");
  refused({random_rows(rng, h, 2, std::numeric_limits<int32_t>::max(), 1)}, "exceeds");
  refused({random_rows(rng, h, 2, std::numeric_limits<int64_t>::min(), 1)}, "is negative");
  {
    // Device rows: the same check on the host, before any pointer is formed from the position.
    const Rows far = random_rows(rng, h, 2, std::numeric_limits<int64_t>::max(), 2);
    const DeviceExtendRequest q{
        2, far.first_pos, 2, reinterpret_cast<const bf16_bits*>(16), 0, reinterpret_cast<const int32_t*>(16)};
    CHECK_THROWS_WITH_AS(rt.extend(std::span(&q, 1)), doctest::Contains("exceeds"), Error);
    check_unchanged(rt, slots, before);
  }
  {
    Rows bad = random_rows(rng, h, 1, 4, 3);
    bad.tokens[1] = static_cast<int32_t>(h.vocab);
    refused({bad}, "is outside [0,");
  }
  {
    Rows short_taps = random_rows(rng, h, 1, 4, 3);
    short_taps.taps.pop_back();
    refused({short_taps}, "tap values for 3 rows");
  }
  // A valid request beside a refused one: neither is applied.
  refused({random_rows(rng, h, 1, 4, 2), random_rows(rng, h, 0, 13, 1)}, "does not continue the slot");
  refused({random_rows(rng, h, 1, 4, 2), random_rows(rng, h, 1, 6, 1)}, "one request per slot");

  auto draft_refused = [&](std::vector<int> s, int steps, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(rt.draft(s, steps), doctest::Contains(message), Error);
    check_unchanged(rt, slots, before);
  };
  draft_refused({0}, 0, "steps = 0 is outside");
  draft_refused({0}, po.max_steps + 1, "is outside 1..");
  draft_refused({0, 0}, 1, "appears twice");
  draft_refused({0, 3}, 1, "is empty");
  draft_refused({}, 1, "no slots given");
  std::vector<int> many(static_cast<size_t>(po.buckets.back() + 1));
  std::iota(many.begin(), many.end(), 0);
  draft_refused(many, 1, "exceed the largest streams bucket");
  CHECK_THROWS_WITH_AS(rt.reset(po.max_slots), doctest::Contains("is outside 0.."), Error);
  check_unchanged(rt, slots, before);
  // First ranks on a plan without first_ranks, host or device, are refused naming the plan option; ranks
  // all 0 are the chain, which the reference drafts too.
  CHECK(rt.draft(slots, 3, std::vector<int>{0, 0}).tokens == before.draft.tokens);
  const std::vector<int> ranks = {1, 0};
  CHECK_THROWS_WITH_AS(rt.draft(slots, 2, ranks), doctest::Contains("this runtime's plan has first_ranks off"), Error);
  CHECK_THROWS_WITH_AS(rt.draft_async(rt.draft_slots(), 2, 2, {}, std::nullopt, rt.draft_slots()),
                       doctest::Contains("this runtime's plan has first_ranks off"), Error);
  check_unchanged(rt, slots, before);
}

TFE_GPU_TEST_CASE("refusals: first ranks out of their limits are refused by name and change nothing") {
  auto head = random_head_image("tiny", 51, false);
  const HeadHeader& h = head->file.header();
  PlanOptions po = test_plan_options(Fp8Mode::off);
  po.first_ranks = true;
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(13);
  rt.extend(requests({random_rows(rng, h, 0, 0, 10), random_rows(rng, h, 1, 0, 4)}));
  const std::vector<int> slots = {0, 1};
  const Snapshot before = snapshot(rt, slots);
  const auto refused = [&](std::vector<int> ranks, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(rt.draft(slots, 3, ranks), doctest::Contains(message), Error);
    CHECK_THROWS_WITH_AS(rt.draft_async(slots, 3, {}, std::nullopt, ranks), doctest::Contains(message), Error);
    check_unchanged(rt, slots, before);
  };
  refused({1}, "first_ranks has 1 entries for 2 slots");
  refused({0, 8}, "first_ranks[1] = 8 is outside 0..7");
  refused({-1, 0}, "first_ranks[0] = -1 is outside 0..7");
  // The same calls as the CPU reference refuses, with its messages.
  Reference ref(head->file, reference_options(po));
  ref.extend(requests({random_rows(rng, h, 0, 0, 10), random_rows(rng, h, 1, 0, 4)}));
  CHECK_THROWS_WITH_AS(ref.draft(slots, 3, std::vector<int>{0, 8}),
                       doctest::Contains("draft: first_ranks[1] = 8 is outside 0..7"), Error);
}

TFE_GPU_TEST_CASE("refusals: with the self-check on, a non-finite tap is refused naming slot and row") {
  auto head = random_head_image("tiny", 52, false);
  const HeadHeader& h = head->file.header();
  OpenOptions o = test_open_options(test_plan_options(Fp8Mode::off));
  o.self_check = true;
  Runtime rt = Runtime::open(head->file, o);
  std::mt19937_64 rng(17);
  Rows rows = random_rows(rng, h, 1, 20, 3);
  rows.taps[rows.taps.size() / 2] = 0x7FC0;  // a NaN in row 1
  CHECK_THROWS_WITH_AS(rt.extend(requests({rows})), doctest::Contains("extend of slot 1: taps row 1 (position 21)"),
                       Error);
  CHECK(rt.slots().empty(1));
}

// The arch of device 0 as a plan names it (sm_90 on an H200).
std::string device_arch_name() {
  int major = 0, minor = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess);
  return fmt::format("sm_{}{}", major, minor);
}

TFE_GPU_TEST_CASE("refusals: an artifact compiled for another head is refused, or recompiled when asked") {
  auto mine = random_head_image("tiny", 61, false);
  auto other = random_head_image("tiny-two-stage", 62, false);
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tfe-gpu-artifact-{}", ::getpid());
  std::filesystem::remove_all(dir);
  PlanOptions for_other = po;
  for_other.arch = device_arch_name();
  compile_plan(make_plan(other->file.header(), for_other, {}, other->file.header_sha256()), dir.string());

  OpenOptions o = test_open_options(po);
  o.artifact_dir = dir.string();
  CHECK_THROWS_WITH_AS(Runtime::open(mine->file, o), doctest::Contains("compiled for the head"), Error);
  // The artifact's own head opens from it.
  Runtime from_artifact = Runtime::open(other->file, o);
  CHECK(tfe::testing::plan(from_artifact).head_sha256 == other->file.header_sha256());
  // Asked plan options other than the artifact's: refused, naming each option with both values.
  OpenOptions differing = o;
  differing.plan->attention_split = AttentionSplit::same_drafts;
  differing.plan->max_steps = 4;
  CHECK_THROWS_WITH_AS(Runtime::open(other->file, differing),
                       doctest::Contains("max_steps 8 against 4; attention_split per_bucket against same_drafts"),
                       Error);
  o.recompile_mismatched_artifact = true;
  Runtime recompiled = Runtime::open(mine->file, o);
  CHECK(tfe::testing::plan(recompiled).head_sha256 == mine->file.header_sha256());
  std::filesystem::remove_all(dir);
}

// The host buffers the runtime itself writes and reads must be there, in the form it uses them, or the
// plan's validation refuses it by name (tests/test_plan_validate.cpp), an artifact's at open. `mend` edits
// tiny's plan; the test checks that validate() refuses it and that open refuses its compiled artifact, both
// with `message`.
template <typename Mend>
void check_artifact_refused_at_open(uint64_t seed, std::string_view tag, Mend&& mend, const char* message) {
  auto head = random_head_image("tiny", seed, false);
  PlanOptions po = test_plan_options(Fp8Mode::off);
  po.arch = device_arch_name();
  Plan p = make_plan(head->file.header(), po, {}, head->file.header_sha256());
  mend(p);
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(message), Error);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tfe-gpu-artifact-{}-{}", tag, ::getpid());
  std::filesystem::remove_all(dir);
  compile_plan(p, dir.string());
  OpenOptions o = test_open_options(po);
  o.artifact_dir = dir.string();
  CHECK_THROWS_WITH_AS(Runtime::open(head->file, o), doctest::Contains(message), Error);
  std::filesystem::remove_all(dir);
}

Buffer& host_buffer(Plan& p, std::string_view name) {
  const auto it =
      std::find_if(p.host.buffers.begin(), p.host.buffers.end(), [&](const Buffer& b) { return b.name == name; });
  REQUIRE(it != p.host.buffers.end());
  return *it;
}

TFE_GPU_TEST_CASE("refusals: an artifact whose completion word is not one int32 is refused at open") {
  // Two words: still what store_outputs reaches, but the host polls exactly one.
  check_artifact_refused_at_open(
      74, "done",
      [](Plan& p) {
        Buffer& done = host_buffer(p, "host_done");
        done.shape = {2};
        done.bytes = 8;
        p.host.bytes = std::max(p.host.bytes, done.offset + done.bytes);
      },
      "host buffer `host_done` holds 8 bytes; the pass's completion word is one int32");
}

TFE_GPU_TEST_CASE("refusals: an FP8 weight holding an e4m3 NaN code is refused at open, by tensor and element") {
  // The FP8 GEMV would read the code as a finite weight; the upload reads every byte and refuses it.
  auto head = random_head_image("tiny", 72, true);
  const auto& tensors = head->file.file().tensors();
  const auto f8 =
      std::find_if(tensors.begin(), tensors.end(), [](const TensorView& t) { return t.dtype == DType::F8_E4M3; });
  REQUIRE(f8 != tensors.end());
  head->bytes[static_cast<size_t>(f8->data - head->bytes.data()) + 5] = std::byte{0xff};  // `file` views these
  const OpenOptions o = test_open_options(test_plan_options(Fp8Mode::require));
  const std::string want = "weights: tensor `" + f8->name + "`: element 5 is 0xff, an e4m3 NaN code";
  CHECK_THROWS_WITH_AS(Runtime::open(head->file, o), doctest::Contains(want.c_str()), Error);
}

TFE_GPU_TEST_CASE("refusals: an out-of-range device is refused at open") {
  auto head = random_head_image("tiny", 71, false);
  OpenOptions o = test_open_options(test_plan_options());
  o.device = 1 << 20;
  CHECK_THROWS_WITH_AS(Runtime::open(head->file, o), doctest::Contains("is outside 0.."), Error);
}

}  // namespace
}  // namespace tfe::test
