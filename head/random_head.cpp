#include "head/random_head.h"

#include <cmath>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "core/limits.h"
#include "head/fp8.h"
#include "core/numeric.h"

namespace tfe {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer: a bijection on 64 bits with full avalanche.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Each tensor has its own stream, keyed by its name (not its position in the table), so that adding a
// tensor to the format (or FP8 forms) leaves every other tensor's values unchanged. Element i of a stream
// is splitmix64's output at counter i: any element can be drawn without drawing those before it.
struct Stream {
  uint64_t key;
  Stream(uint64_t seed, std::string_view tensor) : key(mix64(mix64(seed + kGolden) + fnv1a(tensor))) {}
  uint64_t bits(uint64_t i) const { return mix64(key + (i + 1) * kGolden); }
  // Uniform in [-1, 1): 24 random bits, exact in fp32.
  float symmetric(uint64_t i) const { return static_cast<float>(bits(i) >> 40) * 0x1p-23f - 1.0f; }
  // Mean 0, variance 1: the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled by sqrt(3).
  // Summed as integers: one conversion per value (an embedding table is half a billion of them).
  float normal(uint64_t i) const {
    const uint64_t b = bits(i);
    const uint32_t sum = static_cast<uint32_t>((b & 0xffff) + ((b >> 16) & 0xffff) + ((b >> 32) & 0xffff) + (b >> 48));
    // Each uniform is (x + 0.5) / 2^16, so the four sum to (sum + 2) / 2^16, with mean 2 and variance 1/3.
    return ((static_cast<float>(sum) + 2.0f) * 0x1p-16f - 2.0f) * 1.7320508f;
  }
  // Uniform in [0, 1) with 53 bits.
  double unit(uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1p-53; }
};

std::vector<std::byte> fill_bf16(const RandomTensor& t, const Stream& s, int threads) {
  int64_t n = 1;
  for (int64_t d : t.spec.shape) n *= d;
  std::vector<std::byte> bytes(static_cast<size_t>(n) * 2);
  auto* out = reinterpret_cast<bf16_bits*>(bytes.data());
  const float a = t.std * std::sqrt(3.0f);
  parallel_chunks(n, threads, [&](int64_t begin, int64_t end) {
    switch (t.init) {
      case RandomInit::uniform:
        for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(a * s.symmetric(i));
        break;
      case RandomInit::norm:
        for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(1.0f + a * s.symmetric(i));
        break;
      case RandomInit::normal:
        for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(t.std * s.normal(i));
        break;
      case RandomInit::d2t:
        fail("random head: `{}` is not a bf16 tensor", t.spec.name);
    }
  });
  return bytes;
}

// Selection sampling (Knuth, TAOCP 3.4.2, algorithm S): walks the target ids in order and keeps each with
// probability (still needed) / (still left), which yields exactly `draft_vocab` distinct ids, sorted.
std::vector<std::byte> fill_d2t(const HeadHeader& h, const Stream& s) {
  std::vector<int32_t> d2t;
  d2t.reserve(static_cast<size_t>(h.draft_vocab));
  for (int64_t t = 0; t < h.vocab && static_cast<int64_t>(d2t.size()) < h.draft_vocab; ++t) {
    const int64_t needed = h.draft_vocab - static_cast<int64_t>(d2t.size());
    if (s.unit(static_cast<uint64_t>(t)) * static_cast<double>(h.vocab - t) < static_cast<double>(needed))
      d2t.push_back(static_cast<int32_t>(t - static_cast<int64_t>(d2t.size())));
  }
  if (static_cast<int64_t>(d2t.size()) != h.draft_vocab)
    fail("random head: chose {} of draft_vocab = {} target ids", d2t.size(), h.draft_vocab);
  std::vector<std::byte> bytes(d2t.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), d2t.data(), bytes.size());
  return bytes;
}

}  // namespace

std::vector<RandomTensor> random_tensor_table(const HeadHeader& h) {
  std::vector<RandomTensor> table;
  for (const auto& spec : expected_tensors(h)) {
    if (is_fp8_form(spec)) continue;
    RandomTensor t{spec, RandomInit::uniform, 0.0f};
    if (spec.name == "d2t") {
      t.init = RandomInit::d2t;
    } else if (spec.name == "embed") {
      t.init = RandomInit::normal;
      t.std = 1.0f;
    } else if (is_linear(spec.name)) {
      const bool output_head = spec.name == "lm_head" || spec.name == "lr_b" || spec.name == "target_head";
      t.std = (output_head ? kRandomLogitStd : 1.0f) / std::sqrt(static_cast<float>(spec.shape[1]));
    } else {
      t.init = RandomInit::norm;
      t.std = kRandomNormStd;
    }
    table.push_back(std::move(t));
  }
  return table;
}

HeadWriter random_head(const HeadHeader& header, uint64_t seed, bool fp8, int threads) {
  check_threads(threads, "random head");
  HeadHeader h = header;
  if (fp8) mark_fp8_forms(h);
  validate(h);
  std::vector<HeadTensor> tensors;
  for (const auto& t : random_tensor_table(h)) {
    const Stream s(seed, t.spec.name);
    auto bytes = t.init == RandomInit::d2t ? fill_d2t(h, s) : fill_bf16(t, s, threads);
    tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, std::move(bytes)});
  }
  return assemble_head(h, std::move(tensors), threads);
}

}  // namespace tfe
