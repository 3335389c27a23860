// draft_loop: an engine loop around tfe::Runtime with a synthetic target.
//
// Per round, for every slot: draft `steps` tokens; the target verifies greedily (it keeps the drafted
// prefix it agrees with, then adds its own token); the accepted rows (the kept drafts and the target's
// token, each with the target's taps) are extended in one call, overwriting the draft rows in the rings.
// The target is synthetic and deterministic by seed: taps are bf16 rows from a seeded generator, and at
// each drafted position it agrees with the head with probability --agree (else it picks another token),
// so the loop exercises partial acceptance at every window position. A slot whose sequence reaches
// --max-len is reset and starts a new prompt.
//
// Every --report-every rounds it prints one JSON line: per window position the drafts asked and kept,
// and the mean time per round (draft, extend, whole).
//
// --device-rows runs the round as an engine whose target lives on the GPU: the accepted rows' taps and
// tokens are in device memory (here copied up from the synthetic target, standing in for its forward),
// extend takes them there (DeviceExtendRequest), and the draft is enqueued with device slot ids
// (draft_async); only this example's host-side verify copies the drafted tokens down.
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <bit>

#include <fmt/format.h>
#include <tfe/runtime.h>

namespace {

using Clock = std::chrono::steady_clock;

// float -> bf16 bits, round to nearest even (the taps an engine hands over are bf16 already).
tfe::bf16_bits to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return static_cast<tfe::bf16_bits>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename... Args>
[[noreturn]] void refuse(fmt::format_string<Args...> f, Args&&... args) {
  throw tfe::Error(fmt::format(f, std::forward<Args>(args)...));
}

struct Options {
  std::string head;
  std::string artifact;
  int slots = 8;
  int steps = 6;
  int rounds = 200;
  int report_every = 20;
  int prompt = 64;
  int max_len = 4096;
  double agree = 0.7;
  uint64_t seed = 1;
  std::string fp8 = "auto";
  bool probe = false;
  bool device_rows = false;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) refuse("{}: {}", what, cudaGetErrorName(e));
}

// Device memory for the engine's side of --device-rows: a round's accepted rows and the slot ids.
struct DeviceRound {
  void* taps = nullptr;
  void* tokens = nullptr;
  void* ids = nullptr;
  DeviceRound(int64_t rows, int64_t width, int slots) {
    check(cudaMalloc(&taps, static_cast<size_t>(rows * width) * sizeof(tfe::bf16_bits)), "cudaMalloc taps");
    check(cudaMalloc(&tokens, static_cast<size_t>(rows) * sizeof(int32_t)), "cudaMalloc tokens");
    check(cudaMalloc(&ids, static_cast<size_t>(slots) * sizeof(int32_t)), "cudaMalloc ids");
  }
  ~DeviceRound() {
    cudaFree(taps);
    cudaFree(tokens);
    cudaFree(ids);
  }
  DeviceRound(const DeviceRound&) = delete;
  DeviceRound& operator=(const DeviceRound&) = delete;
};

// The synthetic target: taps and verification, a pure function of the seed and the call sequence.
class Target {
 public:
  Target(const tfe::HeadHeader& h, uint64_t seed, double agree)
      : width_(static_cast<int64_t>(h.taps.size()) * h.target_hidden), vocab_(h.vocab), rng_(seed), agree_(agree) {}

  std::vector<tfe::bf16_bits> taps(int64_t rows) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<tfe::bf16_bits> t(static_cast<size_t>(rows * width_));
    for (auto& x : t) x = to_bf16(d(rng_));
    return t;
  }
  int32_t token() { return std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(vocab_ - 1))(rng_); }
  // The target's token where the head drafted `drafted`: the same with probability agree, else another.
  int32_t verify(int32_t drafted) {
    if (std::bernoulli_distribution(agree_)(rng_)) return drafted;
    int32_t t = token();
    return t == drafted ? static_cast<int32_t>((t + 1) % vocab_) : t;
  }

 private:
  int64_t width_;
  int64_t vocab_;
  std::mt19937_64 rng_;
  double agree_;
};

// Rows one slot will extend with, owning what the request points into.
struct Pending {
  int slot = 0;
  int64_t first_pos = 0;
  std::vector<tfe::bf16_bits> taps;
  std::vector<int32_t> tokens;
  tfe::ExtendRequest request() const { return {slot, first_pos, static_cast<int64_t>(tokens.size()), taps, tokens}; }
};

// A prompt of `len` rows, extended in pieces no longer than the ring.
void prefill(tfe::Runtime& rt, Target& target, int slot, int len) {
  const int64_t piece = rt.ring_rows();
  for (int64_t at = 0; at < len; at += piece) {
    const int64_t n = std::min<int64_t>(piece, len - at);
    Pending p{slot, at, target.taps(n), {}};
    for (int64_t i = 0; i < n; ++i) p.tokens.push_back(target.token());
    const tfe::ExtendRequest r = p.request();
    rt.extend({&r, 1});
  }
}

int run(const Options& o) {
  tfe::OpenOptions open;
  open.artifact_dir = o.artifact;
  if (o.artifact.empty()) {
    tfe::PlanOptions p;
    p.fp8 = tfe::fp8_mode_from_name(o.fp8);
    p.max_slots = std::max(o.slots, 16);
    open.plan = p;
  }
  const auto t_open = Clock::now();
  tfe::Runtime rt = tfe::Runtime::open(o.head, open);
  const double open_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_open).count();
  const tfe::PlanOptions& plan = rt.plan_options();
  const tfe::HeadHeader& header = rt.header();
  if (o.slots < 1 || o.slots > plan.buckets.back() || o.slots > plan.max_slots)
    refuse("--slots {} is outside 1..{} (the largest streams bucket and max_slots of the plan)", o.slots,
           std::min(plan.buckets.back(), plan.max_slots));
  if (o.steps < 1 || o.steps > plan.max_steps)
    refuse("--steps {} is outside 1..{} (the plan's max_steps)", o.steps, plan.max_steps);
  if (o.prompt < 1 || o.max_len <= o.prompt + o.steps + 1)
    refuse("--prompt {} / --max-len {}: need prompt >= 1 and max-len > prompt + steps + 1", o.prompt, o.max_len);

  Target target(header, o.seed, o.agree);
  std::vector<int> slots(static_cast<size_t>(o.slots));
  for (int s = 0; s < o.slots; ++s) {
    slots[static_cast<size_t>(s)] = s;
    prefill(rt, target, s, o.prompt + 3 * s);  // slots of different lengths
  }
  rt.synchronize();
  std::printf("%s\n", nlohmann::json{{"event", "open"},
                                     {"head", o.head},
                                     {"preset", header.name},
                                     {"fp8", rt.fp8_in_use()},
                                     {"graphs", rt.graphs_enabled()},
                                     {"slots", o.slots},
                                     {"steps", o.steps},
                                     {"open_ms", open_ms}}
                          .dump()
                          .c_str());

  const int64_t width = static_cast<int64_t>(header.taps.size()) * header.target_hidden;
  std::optional<DeviceRound> dev;
  if (o.device_rows) {
    dev.emplace(int64_t{o.slots} * (o.steps + 1), width, o.slots);
    check(cudaMemcpy(dev->ids, slots.data(), slots.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "copy ids");
  }
  // One round's draft: the blocking call, or the enqueued one with device ids and the tokens copied down.
  auto draft = [&] {
    if (!dev) return rt.draft(slots, o.steps);
    const tfe::DeviceDraftOutputs out =
        rt.draft_async(static_cast<const int32_t*>(dev->ids), o.slots, o.steps, {}, rt.stream());
    tfe::DraftResult d;
    d.streams = o.slots;
    d.steps = o.steps;
    d.tokens.resize(static_cast<size_t>(o.slots * o.steps));
    d.confidences.resize(d.tokens.size());
    check(cudaMemcpy2DAsync(d.tokens.data(), o.steps * 4, out.tokens, static_cast<size_t>(out.row_stride) * 4,
                            o.steps * 4, o.slots, cudaMemcpyDeviceToHost, rt.stream()),
          "copy tokens");
    check(cudaMemcpy2DAsync(d.confidences.data(), o.steps * 4, out.confidences, static_cast<size_t>(out.row_stride) * 4,
                            o.steps * 4, o.slots, cudaMemcpyDeviceToHost, rt.stream()),
          "copy confidences");
    rt.synchronize();
    return d;
  };
  // One round's extend: from the host, or from device memory the "target" wrote.
  auto extend = [&](const std::vector<Pending>& pending) {
    if (!dev) {
      std::vector<tfe::ExtendRequest> requests;
      for (const auto& p : pending) requests.push_back(p.request());
      rt.extend(requests);
      return;
    }
    std::vector<tfe::DeviceExtendRequest> requests;
    int64_t at = 0;
    for (const auto& p : pending) {
      const auto n = static_cast<int64_t>(p.tokens.size());
      auto* taps = static_cast<tfe::bf16_bits*>(dev->taps) + at * width;
      auto* tokens = static_cast<int32_t*>(dev->tokens) + at;
      check(cudaMemcpyAsync(taps, p.taps.data(), p.taps.size() * sizeof(tfe::bf16_bits), cudaMemcpyHostToDevice,
                            rt.stream()),
            "copy taps");
      check(cudaMemcpyAsync(tokens, p.tokens.data(), p.tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                            rt.stream()),
            "copy tokens");
      requests.push_back({p.slot, p.first_pos, n, taps, 0, tokens});
      at += n;
    }
    rt.extend(requests);
  };

  std::vector<uint64_t> asked(static_cast<size_t>(o.steps)), kept(asked.size());
  double draft_ms = 0, extend_ms = 0, round_ms = 0;
  uint64_t window_rounds = 0, tokens_out = 0, resets = 0;
  for (int round = 1; round <= o.rounds; ++round) {
    const auto t0 = Clock::now();
    const tfe::DraftResult d = draft();
    const auto t1 = Clock::now();
    std::vector<Pending> pending;
    std::vector<int> restart, accepted;  // accepted: drafts kept per verified slot, for the accept log
    for (int i = 0; i < o.slots; ++i) {
      const int slot = slots[static_cast<size_t>(i)];
      const int64_t last = rt.slots().last_pos(slot);
      if (last + o.steps + 1 >= o.max_len) {
        restart.push_back(slot);
        continue;
      }
      Pending p{slot, last + 1, {}, {}};
      for (int s = 1; s <= o.steps; ++s) {
        ++asked[static_cast<size_t>(s - 1)];
        const int32_t t = target.verify(d.token(i, s));
        p.tokens.push_back(t);
        if (t != d.token(i, s)) break;  // the target's own token ends the accepted run
        ++kept[static_cast<size_t>(s - 1)];
      }
      if (static_cast<int>(p.tokens.size()) == o.steps && p.tokens.back() == d.token(i, o.steps))
        p.tokens.push_back(target.token());  // every draft kept: the target adds the next token
      accepted.push_back(static_cast<int>(p.tokens.size()) - 1);
      p.taps = target.taps(static_cast<int64_t>(p.tokens.size()));
      tokens_out += p.tokens.size();
      pending.push_back(std::move(p));
    }
    if (!accepted.empty()) rt.record_accepted(accepted, o.steps);  // TFE_ACCEPT_LOG=N writes its lines
    extend(pending);
    for (int slot : restart) {
      rt.reset(slot);
      prefill(rt, target, slot, o.prompt);
      ++resets;
    }
    rt.synchronize();
    const auto t2 = Clock::now();
    draft_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    extend_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
    round_ms += std::chrono::duration<double, std::milli>(t2 - t0).count();
    ++window_rounds;
    if (round % o.report_every == 0 || round == o.rounds) {
      nlohmann::json pos = nlohmann::json::array();
      for (int s = 0; s < o.steps; ++s) {
        const auto a = asked[static_cast<size_t>(s)], k = kept[static_cast<size_t>(s)];
        pos.push_back({{"position", s + 1}, {"asked", a}, {"kept", k}, {"rate", a ? double(k) / double(a) : 0.0}});
      }
      const tfe::RuntimeStats st = rt.stats();
      std::printf("%s\n", nlohmann::json{{"round", round},
                                         {"window", pos},
                                         {"ms_per_round", round_ms / double(window_rounds)},
                                         {"draft_ms", draft_ms / double(window_rounds)},
                                         {"extend_ms", extend_ms / double(window_rounds)},
                                         {"tokens_per_round", double(tokens_out) / double(window_rounds) / o.slots},
                                         {"resets", resets},
                                         {"replays", st.replays},
                                         {"eager_passes", st.eager_passes},
                                         {"captures", st.captures}}
                              .dump()
                              .c_str());
      std::fflush(stdout);
      std::fill(asked.begin(), asked.end(), 0);
      std::fill(kept.begin(), kept.end(), 0);
      draft_ms = extend_ms = round_ms = 0;
      window_rounds = tokens_out = 0;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"draft_loop: an engine loop (extend, draft, greedy verify, extend) on a draft head"};
  app.add_option("--head", o.head, "head file (.tfe)");
  app.add_option("--artifact", o.artifact, "deploy artifact directory (tfe-plan compile); else compile now");
  app.add_option("--slots", o.slots, "sequences drafted together")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "draft steps per round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", o.rounds, "rounds to run")->check(CLI::PositiveNumber);
  app.add_option("--report-every", o.report_every, "rounds per JSON report line")->check(CLI::PositiveNumber);
  app.add_option("--prompt", o.prompt, "rows of each slot's first prompt")->check(CLI::PositiveNumber);
  app.add_option("--max-len", o.max_len, "a slot reaching this length is reset and prompted again");
  app.add_option("--agree", o.agree, "probability that the target keeps a drafted token")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "seed of the synthetic target");
  app.add_option("--fp8", o.fp8, "FP8 mode without an artifact: auto, off, require");
  app.add_flag("--probe", o.probe, "exit 0 when a CUDA device is present, 1 otherwise");
  app.add_flag("--device-rows", o.device_rows,
               "accepted rows and slot ids in device memory (extend's device form, draft_async)");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (o.probe) return devices > 0 ? 0 : 1;
  if (devices == 0) {
    std::fprintf(stderr,
                 "draft_loop: no CUDA device found; the engine loop needs a GPU (the CPU reference is "
                 "`tfe-plan reference`)\n");
    return 2;
  }
  if (o.head.empty()) {
    std::fprintf(stderr, "draft_loop: --head is required\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "draft_loop: %s\n", e.what());
    return 1;
  }
}
