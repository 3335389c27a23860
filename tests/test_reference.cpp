// The CPU reference: each op against float64 arithmetic on fresh random data, a micro head whose every
// value is worked out by hand below, and the properties of extend and draft (determinism, the window,
// ring overwrites, refusals, FP8 modes) on random tiny heads.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <random>
#include <set>

#include "core/error.h"
#include <tfe/head_file.h>
#include "head/presets.h"
#include "reference/ops.h"
#include <tfe/reference.h>
#include "test_util.h"

using namespace tfe;

namespace {

uint64_t fresh_seed() { return (uint64_t{std::random_device{}()} << 32) | std::random_device{}(); }

std::vector<bf16_bits> random_bf16(size_t n, std::mt19937_64& rng, float std = 1.0f) {
  std::normal_distribution<float> d(0.0f, std);
  std::vector<bf16_bits> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

// bf16 values apart, counted along the number line (sign-magnitude bits made monotonic).
int64_t ulp_distance(bf16_bits a, bf16_bits b) {
  auto key = [](bf16_bits x) { return (x & 0x8000) ? -int64_t{x & 0x7fff} : int64_t{x}; };
  return std::llabs(key(a) - key(b));
}

// The float64 result rounded to bf16; the reference (fp32) may land one bf16 step away when the exact
// value sits near a rounding boundary, never further. Where `fp32_error` is given, element i's fp32
// arithmetic may also be off by up to fp32_error[i] (a long sum that cancels to near zero: its fp32
// rounding is relative to the terms, not to the sum, and may be many bf16 steps of a tiny result).
void check_near_bf16(std::span<const bf16_bits> got, const std::vector<double>& want,
                     const std::vector<double>& fp32_error = {}) {
  REQUIRE(got.size() == want.size());
  REQUIRE((fp32_error.empty() || fp32_error.size() == want.size()));
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto w = float_to_bf16(static_cast<float>(want[i]));
    CAPTURE(i);
    CAPTURE(want[i]);
    const double err = std::abs(static_cast<double>(bf16_to_float(got[i])) - want[i]);
    // One bf16 step at |want| is at most 2^-7 |want|; the fp32 bound comes on top of it.
    const bool within_fp32 = !fp32_error.empty() && err <= fp32_error[i] + std::ldexp(std::abs(want[i]), -7);
    CHECK((ulp_distance(got[i], w) <= 1 || within_fp32));
    off += got[i] != w;
  }
  CHECK(off * 20 <= static_cast<int64_t>(got.size()));  // at most 5% one step off
}

// gamma_n = n u / (1 - n u), u = 2^-24: an fp32 sum of n products in any order is off by at most
// gamma_n * sum |products| (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
double fp32_gamma(int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -24);
  return nu / (1.0 - nu);
}

HeadFile open_bytes(const std::vector<std::byte>& bytes) { return HeadFile::from_bytes(bytes); }

// n logits ~ N(0, 3^2).
std::vector<float> normal_logits(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(n);
  for (auto& v : l) v = d(rng);
  return l;
}

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Rows of random taps and tokens for one slot.
struct Rows {
  std::vector<bf16_bits> taps;
  std::vector<int32_t> tokens;
};
Rows random_rows(const HeadHeader& h, int64_t n, std::mt19937_64& rng) {
  const size_t width = h.taps.size() * static_cast<size_t>(h.target_hidden);
  return {random_bf16(static_cast<size_t>(n) * width, rng), random_tokens(static_cast<size_t>(n), h.vocab, rng)};
}

ExtendRequest request(int slot, int64_t first, const Rows& r, int64_t begin, int64_t n, const HeadHeader& h) {
  const size_t width = h.taps.size() * static_cast<size_t>(h.target_hidden);
  return {
      slot, first, n,
      std::span<const bf16_bits>(r.taps).subspan(static_cast<size_t>(begin) * width, static_cast<size_t>(n) * width),
      std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(begin), static_cast<size_t>(n))};
}

bool same(const DraftResult& a, const DraftResult& b) {
  return a.tokens == b.tokens && a.hidden == b.hidden &&
         std::memcmp(a.confidences.data(), b.confidences.data(), a.confidences.size() * sizeof(float)) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Ops against float64

TEST_CASE("reference ops: rmsnorm matches float64") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int64_t n = 96, rows = 5;
  const float eps = 1e-5f;
  const auto x = random_bf16(static_cast<size_t>(n * rows), rng, 3.0f);
  auto w = random_bf16(static_cast<size_t>(n), rng, 0.1f);
  for (auto& v : w) v = float_to_bf16(1.0f + bf16_to_float(v));
  std::vector<bf16_bits> y(x.size());
  ref::rmsnorm(x, w, eps, y);
  std::vector<double> want;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += std::pow(bf16_to_float(x[static_cast<size_t>(r * n + i)]), 2);
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) {
      // Two roundings, as the spec states: bf16(x * r), then bf16(w * that).
      const double normed = round_bf16(static_cast<float>(bf16_to_float(x[static_cast<size_t>(r * n + i)]) * inv));
      want.push_back(bf16_to_float(w[static_cast<size_t>(i)]) * normed);
    }
  }
  check_near_bf16(y, want);
  CHECK_THROWS_WITH_AS(ref::rmsnorm(std::span(x).first(95), w, eps, std::span(y).first(95)),
                       doctest::Contains("not whole rows of 96"), Error);
}

TEST_CASE("reference ops: linear, residual and logits forms match float64, and FP8 applies the row scale") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int64_t out = 37, in = 203, rows = 3;  // odd sizes: the lane sum's tail is exercised
  const auto w = random_bf16(static_cast<size_t>(out * in), rng, 0.07f);
  const auto x = random_bf16(static_cast<size_t>(rows * in), rng);
  const auto res = random_bf16(static_cast<size_t>(rows * out), rng);
  std::vector<uint8_t> q(static_cast<size_t>(out * in));
  std::uniform_int_distribution<int> code(0, 0x7e);
  for (auto& c : q) c = static_cast<uint8_t>(code(rng) | (rng() & 1 ? 0x80 : 0));
  std::vector<float> scale(static_cast<size_t>(out));
  std::uniform_real_distribution<float> sd(1e-4f, 1e-2f);
  for (auto& s : scale) s = sd(rng);

  const auto lin = ref::Linear::bf16("w", w, out, in);
  const auto lin8 = ref::Linear::fp8("w", q, scale, out, in);
  std::vector<bf16_bits> y(static_cast<size_t>(rows * out)), yr(y.size()), y8(y.size());
  std::vector<float> yf(y.size());
  ref::linear(lin, x, y);
  ref::linear_residual(lin, x, res, yr);
  ref::linear_f32(lin, x, yf);
  ref::linear(lin8, x, y8);
  std::vector<double> want, want_res, want8, error, error8;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double acc = 0, acc8 = 0, abs_sum = 0, abs_sum8 = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double xv = bf16_to_float(x[static_cast<size_t>(r * in + k)]);
        const double p = bf16_to_float(w[static_cast<size_t>(j * in + k)]) * xv;
        const double p8 = fp8_e4m3_to_float(q[static_cast<size_t>(j * in + k)]) * xv;
        acc += p;
        acc8 += p8;
        abs_sum += std::abs(p);
        abs_sum8 += std::abs(p8);
      }
      const double s = scale[static_cast<size_t>(j)];
      want.push_back(acc);
      want_res.push_back(bf16_to_float(res[static_cast<size_t>(r * out + j)]) + acc);
      want8.push_back(s * acc8);
      error.push_back(fp32_gamma(in) * abs_sum);
      error8.push_back(s * fp32_gamma(in) * abs_sum8);
      CHECK(yf[static_cast<size_t>(r * out + j)] == doctest::Approx(acc).epsilon(1e-4));
    }
  check_near_bf16(y, want, error);
  check_near_bf16(yr, want_res, error);
  check_near_bf16(y8, want8, error8);
  CHECK_THROWS_WITH_AS(ref::Linear::fp8("wq", q, std::span(scale).first(3), out, in),
                       doctest::Contains("linear wq (FP8 scale): 3 elements where 37 are needed"), Error);
}

TEST_CASE("reference ops: results do not depend on the thread count") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  // Large enough that the row loop is split (kMinWorkPerThread multiply-adds per thread).
  const int64_t out = 1000, in = 1500, rows = 3;
  const auto w = random_bf16(static_cast<size_t>(out * in), rng, 0.03f);
  const auto x = random_bf16(static_cast<size_t>(rows * in), rng);
  const auto lin = ref::Linear::bf16("w", w, out, in);
  std::vector<float> one(static_cast<size_t>(rows * out)), three(one.size()), seven(one.size());
  ref::linear_f32(lin, x, one, 1);
  ref::linear_f32(lin, x, three, 3);
  ref::linear_f32(lin, x, seven, 7);
  CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(one.data(), seven.data(), one.size() * sizeof(float)) == 0);
}

TEST_CASE("reference ops: SwiGLU rounds SiLU to bf16 before the multiply") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const auto gate = random_bf16(300, rng, 2.0f), up = random_bf16(300, rng);
  std::vector<bf16_bits> m(300);
  ref::swiglu(gate, up, m);
  std::vector<double> want;
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = bf16_to_float(gate[i]);
    const double a = round_bf16(static_cast<float>(g / (1 + std::exp(-g))));
    want.push_back(a * bf16_to_float(up[i]));
  }
  check_near_bf16(m, want);
}

TEST_CASE("reference ops: RoPE frequencies and angles") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  auto h = preset_header("tiny");
  const auto inv = rope_inv_freq(h);
  REQUIRE(inv.size() == 8);
  for (size_t i = 0; i < inv.size(); ++i)
    CHECK(inv[i] == doctest::Approx(std::pow(10000.0, -2.0 * i / 16.0)).epsilon(1e-6));

  // llama3 scaling (HF `_compute_llama3_parameters`) in float64, on the Llama-3.1 parameters.
  h = preset_header("llama3-8b-eagle3");
  const auto scaled = rope_inv_freq(h);
  REQUIRE(scaled.size() == 64);
  int low = 0, mid = 0, high = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128.0), wavelen = 2 * std::numbers::pi / f;
    double want = f;
    if (wavelen > 8192.0 / 1.0) {
      want = f / 8.0, ++low;
    } else if (wavelen >= 8192.0 / 4.0) {
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 8.0 + s * f, ++mid;
    } else {
      ++high;
    }
    CAPTURE(i);
    CHECK(scaled[i] == doctest::Approx(want).epsilon(1e-5));
  }
  CHECK(low > 0);  // each regime of the rule is exercised
  CHECK(mid > 0);
  CHECK(high > 0);

  // Rotation: angle = float(p) * inv_freq_i in fp32, pairs (i, i + hd/2), one rounding.
  h = preset_header("tiny");
  const int64_t hd = 16, heads = 3;
  const int32_t pos = std::uniform_int_distribution<int32_t>(1, 100000)(rng);
  const auto x = random_bf16(static_cast<size_t>(heads * hd), rng);
  std::vector<bf16_bits> y(x.size());
  ref::rope(x, hd, pos, inv, y);
  std::vector<double> want(x.size());
  for (int64_t hh = 0; hh < heads; ++hh)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<float>(pos) * inv[static_cast<size_t>(i)];
      const double a = bf16_to_float(x[static_cast<size_t>(hh * hd + i)]),
                   b = bf16_to_float(x[static_cast<size_t>(hh * hd + i + hd / 2)]);
      want[static_cast<size_t>(hh * hd + i)] = a * std::cos(angle) - b * std::sin(angle);
      want[static_cast<size_t>(hh * hd + i + hd / 2)] = b * std::cos(angle) + a * std::sin(angle);
    }
  check_near_bf16(y, want);
  // Position 0 is the identity.
  ref::rope(x, hd, 0, inv, y);
  CHECK(y == x);
}

TEST_CASE("reference ops: grouped-query attention matches float64") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const int64_t nh = 4, nkv = 2, hd = 8, keys = 7;
  const auto q = random_bf16(static_cast<size_t>(nh * hd), rng, 2.0f);
  const auto k = random_bf16(static_cast<size_t>(keys * nkv * hd), rng);
  const auto v = random_bf16(static_cast<size_t>(keys * nkv * hd), rng);
  std::vector<bf16_bits> o(q.size());
  ref::attention(q, k, v, nh, nkv, hd, o);
  CHECK(attention_scale(128) == 1.0f / std::sqrt(128.0f));
  // fp32's error in o: the scores' (each a sum of hd products) moves each softmax weight by up to twice
  // the largest score error, relative; the weighted sum of V adds its own; exp, the divide and the
  // roundings a few u more. All relative to sum_t p_t |v_t|.
  std::vector<double> want, error;
  for (int64_t j = 0; j < nh; ++j) {
    const int64_t kvh = j / (nh / nkv);
    std::vector<double> s(static_cast<size_t>(keys));
    double score_error = 0;
    for (int64_t t = 0; t < keys; ++t) {
      double d = 0, abs_sum = 0;
      for (int64_t i = 0; i < hd; ++i) {
        const double p = double(bf16_to_float(q[static_cast<size_t>(j * hd + i)])) *
                         bf16_to_float(k[static_cast<size_t>((t * nkv + kvh) * hd + i)]);
        d += p;
        abs_sum += std::abs(p);
      }
      s[static_cast<size_t>(t)] = d / std::sqrt(double(hd));
      score_error = std::max(score_error, fp32_gamma(hd) * abs_sum / std::sqrt(double(hd)));
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (auto& e : s) sum += (e = std::exp(e - mx));
    const double relative = 2 * score_error + fp32_gamma(keys) + 8 * std::ldexp(1.0, -24);
    for (int64_t i = 0; i < hd; ++i) {
      double acc = 0, abs_acc = 0;
      for (int64_t t = 0; t < keys; ++t) {
        const double pv =
            s[static_cast<size_t>(t)] / sum * bf16_to_float(v[static_cast<size_t>((t * nkv + kvh) * hd + i)]);
        acc += pv;
        abs_acc += std::abs(pv);
      }
      want.push_back(acc);
      error.push_back(relative * abs_acc);
    }
  }
  check_near_bf16(o, want, error);
}

TEST_CASE("reference ops: top-1 confidence is the softmax at the argmax, and ties go to the lower id") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::vector<float> l = normal_logits(500, rng);
  const size_t a = 100 + rng() % 100, b = a + 1 + rng() % 200;  // a < b
  l[a] = l[b] = *std::max_element(l.begin(), l.end()) + 0.5f;
  const auto top = ref::top1(l);
  CHECK(top.id == static_cast<int64_t>(a));
  double sum = 0;
  for (float v : l) sum += std::exp(double(v) - l[a]);
  CHECK(top.confidence == doctest::Approx(1.0 / sum).epsilon(1e-5));
}

TEST_CASE("reference ops: top-k is best first with ties in ascending id") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::vector<float> s(200);
  // Few distinct values: many ties.
  for (auto& v : s) v = static_cast<float>(rng() % 13) * 0.25f;
  const auto top = ref::topk(s, 40);
  std::vector<int32_t> want(s.size());
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t x, int32_t y) { return s[size_t(x)] > s[size_t(y)]; });
  want.resize(40);
  CHECK(top == want);
  CHECK_THROWS_WITH_AS(ref::topk(s, 201), doctest::Contains("k = 201 is outside 1..200"), Error);
}

TEST_CASE("reference ops: ranked is top1 at rank 0 and the rank-th by (logit, lower id) after, with softmax there") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::vector<float> l = normal_logits(300, rng);
  const auto order = [&] {  // ids by logit, equal logits by the lower id: independent of ranked and topk
    std::vector<int32_t> ids(l.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) { return l[size_t(x)] > l[size_t(y)]; });
    return ids;
  };
  // Ranks 2 and 3 tie: the lower id goes first.
  auto ids = order();
  l[size_t(std::max(ids[2], ids[3]))] = l[size_t(std::min(ids[2], ids[3]))];
  ids = order();
  CHECK(ids[2] < ids[3]);
  const auto top = ref::top1(l), zero = ref::ranked(l, 0);
  CHECK(top.id == ids[0]);
  CHECK(zero.id == top.id);
  CHECK(std::memcmp(&zero.confidence, &top.confidence, sizeof(float)) == 0);
  double sum = 0;
  for (float v : l) sum += std::exp(double(v) - l[size_t(ids[0])]);
  for (int r = 1; r < 8; ++r) {
    CAPTURE(r);
    const auto got = ref::ranked(l, r);
    CHECK(got.id == ids[size_t(r)]);
    CHECK(got.confidence < top.confidence);
    CHECK(got.confidence ==
          doctest::Approx(std::exp(double(l[size_t(got.id)]) - l[size_t(ids[0])]) / sum).epsilon(1e-5));
  }
  CHECK_THROWS_WITH_AS(ref::ranked(l, 300), doctest::Contains("rank = 300 is outside 0..299"), Error);
}

TEST_CASE("reference ops: rescore picks the largest exact logit, ties to the lower target id") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> exact(16);
  for (auto& v : exact) v = d(rng);
  std::vector<int32_t> target(16);
  for (size_t i = 0; i < target.size(); ++i) target[i] = static_cast<int32_t>(1000 - 7 * i);  // descending ids
  const float best = *std::max_element(exact.begin(), exact.end()) + 1.0f;
  exact[3] = exact[11] = best;  // candidate 11 has the lower target id
  const auto r = ref::rescore(exact, target);
  CHECK(r.index == 11);
  CHECK(r.target_id == 1000 - 77);
  double sum = 0;
  for (float v : exact) sum += std::exp(double(v) - best);
  CHECK(r.confidence == doctest::Approx(1.0 / sum).epsilon(1e-5));
}

// ---------------------------------------------------------------------------------------------------------
// A micro head computed by hand.
//
// H = Ht = 8, heads 2, kv_heads 1, hd 4, F 8, V 16, Vd 8, window 2, one tap (no tap norm), rms_eps 1e-6,
// every norm weight 1. Vectors of +-1 have mean(x^2) = 1, so rms(x) = bf16(x / sqrtf(1 + 1e-6)) = x: the
// norms pass them through unchanged, and rms(2x) = x too (2 * 0.49999994 rounds to 1 in bf16).
//   fc = I                     g = tap
//   wq = 0                     every score is 0: attention weighs its keys equally
//   wk = [I4 0]  (embed half)  k = embed[tok][0:4]
//   wv = [0 I4 0] (g half)     v = g[0:4]
//   wo = I, w_gate = w_up = w_down = I, lm_head = I, d2t[i] = i + 1 (target id = 2i + 1)
// The real row: tap g = (1,1,-1,-1, 1,1,-1,-1) at position 0.
// Step 1 (position 0, one key): o = [v, v] = g; h1 = bf16(g + o) = 2g; post = rms(2g) = g;
//   gate = up = g; a = bf16(silu(+-1)) = 0.73046875 / -0.26953125; m = a * up = 0.73046875 / 0.26953125;
//   h2 = bf16(h1 + m): 2 + 0.73046875 = 2.73046875 -> 2.734375; -2 + 0.26953125 = -1.73046875 (a tie in
//   bf16, to even) -> -1.734375.
//   n = rms(h2): mean(h2^2) = (2.734375^2 + 1.734375^2) / 2 = 5.2424316, r = 0.43675065;
//   n = bf16(2.734375 r) = 1.1953125 at +, bf16(-1.734375 r) = -0.7578125 at -.
//   logits = n: the maximum 1.1953125 at ids 0, 1, 4, 5 -> draft id 0 (lowest), target id 1;
//   confidence = 1 / (4 + 4 exp(-0.7578125 - 1.1953125)) = 0.21894675.
// Step 2 (position 1, keys 0 and 1): x's g half = rms(h2) = n; v1 = n[0:4] = (1.1953125, 1.1953125,
//   -0.7578125, -0.7578125); weights 1/2 each: o = bf16(0.5 * 1 + 0.5 * 1.1953125) = bf16(1.09765625)
//   = 1.09375 (a tie, to even), and bf16(-0.5 - 0.37890625) = -0.87890625 (exact).
//   The sign pattern survives the layer (m > 0 everywhere, smaller than |h1|), so the draft is again id 0.
// ---------------------------------------------------------------------------------------------------------

namespace {

HeadHeader micro_header() {
  HeadHeader h;
  h.name = "micro";
  h.taps = {{-1, false}};
  h.target_hidden = 8;
  h.hidden = 8;
  h.heads = 2;
  h.kv_heads = 1;
  h.head_dim = 4;
  h.ffn = 8;
  h.vocab = 16;
  h.draft_vocab = 8;
  h.window = 2;
  h.rope = Rope{10000.0f, false, 8.0f, 1.0f, 4.0f, 8192};
  h.rms_eps = 1e-6f;
  return h;
}

std::vector<std::byte> micro_head() {
  const HeadHeader h = micro_header();
  HeadWriter w(h);
  auto matrix = [](int64_t rows, int64_t cols, auto value) {
    std::vector<bf16_bits> m(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) m[static_cast<size_t>(r * cols + c)] = float_to_bf16(value(r, c));
    return test::to_bytes(m);
  };
  auto eye = [](int64_t r, int64_t c) { return r == c ? 1.0f : 0.0f; };
  auto ones = [](int64_t, int64_t) { return 1.0f; };
  w.add("fc", DType::BF16, {8, 8}, matrix(8, 8, eye));
  // embed[t] = +-1 by the bits of t (bit i % 4 set -> -1).
  w.add("embed", DType::BF16, {16, 8},
        matrix(16, 8, [](int64_t t, int64_t i) { return (t >> (i % 4)) & 1 ? -1.0f : 1.0f; }));
  w.add("input_norm", DType::BF16, {8}, matrix(1, 8, ones));
  w.add("hidden_norm", DType::BF16, {8}, matrix(1, 8, ones));
  w.add("wq", DType::BF16, {8, 16}, matrix(8, 16, [](int64_t, int64_t) { return 0.0f; }));
  w.add("wk", DType::BF16, {4, 16}, matrix(4, 16, eye));
  w.add("wv", DType::BF16, {4, 16}, matrix(4, 16, [](int64_t r, int64_t c) { return c == 8 + r ? 1.0f : 0.0f; }));
  w.add("wo", DType::BF16, {8, 8}, matrix(8, 8, eye));
  w.add("post_norm", DType::BF16, {8}, matrix(1, 8, ones));
  w.add("w_gate", DType::BF16, {8, 8}, matrix(8, 8, eye));
  w.add("w_up", DType::BF16, {8, 8}, matrix(8, 8, eye));
  w.add("w_down", DType::BF16, {8, 8}, matrix(8, 8, eye));
  w.add("final_norm", DType::BF16, {8}, matrix(1, 8, ones));
  std::vector<int32_t> d2t(8);
  for (int i = 0; i < 8; ++i) d2t[static_cast<size_t>(i)] = i + 1;
  w.add("d2t", DType::I32, {8}, test::to_bytes(d2t));
  w.add("lm_head", DType::BF16, {8, 8}, matrix(8, 8, eye));
  return w.serialize();
}

std::vector<float> floats(std::span<const bf16_bits> v) {
  std::vector<float> f;
  for (auto x : v) f.push_back(bf16_to_float(x));
  return f;
}

}  // namespace

TEST_CASE("reference: a micro head drafts what the hand computation says") {
  const auto bytes = micro_head();
  const HeadFile file = open_bytes(bytes);
  Reference ref(file, {.max_slots = 2, .max_steps = 2, .fp8 = Fp8Mode::automatic, .threads = 1});
  CHECK(ref.ring_rows() == 5);  // window 2 + 1 + 2 steps
  std::vector<bf16_bits> tap;
  for (float v : {1, 1, -1, -1, 1, 1, -1, -1}) tap.push_back(float_to_bf16(v));
  const std::vector<int32_t> token = {6};  // embed[6] = (1,-1,-1,1, 1,-1,-1,1)
  const std::vector<ExtendRequest> req = {{1, 0, 1, tap, token}};
  ref.extend(req);
  CHECK(floats(ref.ring_k(1).first(4)) == std::vector<float>{1, -1, -1, 1});  // embed[6][0:4], RoPE(0) = I
  CHECK(floats(ref.ring_v(1).first(4)) == std::vector<float>{1, 1, -1, -1});  // g[0:4]

  DraftTrace trace;
  const std::vector<int> slots = {1};
  const auto out = ref.draft(slots, 2, &trace);
  const StepTrace& s1 = trace.at(0, 1);
  CHECK(floats(s1.o) == floats(tap));
  CHECK(floats(s1.h1) == std::vector<float>{2, 2, -2, -2, 2, 2, -2, -2});
  CHECK(floats(s1.post) == floats(tap));
  CHECK(floats(s1.m)[0] == 0.73046875f);
  CHECK(floats(s1.m)[2] == 0.26953125f);
  CHECK(floats(out.h2(0, 1)) ==
        std::vector<float>{2.734375f, 2.734375f, -1.734375f, -1.734375f, 2.734375f, 2.734375f, -1.734375f, -1.734375f});
  CHECK(floats(s1.n)[0] == 1.1953125f);
  CHECK(floats(s1.n)[3] == -0.7578125f);
  CHECK(s1.draft_id == 0);
  CHECK(out.token(0, 1) == 1);
  CHECK(out.confidence(0, 1) == doctest::Approx(0.21894675).epsilon(1e-6));

  const StepTrace& s2 = trace.at(0, 2);
  CHECK(s2.position == 1);
  CHECK(s2.key_begin == 0);
  CHECK(floats(std::span(s2.x).last(8)) == floats(s1.n));                                   // rms_hidden(h2 of step 1)
  CHECK(floats(std::span(s2.x).first(8)) == std::vector<float>{-1, 1, 1, 1, -1, 1, 1, 1});  // embed[target 1]
  CHECK(floats(s2.o) == std::vector<float>{1.09375f, 1.09375f, -0.87890625f, -0.87890625f, 1.09375f, 1.09375f,
                                           -0.87890625f, -0.87890625f});
  CHECK(out.token(0, 2) == 1);
  CHECK(floats(ref.ring_v(1).subspan(4, 4)) == floats(std::span(s1.n).first(4)));  // step 2's V at position 1
}

// ---------------------------------------------------------------------------------------------------------
// Random tiny heads

TEST_CASE("reference: same inputs give identical bits, for any thread count") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const std::string preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const HeadHeader h = preset_header(preset);
    const auto bytes = test::random_head_bytes(h, rng());
    const HeadFile file = open_bytes(bytes);
    const Rows a = random_rows(h, 20, rng), b = random_rows(h, 9, rng);
    auto run = [&](int threads) {
      Reference ref(file, {.max_slots = 3, .max_steps = 5, .fp8 = Fp8Mode::automatic, .threads = threads});
      const std::vector<ExtendRequest> req = {request(0, 0, a, 0, 20, h), request(2, 0, b, 0, 9, h)};
      ref.extend(req);
      const std::vector<int> slots = {2, 0};
      auto out = ref.draft(slots, 5);
      std::vector<bf16_bits> rings(ref.ring_k(0).begin(), ref.ring_k(0).end());
      rings.insert(rings.end(), ref.ring_v(2).begin(), ref.ring_v(2).end());
      return std::pair(out, rings);
    };
    const auto first = run(1), second = run(1), threaded = run(4);
    CHECK(same(first.first, second.first));
    CHECK(same(first.first, threaded.first));
    CHECK(first.second == second.second);
    CHECK(first.second == threaded.second);
    // Drafts depend on the input: a random head does not answer one token everywhere.
    std::set<int32_t> distinct(first.first.tokens.begin(), first.first.tokens.end());
    CHECK(distinct.size() > 1);
    for (float c : first.first.confidences) {
      CHECK(c > 0.0f);
      CHECK(c <= 1.0f);
    }
  }
}

TEST_CASE("reference: the trace ties each step to the one before and to the ring") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const std::string preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const HeadHeader h = preset_header(preset);
    const int64_t H = h.hidden, kvw = h.kv_heads * h.head_dim;
    const auto bytes = test::random_head_bytes(h, rng());
    const HeadFile file = open_bytes(bytes);
    Reference ref(file, {.max_slots = 1, .max_steps = 3, .fp8 = Fp8Mode::automatic, .threads = 1});
    const Rows r = random_rows(h, 6, rng);
    ExtendTrace et;
    const std::vector<ExtendRequest> req = {request(0, 0, r, 0, 6, h)};
    ref.extend(req, &et);
    CHECK(et.rows == 6);
    // The ring holds each row's K at its position.
    for (int64_t p = 0; p < 6; ++p)
      CHECK(std::equal(et.k.begin() + p * kvw, et.k.begin() + (p + 1) * kvw, ref.ring_k(0).begin() + p * kvw));
    CHECK(std::equal(ref.last_g(0).begin(), ref.last_g(0).end(), et.g.end() - H));
    const std::vector<bf16_bits> ring_after_extend(ref.ring_k(0).begin(), ref.ring_k(0).end());

    DraftTrace tr;
    const std::vector<int> slots = {0};
    const auto out = ref.draft(slots, 3, &tr);
    const auto embed = file.tensor("embed").as<bf16_bits>();
    const auto d2t = file.tensor("d2t").as<int32_t>();
    // Step 1 reruns the last real row: same x, and its K rewritten with the same bits.
    CHECK(std::equal(tr.at(0, 1).x.begin(), tr.at(0, 1).x.end(), et.x.end() - 2 * H));
    CHECK(std::equal(ring_after_extend.begin(), ring_after_extend.begin() + 6 * kvw, ref.ring_k(0).begin()));
    for (int step = 2; step <= 3; ++step) {
      CAPTURE(step);
      const auto& prev = tr.at(0, step - 1);
      const auto& cur = tr.at(0, step);
      CHECK(cur.position == 5 + step - 1);
      CHECK(cur.g == prev.h2);
      std::vector<bf16_bits> e(static_cast<size_t>(H));
      ref::rmsnorm(embed.subspan(static_cast<size_t>(prev.token * H), static_cast<size_t>(H)),
                   file.tensor("input_norm").as<bf16_bits>(), h.rms_eps, e);
      CHECK(std::equal(e.begin(), e.end(), cur.x.begin()));  // embed[target id of the step before]
      CHECK(std::equal(cur.k_rot.begin(), cur.k_rot.end(), ref.ring_k(0).begin() + cur.position * kvw));
    }
    for (int step = 1; step <= 3; ++step) {
      const auto& t = tr.at(0, step);
      CHECK(t.token == t.draft_id + d2t[static_cast<size_t>(t.draft_id)]);
      CHECK(out.token(0, step) == t.token);
      if (h.head_type == HeadType::two_stage) {
        REQUIRE(t.candidates.size() == static_cast<size_t>(h.cand_k));
        CHECK(t.candidates == ref::topk(t.scores, h.cand_k));
        CHECK(std::find(t.candidates.begin(), t.candidates.end(), t.draft_id) != t.candidates.end());
        CHECK(t.confidence == ref::rescore(t.exact,
                                           [&] {
                                             std::vector<int32_t> ids;
                                             for (int32_t c : t.candidates)
                                               ids.push_back(c + d2t[static_cast<size_t>(c)]);
                                             return ids;
                                           }())
                                  .confidence);
      } else {
        CHECK(t.logits.size() == static_cast<size_t>(h.draft_vocab));
        CHECK(t.draft_id == ref::top1(t.logits).id);
      }
    }
  }
}

TEST_CASE("reference: a key older than the window changes nothing, and one inside it does") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const HeadHeader h = preset_header("tiny");  // window 15
  const auto bytes = test::random_head_bytes(h, rng());
  const HeadFile file = open_bytes(bytes);
  Reference ref(file, {.max_slots = 3, .max_steps = 4, .fp8 = Fp8Mode::automatic, .threads = 1});
  const int64_t n = 18, last = n - 1,  // n <= ring rows (20)
      width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  const Rows base = random_rows(h, n, rng);
  Rows outside = base, inside = base;
  // Row last - W - 1 lies outside every step's window; row last - W is step 1's oldest key.
  for (int64_t i = 0; i < width; ++i) {
    outside.taps[static_cast<size_t>((last - h.window - 1) * width + i)] ^= 0x0040;
    inside.taps[static_cast<size_t>((last - h.window) * width + i)] ^= 0x0040;
  }
  outside.tokens[static_cast<size_t>(last - h.window - 1)] =
      (outside.tokens[static_cast<size_t>(last - h.window - 1)] + 1) % 1000;
  inside.tokens[static_cast<size_t>(last - h.window)] =
      (inside.tokens[static_cast<size_t>(last - h.window)] + 1) % 1000;
  const std::vector<ExtendRequest> req = {request(0, 0, base, 0, n, h), request(1, 0, outside, 0, n, h),
                                          request(2, 0, inside, 0, n, h)};
  ref.extend(req);
  DraftTrace tr;
  const std::vector<int> slots = {0, 1, 2};
  const auto out = ref.draft(slots, 4, &tr);
  CHECK(tr.at(0, 1).key_begin == last - h.window);
  for (int step = 1; step <= 4; ++step) {
    CAPTURE(step);
    CHECK(out.token(0, step) == out.token(1, step));
    CHECK(std::ranges::equal(out.h2(0, step), out.h2(1, step)));
  }
  CHECK_FALSE(std::ranges::equal(tr.at(0, 1).o, tr.at(2, 1).o));
  CHECK_FALSE(std::ranges::equal(out.h2(0, 1), out.h2(2, 1)));
}

TEST_CASE("reference: draft rows overwritten by the next extend leave no trace") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const std::string preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const HeadHeader h = preset_header(preset);
    const auto bytes = test::random_head_bytes(h, rng());
    const HeadFile file = open_bytes(bytes);
    const int64_t n = 20, more = 2;  // fewer new rows than draft rows: the next draft overwrites the rest
    const Rows r = random_rows(h, n + more, rng);
    Reference drafted(file, {.max_slots = 1, .max_steps = 6, .fp8 = Fp8Mode::automatic, .threads = 1});
    Reference plain(file, {.max_slots = 1, .max_steps = 6, .fp8 = Fp8Mode::automatic, .threads = 1});
    const std::vector<int> slots = {0};
    const std::vector<ExtendRequest> first = {request(0, 0, r, 0, n, h)}, second = {request(0, n, r, n, more, h)};
    drafted.extend(first);
    drafted.draft(slots, 6);
    drafted.extend(second);
    plain.extend(first);
    plain.extend(second);
    CHECK(same(drafted.draft(slots, 6), plain.draft(slots, 6)));
    CHECK(std::ranges::equal(drafted.ring_k(0), plain.ring_k(0)));
    CHECK(std::ranges::equal(drafted.ring_v(0), plain.ring_v(0)));
  }
}

TEST_CASE("reference: a refused extend changes no slot, and reset starts a slot over") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const HeadHeader h = preset_header("tiny");
  const auto bytes = test::random_head_bytes(h, rng());
  const HeadFile file = open_bytes(bytes);
  Reference ref(file, {.max_slots = 2, .max_steps = 2, .fp8 = Fp8Mode::automatic, .threads = 1});
  const Rows r = random_rows(h, 4, rng);
  Rows bad = random_rows(h, 4, rng);
  bad.tokens[2] = static_cast<int32_t>(h.vocab);
  const std::vector<ExtendRequest> req = {request(0, 0, r, 0, 4, h), request(1, 0, bad, 0, 4, h)};
  CHECK_THROWS_WITH_AS(ref.extend(req), doctest::Contains("extend of slot 1: tokens[2] = 1000 is outside [0, 1000)"),
                       Error);
  CHECK(ref.slots().empty(0));  // the valid request before it was not applied either
  CHECK(ref.ring_k(0).empty());
  const std::vector<ExtendRequest> twice = {request(0, 0, r, 0, 2, h), request(0, 2, r, 2, 2, h)};
  CHECK_THROWS_WITH_AS(ref.extend(twice), doctest::Contains("slot 0 appears in requests[0] and requests[1]"), Error);
  ExtendRequest short_taps = request(0, 0, r, 0, 4, h);
  short_taps.taps = short_taps.taps.first(10);
  CHECK_THROWS_WITH_AS(ref.extend(std::span(&short_taps, 1)), doctest::Contains("10 tap values for 4 rows"), Error);
  CHECK(ref.slots().empty(0));
  // Positions at the integer limits reach no ring row (UBSan runs this in the sanitize stage).
  for (const int64_t first : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 2,
                              int64_t{std::numeric_limits<int32_t>::max()}, std::numeric_limits<int64_t>::min()}) {
    CAPTURE(first);
    const std::vector<ExtendRequest> far = {request(0, first, r, 0, 4, h)};
    CHECK_THROWS_AS(ref.extend(far), Error);
    CHECK(ref.slots().empty(0));
  }
  const std::vector<int> slots = {0};
  CHECK_THROWS_WITH_AS(ref.draft(slots, 1), doctest::Contains("slot 0 is empty"), Error);

  // Start mid-sequence, reset, start again elsewhere: the same rows at a shifted position draft the
  // same as a slot that only ever saw them there.
  const std::vector<ExtendRequest> at100 = {request(0, 100, r, 0, 4, h)};
  ref.extend(at100);
  CHECK(ref.slots().first_pos(0) == 100);
  ref.reset(0);
  const std::vector<ExtendRequest> at7 = {request(0, 7, r, 0, 4, h)};
  ref.extend(at7);
  Reference fresh(file, {.max_slots = 1, .max_steps = 2, .fp8 = Fp8Mode::automatic, .threads = 1});
  fresh.extend(at7);
  CHECK(same(ref.draft(slots, 2), fresh.draft(slots, 2)));
}

TEST_CASE("reference: with check_taps, a NaN or infinite tap is refused naming slot and row, and taken without") {
  const HeadHeader h = preset_header("tiny");
  const auto bytes = test::random_head_bytes(h, 3);
  const HeadFile file = open_bytes(bytes);
  std::mt19937_64 rng(5);
  Rows r = random_rows(h, 4, rng);
  const size_t width = h.taps.size() * static_cast<size_t>(h.target_hidden);
  r.taps[2 * width + 7] = 0x7FC0;  // NaN in row 2
  Reference checked(file, {.max_slots = 2, .max_steps = 2, .threads = 1, .check_taps = true});
  const std::vector<ExtendRequest> req = {request(1, 10, r, 0, 4, h)};
  CHECK_THROWS_WITH_AS(checked.extend(req),
                       doctest::Contains("extend of slot 1: taps row 2 (position 12) holds NaN at value 7 of the row"),
                       Error);
  CHECK(checked.slots().empty(1));
  r.taps[2 * width + 7] = 0xFF80;  // -inf
  CHECK_THROWS_WITH_AS(checked.extend(req), doctest::Contains("holds an infinity"), Error);
  Reference unchecked(file, {.max_slots = 2, .max_steps = 2, .threads = 1});
  CHECK_NOTHROW(unchecked.extend(req));
  // Counts a caller gives are bounded before anything is allocated.
  CHECK_THROWS_WITH_AS(Reference(file, {.max_slots = 1 << 26}),
                       doctest::Contains("max_slots: 67108864 is outside 1..4096"), Error);
  CHECK_THROWS_WITH_AS(Reference(file, {.threads = -5}), doctest::Contains("threads = -5 is outside 0..1024"), Error);
}

TEST_CASE("reference: FP8 modes choose the forms, and require names the missing linear") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  HeadHeader h = preset_header("tiny");
  const auto plain_bytes = test::random_head_bytes(h, rng());
  const HeadFile plain = open_bytes(plain_bytes);
  CHECK_THROWS_WITH_AS(Reference(plain, {.max_slots = 1, .max_steps = 1, .fp8 = Fp8Mode::require, .threads = 1}),
                       doctest::Contains("fp8 = require: linear `fc` has no FP8 form"), Error);
  h.fp8 = {"fc", "wq", "wk", "wv", "wo", "w_gate", "w_up"};  // all but w_down and lm_head
  const auto bytes = test::random_head_bytes(h, rng());
  const HeadFile file = open_bytes(bytes);
  CHECK_THROWS_WITH_AS(Reference(file, {.max_slots = 1, .max_steps = 1, .fp8 = Fp8Mode::require, .threads = 1}),
                       doctest::Contains("linear `w_down` has no FP8 form"), Error);
  Reference automatic(file, {.max_slots = 1, .max_steps = 3, .fp8 = Fp8Mode::automatic, .threads = 1});
  Reference off(file, {.max_slots = 1, .max_steps = 3, .fp8 = Fp8Mode::off, .threads = 1});
  CHECK(automatic.uses_fp8("wq"));
  CHECK_FALSE(automatic.uses_fp8("w_down"));
  CHECK_FALSE(off.uses_fp8("wq"));
  const Rows r = random_rows(h, 5, rng);
  const std::vector<ExtendRequest> req = {request(0, 0, r, 0, 5, h)};
  automatic.extend(req);
  off.extend(req);
  // The test head's FP8 forms are independent random codes, not quantized copies: the two must differ.
  CHECK_FALSE(std::ranges::equal(automatic.last_g(0), off.last_g(0)));
}

TEST_CASE("tfe-plan reference writes vectors that the reference reproduces") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const HeadHeader h = preset_header("tiny-two-stage");
  const auto bytes = test::random_head_bytes(h, rng());
  const std::string head = test::write_temp_file(bytes, "reference_head.tfe");
  const std::string out = (test::temp_dir() / "reference_vectors.safetensors").string();
  const uint64_t vseed = rng() >> 1;
  const std::string cmd = fmt::format("{} reference {} --streams 2 --rows 30 --steps 3 --seed {} -o {} > /dev/null",
                                      TFE_PLAN_EXE, head, vseed, out);
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto v = SafetensorsFile::open(out);
  const HeadFile file = HeadFile::open(head);
  CHECK(v.metadata().at("tfe.head_sha256") == file.header_sha256());
  CHECK(v.metadata().at("tfe.seed") == std::to_string(vseed));
  const int64_t R = ring_rows(h.window, 3);
  CHECK(v.find("ring_k")->shape == std::vector<int64_t>{2, R, h.kv_heads, h.head_dim});
  CHECK(v.find("step1.candidates")->shape == std::vector<int64_t>{2, h.cand_k});
  CHECK(v.find("step1.logits") == nullptr);  // a two-stage head has scores, not logits

  // Replay the stored inputs: the same outputs, bit for bit.
  const auto taps = v.find("taps")->as<bf16_bits>();
  const auto tokens = v.find("tokens")->as<int32_t>();
  const int64_t width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  Reference ref(file, {.max_slots = 2, .max_steps = 3, .fp8 = Fp8Mode::automatic, .threads = 1});
  for (int b = 0; b < 2; ++b)
    for (int64_t begin = 0; begin < 30; begin += R) {  // spans longer than the ring go in chunks
      const int64_t n = std::min<int64_t>(R, 30 - begin);
      const std::vector<ExtendRequest> req = {
          {b, begin, n, taps.subspan(static_cast<size_t>((b * 30 + begin) * width), static_cast<size_t>(n * width)),
           tokens.subspan(static_cast<size_t>(b * 30 + begin), static_cast<size_t>(n))}};
      ref.extend(req);
    }
  const std::vector<int> slots = {0, 1};
  const auto res = ref.draft(slots, 3);
  CHECK(std::ranges::equal(v.find("draft_tokens")->as<int32_t>(), res.tokens));
  CHECK(std::ranges::equal(v.find("hidden")->as<bf16_bits>(), res.hidden));
  CHECK(std::ranges::equal(v.find("ring_v")->as<bf16_bits>().subspan(static_cast<size_t>(R * h.kv_heads * h.head_dim)),
                           ref.ring_v(1)));
  // A different seed gives different taps.
  const std::string cmd2 = fmt::format("{} reference {} --streams 2 --rows 30 --steps 3 --seed {} -o {} > /dev/null",
                                       TFE_PLAN_EXE, head, vseed + 1, out);
  REQUIRE(std::system(cmd2.c_str()) == 0);
  const auto v2 = SafetensorsFile::open(out);
  CHECK_FALSE(std::ranges::equal(v2.find("taps")->as<bf16_bits>(), taps));
}

TEST_CASE("reference: a cand_k override rescores that many candidates, and is refused where the plan refuses it") {
  std::mt19937_64 rng(fresh_seed());
  const HeadHeader h = preset_header("tiny-two-stage");
  const auto bytes = test::random_head_bytes(h, rng());
  const HeadFile file = open_bytes(bytes);
  const Rows r = random_rows(h, 5, rng);
  const std::vector<ExtendRequest> req = {request(0, 0, r, 0, 5, h)};
  const std::vector<int> slots = {0};
  for (int cand_k : {0, 1, 3}) {
    CAPTURE(cand_k);
    Reference ref(file, {.max_slots = 1, .max_steps = 2, .fp8 = Fp8Mode::automatic, .threads = 1, .cand_k = cand_k});
    ref.extend(req);
    DraftTrace tr;
    ref.draft(slots, 2, &tr);
    for (int step = 1; step <= 2; ++step)
      CHECK(tr.at(0, step).candidates.size() == static_cast<size_t>(cand_k ? cand_k : h.cand_k));
  }
  CHECK_THROWS_WITH_AS(Reference(file, {.max_slots = 1, .cand_k = static_cast<int>(h.draft_vocab) + 1}),
                       doctest::Contains("is outside 1.."), Error);
  const HeadHeader dense = preset_header("tiny");
  const auto dense_bytes = test::random_head_bytes(dense, rng());
  const HeadFile dense_file = open_bytes(dense_bytes);
  CHECK_THROWS_WITH_AS(Reference(dense_file, {.max_slots = 1, .cand_k = 4}),
                       doctest::Contains("cand_k = 4 is set, but the head is dense"), Error);
}

TEST_CASE(
    "reference: first_ranks take step 1's token of that rank and the best after it, and a refused call changes "
    "nothing") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const HeadHeader h = preset_header("tiny");
  const auto bytes = test::random_head_bytes(h, rng());
  const HeadFile file = open_bytes(bytes);
  const Rows a = random_rows(h, 12, rng);
  Reference ref(file, {.max_slots = 4, .max_steps = 3});
  for (int slot = 0; slot < 4; ++slot) {
    const std::vector<ExtendRequest> req = {request(slot, 0, a, 0, 12, h)};
    ref.extend(req);
  }
  const std::vector<int> slots = {0, 1, 2, 3}, ranks = {0, 1, 2, 3}, one = {0};
  const DraftResult chain = ref.draft(one, 3);
  DraftTrace trace;
  const DraftResult tree = ref.draft(slots, 3, ranks, &trace);
  // Rank 0 is the chain, bit for bit; the four slots hold one state, so step 1 reads the same logits and
  // slot r takes their rank-r token.
  for (int step = 1; step <= 3; ++step) {
    CHECK(tree.token(0, step) == chain.token(0, step));
    CHECK(std::memcmp(&tree.confidences[size_t(step - 1)], &chain.confidences[size_t(step - 1)], sizeof(float)) == 0);
  }
  const auto& logits = trace.at(0, 1).logits;
  const auto order = ref::topk(logits, 4);
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - logits[size_t(order[0])]);
  std::set<int32_t> firsts;
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(trace.at(r, 1).logits == logits);
    CHECK(trace.at(r, 1).draft_id == order[size_t(r)]);
    const double want = std::exp(double(logits[size_t(order[size_t(r)])]) - logits[size_t(order[0])]) / sum;
    CHECK(tree.confidence(r, 1) == doctest::Approx(want).epsilon(1e-5));
    firsts.insert(tree.token(r, 1));
  }
  CHECK(firsts.size() == 4);

  // Refused before anything is written: a fresh slot's ring keeps its zeros past the real rows.
  Reference fresh(file, {.max_slots = 4, .max_steps = 3});
  const std::vector<ExtendRequest> rows = {request(0, 0, a, 0, 12, h)};
  fresh.extend(rows);
  const std::vector<bf16_bits> ring(fresh.ring_k(0).begin(), fresh.ring_k(0).end());
  const std::vector<int> too_high = {8}, short_ranks = {0, 1}, negative = {-1};
  CHECK_THROWS_WITH_AS(fresh.draft(one, 3, too_high),
                       doctest::Contains("first_ranks[0] = 8 is outside 0..7 (kMaxFirstRank = 7, draft_vocab ="),
                       Error);
  CHECK_THROWS_WITH_AS(fresh.draft(one, 3, negative), doctest::Contains("first_ranks[0] = -1 is outside 0..7"), Error);
  CHECK_THROWS_WITH_AS(fresh.draft(one, 3, short_ranks), doctest::Contains("first_ranks has 2 entries for 1 slots"),
                       Error);
  CHECK(std::equal(ring.begin(), ring.end(), fresh.ring_k(0).begin(), fresh.ring_k(0).end()));
  CHECK(same(fresh.draft(one, 3), chain));

  const HeadHeader h2 = preset_header("tiny-two-stage");
  const auto bytes2 = test::random_head_bytes(h2, rng());
  const HeadFile file2 = open_bytes(bytes2);
  const Rows b = random_rows(h2, 9, rng);
  Reference two(file2, {.max_slots = 1, .max_steps = 2});
  const std::vector<ExtendRequest> req = {request(0, 0, b, 0, 9, h2)};
  two.extend(req);
  const std::vector<int> second = {1}, best = {0};
  CHECK_THROWS_WITH_AS(two.draft(one, 2, second), doctest::Contains("a two_stage head drafts its best token only"),
                       Error);
  CHECK(same(two.draft(one, 2, best), two.draft(one, 2)));
}
