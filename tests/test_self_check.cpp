// The pieces of the self-check at open that run without a GPU: the bound of reference/agreement.h applied to
// drafts (the CPU reference against itself, then against drafts altered at one step) and TFE_CHECK.
#include <doctest/doctest.h>

#include <random>

#include "head/presets.h"
#include "reference/agreement.h"
#include "reference/ops.h"
#include <tfe/reference.h>
#include "runtime/self_check.h"
#include "test_util.h"

using namespace tfe;

namespace {

struct Drafted {
  DraftResult result;
  DraftTrace trace;
};

Drafted reference_draft(const HeadFile& file, int slots, int steps) {
  ReferenceOptions o;
  o.max_slots = 4;
  o.max_steps = steps;
  Reference ref(file, o);
  const HeadHeader& h = file.header();
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<std::vector<bf16_bits>> taps(static_cast<size_t>(slots));
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(slots));
  std::vector<ExtendRequest> requests;
  std::vector<int> ids;
  for (int s = 0; s < slots; ++s) {
    const int64_t rows = 2 + s;
    for (int64_t i = 0; i < rows * static_cast<int64_t>(h.taps.size()) * h.target_hidden; ++i)
      taps[static_cast<size_t>(s)].push_back(float_to_bf16(d(rng)));
    for (int64_t i = 0; i < rows; ++i)
      tokens[static_cast<size_t>(s)].push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(h.vocab)));
    requests.push_back({s, 0, rows, taps[static_cast<size_t>(s)], tokens[static_cast<size_t>(s)]});
    ids.push_back(s);
  }
  ref.extend(requests);
  Drafted out;
  out.result = ref.draft(ids, steps, &out.trace);
  return out;
}

// The first step of stream i the bound compares past (its margin above kDraftMargin), or 0.
int compared_step(const HeadHeader& h, const Drafted& d, int i) {
  return draft_margin(h, d.trace.at(i, 1)) > kDraftMargin ? 1 : 0;
}

}  // namespace

TEST_CASE("agreement: the reference agrees with itself, and a changed token or confidence is named at its step") {
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const auto bytes = test::random_head_bytes(preset_header(preset), 11);
    const HeadFile file = HeadFile::from_bytes(bytes);
    const HeadHeader& h = file.header();
    const Drafted d = reference_draft(file, 4, 4);
    const DraftAgreement same = compare_with_reference(h, d.result, d.result, d.trace);
    CHECK_FALSE(same.first.has_value());
    // Each chain is compared up to its first near-tie.
    int want = 0;
    for (int i = 0; i < 4; ++i)
      for (int s = 1; s <= 4 && draft_margin(h, d.trace.at(i, s)) > kDraftMargin; ++s) ++want;
    CHECK(same.compared == want);
    int stream = -1;
    for (int i = 0; i < 4 && stream < 0; ++i)
      if (compared_step(h, d, i)) stream = i;
    if (stream < 0) {
      MESSAGE("every chain of this head starts at a near-tie: nothing to alter");
      continue;
    }
    DraftResult token = d.result;
    token.tokens[static_cast<size_t>(stream * 4)] += 1;
    const DraftAgreement t = compare_with_reference(h, token, d.result, d.trace);
    REQUIRE(t.first.has_value());
    CHECK(t.first->stream == stream);
    CHECK(t.first->step == 1);
    CHECK(t.first->token == d.result.token(stream, 1) + 1);
    CHECK(t.first->want_token == d.result.token(stream, 1));
    CHECK(t.first->margin > kDraftMargin);
    DraftResult conf = d.result;
    conf.confidences[static_cast<size_t>(stream * 4)] += 2 * kConfidenceTolerance;
    const DraftAgreement c = compare_with_reference(h, conf, d.result, d.trace);
    REQUIRE(c.first.has_value());
    CHECK(c.first->stream == stream);
    CHECK(c.first->token == c.first->want_token);
    // Within the tolerance: no disagreement.
    conf.confidences[static_cast<size_t>(stream * 4)] = d.result.confidence(stream, 1) + kConfidenceTolerance / 2;
    CHECK_FALSE(compare_with_reference(h, conf, d.result, d.trace).first.has_value());
  }
}

TEST_CASE("agreement: drafts of another shape are refused") {
  const auto bytes = test::random_head_bytes(preset_header("tiny"), 11);
  const HeadFile file = HeadFile::from_bytes(bytes);
  const Drafted d = reference_draft(file, 2, 3);
  DraftResult shorter = d.result;
  shorter.steps = 2;
  CHECK_THROWS_WITH_AS(compare_with_reference(file.header(), shorter, d.result, d.trace),
                       doctest::Contains("2 slots x 2 steps against the reference's 2 x 3"), Error);
}
