#include "reference/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "reference/parallel.h"

namespace tfe::ref {

namespace {

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[static_cast<size_t>(i)] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_bits v) { return bf16_to_float(v); }

// The lane sum of head: reference_ops.h. The inner loop over lanes has no cross-lane dependency, so
// the compiler keeps kSumLanes accumulators in vector registers without changing any rounding.
template <typename A, typename B, typename Load>
float lane_dot(const A* a, const B* b, int64_t n, Load load_a) {
  float acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) acc[l] += load_a(a[i + l]) * to_f32(b[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += load_a(a[i]) * to_f32(b[i]);
  for (int width = kSumLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = acc[2 * l] + acc[2 * l + 1];
  return acc[0];
}

void check_size(std::string_view what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) fail("{}: {} elements where {} are needed", what, got, want);
}

int64_t rows_of(std::string_view what, size_t size, int64_t width) {
  if (width < 1 || size % static_cast<size_t>(width) != 0)
    fail("{}: {} elements are not whole rows of {}", what, size, width);
  return static_cast<int64_t>(size) / width;
}

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  return lane_dot(a, b, n, [](float v) { return v; });
}
float dot(const bf16_bits* a, const float* b, int64_t n) {
  return lane_dot(a, b, n, [](bf16_bits v) { return bf16_to_float(v); });
}
float dot(const bf16_bits* a, const bf16_bits* b, int64_t n) {
  return lane_dot(a, b, n, [](bf16_bits v) { return bf16_to_float(v); });
}
float dot(const uint8_t* q, const float* b, int64_t n) {
  const float* t = fp8_table().data();
  return lane_dot(q, b, n, [t](uint8_t v) { return t[v]; });
}

std::vector<float> widen(std::span<const bf16_bits> x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(x[i]);
  return out;
}

void rmsnorm(std::span<const bf16_bits> x, std::span<const bf16_bits> w, float eps, std::span<bf16_bits> y) {
  const int64_t n = static_cast<int64_t>(w.size());
  const int64_t rows = rows_of("rmsnorm x", x.size(), n);
  check_size("rmsnorm y", y.size(), rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    const bf16_bits* xr = x.data() + r * n;
    const float mean = dot(xr, xr, n) / static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) {
      const float normed = round_bf16(bf16_to_float(xr[i]) * inv);
      y[static_cast<size_t>(r * n + i)] = float_to_bf16(bf16_to_float(w[static_cast<size_t>(i)]) * normed);
    }
  }
}

Linear Linear::bf16(std::string name, std::span<const bf16_bits> w, int64_t out, int64_t in) {
  check_size(fmt::format("linear {} (bf16)", name), w.size(), out * in);
  Linear l;
  l.name = std::move(name);
  l.out = out;
  l.in = in;
  l.w = w.data();
  return l;
}

Linear Linear::fp8(std::string name, std::span<const uint8_t> q, std::span<const float> scale, int64_t out,
                   int64_t in) {
  check_size(fmt::format("linear {} (FP8)", name), q.size(), out * in);
  check_size(fmt::format("linear {} (FP8 scale)", name), scale.size(), out);
  Linear l;
  l.name = std::move(name);
  l.out = out;
  l.in = in;
  l.q = q.data();
  l.scale = scale.data();
  return l;
}

float Linear::acc(int64_t j, const float* x) const {
  if (q) return scale[j] * dot(q + j * in, x, in);
  return dot(w + j * in, x, in);
}

namespace {

// Runs emit(row, j, acc) for every output; rows of x are widened once, and each weight row is read once
// for all rows of x (the weights dominate the traffic).
template <typename Emit>
void linear_rows(const Linear& w, std::span<const bf16_bits> x, size_t y_size, int threads, Emit emit) {
  const int64_t rows = rows_of(fmt::format("linear {} x", w.name), x.size(), w.in);
  check_size(fmt::format("linear {} y", w.name), y_size, rows * w.out);
  const std::vector<float> xf = widen(x);
  parallel_rows(w.out, w.in * rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t r = 0; r < rows; ++r) emit(r, j, w.acc(j, xf.data() + r * w.in));
  });
}

}  // namespace

void linear(const Linear& w, std::span<const bf16_bits> x, std::span<bf16_bits> y, int threads) {
  linear_rows(w, x, y.size(), threads,
              [&](int64_t r, int64_t j, float acc) { y[static_cast<size_t>(r * w.out + j)] = float_to_bf16(acc); });
}

void linear_f32(const Linear& w, std::span<const bf16_bits> x, std::span<float> y, int threads) {
  linear_rows(w, x, y.size(), threads,
              [&](int64_t r, int64_t j, float acc) { y[static_cast<size_t>(r * w.out + j)] = acc; });
}

void linear_residual(const Linear& w, std::span<const bf16_bits> x, std::span<const bf16_bits> res,
                     std::span<bf16_bits> y, int threads) {
  check_size(fmt::format("linear {} residual", w.name), res.size(), static_cast<int64_t>(y.size()));
  linear_rows(w, x, y.size(), threads, [&](int64_t r, int64_t j, float acc) {
    const size_t at = static_cast<size_t>(r * w.out + j);
    y[at] = float_to_bf16(bf16_to_float(res[at]) + acc);
  });
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

void swiglu(std::span<const bf16_bits> gate, std::span<const bf16_bits> up, std::span<bf16_bits> m) {
  check_size("swiglu up", up.size(), static_cast<int64_t>(gate.size()));
  check_size("swiglu m", m.size(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    const float a = round_bf16(silu(bf16_to_float(gate[i])));
    m[i] = float_to_bf16(a * bf16_to_float(up[i]));
  }
}

void rope(std::span<const bf16_bits> x, int64_t hd, int32_t pos, std::span<const float> inv_freq,
          std::span<bf16_bits> y) {
  const int64_t half = hd / 2;
  check_size("rope inv_freq", inv_freq.size(), half);
  const int64_t heads = rows_of("rope x", x.size(), hd);
  check_size("rope y", y.size(), heads * hd);
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int64_t h = 0; h < heads; ++h) {
      const size_t lo = static_cast<size_t>(h * hd + i), hi = lo + static_cast<size_t>(half);
      const float a = bf16_to_float(x[lo]), b = bf16_to_float(x[hi]);
      y[lo] = float_to_bf16(a * c - b * s);
      y[hi] = float_to_bf16(b * c + a * s);
    }
  }
}

void attention(std::span<const bf16_bits> q, std::span<const bf16_bits> k, std::span<const bf16_bits> v, int64_t nh,
               int64_t nkv, int64_t hd, std::span<bf16_bits> o) {
  if (nh < 1 || nkv < 1 || nh % nkv != 0) fail("attention: heads = {} is not a multiple of kv_heads = {}", nh, nkv);
  check_size("attention q", q.size(), nh * hd);
  check_size("attention o", o.size(), nh * hd);
  const int64_t n_keys = rows_of("attention k", k.size(), nkv * hd);
  check_size("attention v", v.size(), n_keys * nkv * hd);
  if (n_keys < 1) fail("attention: no keys");
  const float scale = attention_scale(hd);
  const int64_t group = nh / nkv;
  std::vector<float> p(static_cast<size_t>(n_keys));
  for (int64_t j = 0; j < nh; ++j) {
    const int64_t kvh = j / group;
    const bf16_bits* qj = q.data() + j * hd;
    float max = -INFINITY;
    for (int64_t t = 0; t < n_keys; ++t) {
      p[static_cast<size_t>(t)] = dot(qj, k.data() + (t * nkv + kvh) * hd, hd) * scale;
      max = std::max(max, p[static_cast<size_t>(t)]);
    }
    float sum = 0.0f;
    for (float& s : p) {
      s = std::exp(s - max);
      sum += s;
    }
    for (float& s : p) s /= sum;
    for (int64_t d = 0; d < hd; ++d) {
      float acc = 0.0f;
      for (int64_t t = 0; t < n_keys; ++t)
        acc += p[static_cast<size_t>(t)] * bf16_to_float(v[static_cast<size_t>((t * nkv + kvh) * hd + d)]);
      o[static_cast<size_t>(j * hd + d)] = float_to_bf16(acc);
    }
  }
}

// sum_i expf(l_i - max), in ascending i: the softmax denominator of top1, ranked and rescore.
static float softmax_sum(std::span<const float> logits, float max) {
  float sum = 0.0f;
  for (float l : logits) sum += std::exp(l - max);
  return sum;
}

Top1 top1(std::span<const float> logits) {
  if (logits.empty()) fail("top1: no logits");
  Top1 r;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(r.id)]) r.id = static_cast<int64_t>(i);
  const float max = logits[static_cast<size_t>(r.id)];
  r.confidence = 1.0f / softmax_sum(logits, max);
  return r;
}

Top1 ranked(std::span<const float> logits, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= logits.size())
    fail("ranked: rank = {} is outside 0..{} (below the number of logits)", rank, logits.size() - 1);
  const Top1 best = top1(logits);
  if (rank == 0) return best;
  const int64_t id = topk(logits, rank + 1)[static_cast<size_t>(rank)];
  const float max = logits[static_cast<size_t>(best.id)];
  return {id, std::exp(logits[static_cast<size_t>(id)] - max) / softmax_sum(logits, max)};
}

std::vector<int32_t> topk(std::span<const float> scores, int k) {
  if (k < 1 || static_cast<size_t>(k) > scores.size())
    fail("topk: k = {} is outside 1..{} (the number of scores)", k, scores.size());
  std::vector<int32_t> ids(scores.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

Rescored rescore(std::span<const float> exact, std::span<const int32_t> target) {
  if (exact.empty()) fail("rescore: no candidates");
  check_size("rescore target ids", target.size(), static_cast<int64_t>(exact.size()));
  size_t best = 0;
  for (size_t c = 1; c < exact.size(); ++c)
    if (exact[c] > exact[best] || (exact[c] == exact[best] && target[c] < target[best])) best = c;
  return {static_cast<int64_t>(best), target[best], 1.0f / softmax_sum(exact, exact[best])};
}

}  // namespace tfe::ref
