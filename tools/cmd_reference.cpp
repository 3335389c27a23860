// tfe-plan reference: test vectors from the CPU reference. Random taps and tokens for B slots of N real
// rows each (positions 0..N-1), one extend per slot (in chunks of at most R rows), one draft of S steps;
// inputs, outputs, ring contents and the step-1 intermediates go to one safetensors file that the GPU
// tests replay.
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <random>

#include <fmt/ranges.h>

#include "tools/commands.h"
#include "core/error.h"
#include "core/files.h"
#include <tfe/head_file.h>
#include "reference/ops.h"
#include <tfe/reference.h>

namespace tfe::cli {

namespace {

struct Args {
  std::string head;
  int streams = 1;
  int64_t rows = 16;
  int steps = 4;
  uint64_t seed = 0;
  std::string fp8 = "auto";
  int threads = 0;
  int cand_k = 0;
  std::string out;
};

// Normal draws from mt19937_64 by Box-Muller: the standard library's normal_distribution differs between
// implementations, and the vectors must be a function of the seed alone.
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  double uniform() { return static_cast<double>((rng_() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
  float next() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * uniform()));
  }
  uint64_t bits() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// Taps shaped like a target's residual stream: roughly Gaussian channels whose scale grows with depth
// (the final, pre-norm tap is the largest), plus a few "massive activation" channels per tap, ten times
// larger, at fixed places, as the residual streams of Llama-class models show.
std::vector<bf16_bits> random_taps(const HeadHeader& h, int64_t rows, Normal& rng) {
  const int64_t T = static_cast<int64_t>(h.taps.size()), Ht = h.target_hidden;
  std::vector<float> scale(static_cast<size_t>(T * Ht));
  for (int64_t t = 0; t < T; ++t) {
    const int layer = h.taps[static_cast<size_t>(t)].layer;
    const float sigma = layer < 0 ? 2.0f : 0.25f * std::sqrt(1.0f + static_cast<float>(layer));
    for (int64_t c = 0; c < Ht; ++c) scale[static_cast<size_t>(t * Ht + c)] = sigma;
    for (int64_t i = 0; i < 1 + Ht / 512; ++i)
      scale[static_cast<size_t>(t * Ht + static_cast<int64_t>(rng.bits() % static_cast<uint64_t>(Ht)))] *= 10.0f;
  }
  std::vector<bf16_bits> taps(static_cast<size_t>(rows * T * Ht));
  for (size_t i = 0; i < taps.size(); ++i) taps[i] = float_to_bf16(rng.next() * scale[i % scale.size()]);
  return taps;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

void run(const Args& a) {
  if (a.streams < 1) fail("--streams = {} must be >= 1", a.streams);
  if (a.rows < 1) fail("--rows = {} must be >= 1", a.rows);
  const HeadFile file = HeadFile::open(a.head);
  const HeadHeader& h = file.header();
  ReferenceOptions opt;
  opt.max_slots = a.streams;
  opt.max_steps = a.steps;
  opt.fp8 = fp8_mode_from_name(a.fp8);
  opt.threads = a.threads;
  opt.cand_k = a.cand_k;
  Reference ref(file, opt);
  if (a.rows > max_position(a.steps) + int64_t{1})
    fail("--rows = {} exceeds the largest position {} + 1", a.rows, max_position(a.steps));

  const int64_t B = a.streams, N = a.rows, S = a.steps,
                row_width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  Normal rng(a.seed);
  const auto taps = random_taps(h, B * N, rng);
  std::vector<int32_t> tokens(static_cast<size_t>(B * N)), positions(tokens.size()), slots(static_cast<size_t>(B));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.bits() % static_cast<uint64_t>(h.vocab));
  for (int64_t b = 0; b < B; ++b) {
    slots[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    for (int64_t i = 0; i < N; ++i) positions[static_cast<size_t>(b * N + i)] = static_cast<int32_t>(i);
  }

  // A span longer than the ring is refused by extend; the vectors take it in ring-sized chunks, all
  // slots side by side in each call.
  for (int64_t begin = 0; begin < N; begin += ref.ring_rows()) {
    const int64_t n = std::min<int64_t>(ref.ring_rows(), N - begin);
    std::vector<ExtendRequest> requests;
    for (int64_t b = 0; b < B; ++b) {
      const size_t at = static_cast<size_t>(b * N + begin);
      requests.push_back({static_cast<int>(b), begin, n,
                          std::span<const bf16_bits>(taps).subspan(at * row_width, static_cast<size_t>(n * row_width)),
                          std::span<const int32_t>(tokens).subspan(at, static_cast<size_t>(n))});
    }
    ref.extend(requests);
  }
  std::vector<int> slot_ids(slots.begin(), slots.end());
  DraftTrace trace;
  const DraftResult result = ref.draft(slot_ids, a.steps, &trace);

  std::vector<bf16_bits> ring_k, ring_v;
  for (int b = 0; b < B; ++b) {
    ring_k.insert(ring_k.end(), ref.ring_k(b).begin(), ref.ring_k(b).end());
    ring_v.insert(ring_v.end(), ref.ring_v(b).begin(), ref.ring_v(b).end());
  }

  // Step-1 intermediates, stacked over slots. Storage outlives the entries that point into it.
  std::vector<std::unique_ptr<std::vector<std::byte>>> storage;
  std::vector<SafetensorsEntry> entries = {
      {"taps", DType::BF16, {B, N, row_width}, bytes_of(taps)},
      {"tokens", DType::I32, {B, N}, bytes_of(tokens)},
      {"positions", DType::I32, {B, N}, bytes_of(positions)},
      {"slots", DType::I32, {B}, bytes_of(slots)},
      {"draft_tokens", DType::I32, {B, S}, bytes_of(result.tokens)},
      {"confidences", DType::F32, {B, S}, bytes_of(result.confidences)},
      {"hidden", DType::BF16, {B, S, h.hidden}, bytes_of(result.hidden)},
      {"ring_k", DType::BF16, {B, ref.ring_rows(), h.kv_heads, h.head_dim}, bytes_of(ring_k)},
      {"ring_v", DType::BF16, {B, ref.ring_rows(), h.kv_heads, h.head_dim}, bytes_of(ring_v)},
  };
  auto stack = [&]<typename T>(const std::string& name, DType dtype, std::vector<T> StepTrace::*field) {
    std::vector<T> all;
    for (int b = 0; b < B; ++b) {
      const auto& v = trace.at(b, 1).*field;
      all.insert(all.end(), v.begin(), v.end());
    }
    if (all.empty()) return;
    const int64_t width = static_cast<int64_t>(all.size()) / B;
    storage.push_back(std::make_unique<std::vector<std::byte>>(all.size() * sizeof(T)));
    std::memcpy(storage.back()->data(), all.data(), storage.back()->size());
    entries.push_back({"step1." + name, dtype, {B, width}, *storage.back()});
  };
  stack("g", DType::BF16, &StepTrace::g);
  stack("x", DType::BF16, &StepTrace::x);
  stack("q", DType::BF16, &StepTrace::q);
  stack("k", DType::BF16, &StepTrace::k);
  stack("v", DType::BF16, &StepTrace::v);
  stack("q_normed", DType::BF16, &StepTrace::q_normed);
  stack("k_normed", DType::BF16, &StepTrace::k_normed);
  stack("q_rot", DType::BF16, &StepTrace::q_rot);
  stack("k_rot", DType::BF16, &StepTrace::k_rot);
  stack("o", DType::BF16, &StepTrace::o);
  stack("h1", DType::BF16, &StepTrace::h1);
  stack("post", DType::BF16, &StepTrace::post);
  stack("gate", DType::BF16, &StepTrace::gate);
  stack("up", DType::BF16, &StepTrace::up);
  stack("m", DType::BF16, &StepTrace::m);
  stack("h2", DType::BF16, &StepTrace::h2);
  stack("n", DType::BF16, &StepTrace::n);
  stack("logits", DType::F32, &StepTrace::logits);
  stack("lowrank", DType::BF16, &StepTrace::lowrank);
  stack("scores", DType::F32, &StepTrace::scores);
  stack("candidates", DType::I32, &StepTrace::candidates);
  stack("exact", DType::F32, &StepTrace::exact);

  std::vector<std::string> fp8_in_use;
  for (const auto& l : linears_in_use(h))
    if (ref.uses_fp8(l)) fp8_in_use.push_back(l);
  // Positions 0 .. N + S - 2 were written (real rows, then draft rows); other ring rows hold zeros.
  const std::map<std::string, std::string> metadata = {
      {"tfe.head_sha256", file.header_sha256()},
      {"tfe.seed", std::to_string(a.seed)},
      {"tfe.streams", std::to_string(B)},
      {"tfe.rows", std::to_string(N)},
      {"tfe.steps", std::to_string(S)},
      {"tfe.fp8", std::string(fp8_mode_name(opt.fp8))},
      {"tfe.fp8_linears", fmt::format("{}", fmt::join(fp8_in_use, ","))},
      {"tfe.ring_rows", std::to_string(ref.ring_rows())},
      {"tfe.ring_written_positions", fmt::format("0..{}", N + S - 2)},
  };
  write_safetensors(a.out, metadata, entries);
  fmt::print("{}: {} slots x {} rows, {} steps; draft tokens of slot 0: {}\n", a.out, B, N, S,
             fmt::join(std::span<const int32_t>(result.tokens).first(static_cast<size_t>(S)), " "));
}

}  // namespace

void add_reference(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("reference", "Test vectors from the CPU reference: random taps, extend, draft");
  cmd->add_option("head", args->head, "head file (.tfe)")->required();
  cmd->add_option("--streams", args->streams, "slots, each with its own rows")->required()->check(CLI::Range(1, 1024));
  cmd->add_option("--rows", args->rows, "real rows per slot (positions 0..rows-1)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", args->steps, "draft steps")->required()->check(CLI::Range(1, 16));
  cmd->add_option("--seed", args->seed, "seed of the taps and tokens")->required()->check(seed_validator());
  cmd->add_option("--fp8", args->fp8, "FP8 forms: auto, off, require")
      ->check(CLI::IsMember({"auto", "off", "require"}));
  cmd->add_option("--threads", args->threads, "threads for the linears (0: all); results do not depend on it")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--cand-k", args->cand_k,
                  "two_stage: candidates rescored per row, as the plan option (0: the header's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-o,--output", args->out, "output .safetensors")->required();
  cmd->callback([args] {
    files::check_output(args->out, "reference: -o", std::vector<std::filesystem::path>{args->head});
    run(*args);
  });
}

}  // namespace tfe::cli
