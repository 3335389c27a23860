// tfe_soak: many extend/draft rounds with resets on one runtime, watching for growth in host or device
// memory and for drift against the CPU reference.
//
// Round i works on slot s = i mod --slots: it resets s, extends it with 1..16 fresh rows (a seeded
// generator's, so a round's inputs follow from i), and drafts --steps tokens for every slot. A slot's state
// then depends on its last round only, so on a sampled round (every --every rounds, and the last) the CPU
// reference redoes slot s's round from a reset and its draft is compared with the runtime's. A sample
// records the host's resident set (/proc/self/statm), the device's free memory (cudaMemGetInfo), and the
// sampled rows' token agreement and largest confidence difference; the table lists them.
//
// Fails (exit 1) when the resident set grew by more than --rss-slack-mb or device free memory fell by more
// than --device-slack-mb between the first sample and the last, or a sample's token agreement is below
// --min-agreement (the kernels and the reference differ in summation order only, so near-ties may differ).
// Exit 77 without a device.
//
// Usage: tfe_soak [--rounds N (1000000)] [--every K (100000)] [--preset NAME (tiny)] [--slots S (4)]
//                 [--steps T (4)] [--min-agreement A (0.9)] [--rss-slack-mb M (64)] [--device-slack-mb M (1)]
// The helpers of tests/gpu/gpu_test.cpp use doctest's checks: its implementation is compiled here, its
// test runner never run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <CLI/CLI.hpp>
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "reference/ops.h"
#include <tfe/reference.h>
#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace {

using namespace tfe;
using namespace tfe::test;

struct Args {
  int64_t rounds = 1000000;
  int64_t every = 100000;
  std::string preset = "tiny";
  int slots = 4;
  int steps = 4;
  double min_agreement = 0.9;
  double rss_slack_mb = 64;
  double device_slack_mb = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app{"tfe_soak: extend/draft rounds with resets, against memory growth and the CPU reference"};
  app.add_option("--rounds", a.rounds)->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--every", a.every, "rounds between samples")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--preset", a.preset);
  app.add_option("--slots", a.slots)->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps)->check(CLI::PositiveNumber);
  app.add_option("--min-agreement", a.min_agreement, "least share of sampled drafts equal to the reference");
  app.add_option("--rss-slack-mb", a.rss_slack_mb, "host RSS growth allowed");
  app.add_option("--device-slack-mb", a.device_slack_mb, "device memory growth allowed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return a;
}

double rss_mb() {
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

double device_free_mb() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) fail("tfe_soak: cudaMemGetInfo failed");
  return static_cast<double>(free) / (1 << 20);
}

struct Sample {
  int64_t round = 0;
  double rss = 0, device_free = 0;
  int agree = 0, compared = 0;
  double conf_diff = 0;
};

int run(const Args& a) {
  auto head = random_head_image(a.preset, 1, false);
  const HeadHeader& h = head->file.header();
  PlanOptions po = test_plan_options(Fp8Mode::off);
  po.max_slots = std::max(po.max_slots, a.slots);
  po.max_steps = std::max(po.max_steps, a.steps);
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  Reference ref(head->file, reference_options(po));
  std::vector<int> all(static_cast<size_t>(a.slots));
  for (int s = 0; s < a.slots; ++s) all[static_cast<size_t>(s)] = s;

  std::vector<Sample> samples;
  for (int64_t i = 0; i < a.rounds; ++i) {
    const int s = static_cast<int>(i % a.slots);
    std::mt19937_64 rng(static_cast<uint64_t>(i));
    const Rows rows = random_rows(rng, h, s, 0, 1 + static_cast<int64_t>(rng() % 16));
    rt.reset(s);
    rt.extend(requests({rows}));
    // Until every slot has rows, draft only those that have.
    const std::vector<int> drafted(all.begin(), all.begin() + std::min<int64_t>(i + 1, a.slots));
    const DraftResult d = rt.draft(drafted, a.steps);
    if (i % a.every != 0 && i + 1 != a.rounds) continue;
    Sample smp{.round = i, .rss = rss_mb(), .device_free = device_free_mb()};
    ref.reset(s);
    ref.extend(requests({rows}));
    const DraftResult want = ref.draft(std::vector<int>{s}, a.steps);
    for (int t = 0; t < a.steps; ++t) {
      const size_t got_at = static_cast<size_t>(s * a.steps + t), want_at = static_cast<size_t>(t);
      smp.agree += d.tokens[got_at] == want.tokens[want_at];
      ++smp.compared;
      if (d.tokens[got_at] != want.tokens[want_at]) break;  // later steps follow other tokens
      smp.conf_diff =
          std::max(smp.conf_diff, static_cast<double>(std::fabs(d.confidences[got_at] - want.confidences[want_at])));
    }
    samples.push_back(smp);
  }

  std::printf("%12s %10s %14s %10s %10s\n", "round", "rss MB", "device free MB", "agreement", "conf diff");
  bool ok = true;
  for (const Sample& smp : samples) {
    const double agreement = static_cast<double>(smp.agree) / smp.compared;
    std::printf("%12lld %10.1f %14.1f %7d/%-2d %10.2e\n", static_cast<long long>(smp.round), smp.rss, smp.device_free,
                smp.agree, smp.compared, smp.conf_diff);
    if (agreement < a.min_agreement) ok = false;
  }
  const Sample& first = samples.front();
  const Sample& last = samples.back();
  const double rss_growth = last.rss - first.rss, device_drop = first.device_free - last.device_free;
  std::printf("rounds %lld: resident set %+.1f MB, device free %+.1f MB from the first sample to the last\n",
              static_cast<long long>(a.rounds), rss_growth, -device_drop);
  if (rss_growth > a.rss_slack_mb || device_drop > a.device_slack_mb) ok = false;
  std::printf("%s\n", ok ? "soak: passed" : "soak: FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (no_gpu()) {
      std::printf("skipped: %s\n", no_gpu_reason().c_str());
      return 77;
    }
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe_soak: %s\n", e.what());
    return 1;
  }
}
