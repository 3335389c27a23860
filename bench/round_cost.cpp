// round_cost: one engine round on device-resident data, from C++ (bench/round_cost.py runs the same round
// from Python and puts the two side by side).
//
// A round, as an engine runs it once the target has verified: extend every slot by the accepted rows (taps
// and tokens already on the device, as the target's forward left them), then enqueue the next draft
// (slot ids on the device). Two figures per configuration, each the median over --rounds rounds:
//   call_us   host time inside the two calls (what the API costs the engine's thread);
//   round_us  from the first call to the stream's completion of the draft (what the round costs).
// Prints one JSON line per configuration.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <tfe/runtime.h>

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw tfe::CudaError(fmt::format("{}: {}", what, cudaGetErrorName(e)));
}

struct Options {
  std::string head;
  std::string artifact;
  std::vector<int> slots = {1, 4, 16};
  int rows = 3;  // accepted rows a slot extends by each round
  int steps = 4;
  int rounds = 500;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(const Options& o) {
  tfe::OpenOptions open;
  open.artifact_dir = o.artifact;
  if (o.artifact.empty()) {
    tfe::PlanOptions p;
    p.max_slots = std::max(16, *std::max_element(o.slots.begin(), o.slots.end()));
    p.max_steps = std::max(8, o.steps);
    open.plan = p;
  }
  tfe::Runtime rt = tfe::Runtime::open(o.head, open);
  const tfe::HeadHeader& h = rt.header();
  const int64_t width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  const int most = *std::max_element(o.slots.begin(), o.slots.end());

  // The "target's" output of one round: rows x slots of taps and tokens, on the device.
  std::mt19937 rng(1);
  std::vector<tfe::bf16_bits> taps(static_cast<size_t>(most * o.rows * width));
  for (auto& t : taps) t = static_cast<tfe::bf16_bits>(0x3c00 + rng() % 256);  // values near 0.0078
  std::vector<int32_t> tokens(static_cast<size_t>(most * o.rows));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(h.vocab));
  std::vector<int32_t> ids(static_cast<size_t>(most));
  for (int i = 0; i < most; ++i) ids[static_cast<size_t>(i)] = i;
  void *d_taps = nullptr, *d_tokens = nullptr, *d_ids = nullptr;
  check(cudaMalloc(&d_taps, taps.size() * 2), "cudaMalloc taps");
  check(cudaMalloc(&d_tokens, tokens.size() * 4), "cudaMalloc tokens");
  check(cudaMalloc(&d_ids, ids.size() * 4), "cudaMalloc ids");
  check(cudaMemcpy(d_taps, taps.data(), taps.size() * 2, cudaMemcpyHostToDevice), "copy taps");
  check(cudaMemcpy(d_tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice), "copy tokens");
  check(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "copy ids");

  for (int n : o.slots) {
    for (int s = 0; s < most; ++s)
      if (!rt.slots().empty(s)) rt.reset(s);
    std::vector<int64_t> next(static_cast<size_t>(n), 0);
    std::vector<tfe::DeviceExtendRequest> requests(static_cast<size_t>(n));
    auto round = [&] {
      for (int s = 0; s < n; ++s) {
        auto& r = requests[static_cast<size_t>(s)];
        r.slot = s;
        r.first_pos = next[static_cast<size_t>(s)];
        r.n_rows = o.rows;
        r.taps = static_cast<const tfe::bf16_bits*>(d_taps) + static_cast<int64_t>(s) * o.rows * width;
        r.tokens = static_cast<const int32_t*>(d_tokens) + static_cast<int64_t>(s) * o.rows;
        next[static_cast<size_t>(s)] += o.rows;
      }
      const auto t0 = Clock::now();
      rt.extend(requests);
      rt.draft_async(static_cast<const int32_t*>(d_ids), n, o.steps);
      const auto t1 = Clock::now();
      rt.synchronize();
      const auto t2 = Clock::now();
      return std::pair{std::chrono::duration<double, std::micro>(t1 - t0).count(),
                       std::chrono::duration<double, std::micro>(t2 - t0).count()};
    };
    for (int i = 0; i < 20; ++i) round();  // captures the enqueued graphs, warms the caches
    std::vector<double> call, whole;
    for (int i = 0; i < o.rounds; ++i) {
      // Long runs stay inside the ring's position range: a slot restarts before it would pass it.
      if (next[0] + o.rows > 1 << 30)
        for (int s = 0; s < n; ++s) rt.reset(s), next[static_cast<size_t>(s)] = 0;
      const auto [c, w] = round();
      call.push_back(c);
      whole.push_back(w);
    }
    std::printf("%s\n", nlohmann::json{{"side", "c++"},
                                       {"slots", n},
                                       {"rows", o.rows},
                                       {"steps", o.steps},
                                       {"rounds", o.rounds},
                                       {"call_us", median(call)},
                                       {"round_us", median(whole)}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  cudaFree(d_taps);
  cudaFree(d_tokens);
  cudaFree(d_ids);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"round_cost: one engine round (extend of device rows + enqueued draft) from C++"};
  app.add_option("--head", o.head, "head file (.tfe)")->required();
  app.add_option("--artifact", o.artifact, "deploy artifact directory; else compile now");
  app.add_option("--slots", o.slots, "sequences per round (several: one configuration each)");
  app.add_option("--rows", o.rows, "accepted rows a slot extends by each round")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "draft steps")->check(CLI::PositiveNumber);
  app.add_option("--rounds", o.rounds, "rounds timed per configuration")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    run(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "round_cost: %s\n", e.what());
    return 1;
  }
}
