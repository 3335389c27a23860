#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "head/fp8.h"
#include <tfe/head_file.h>
#include "core/numeric.h"
#include "head/presets.h"

using namespace tfe;

namespace {

std::vector<bf16_bits> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_bits> out;
  for (float f : v) out.push_back(float_to_bf16(f));
  return out;
}

// The e4m3 step of the binade holding |x| (the subnormal binades share the step 2^-9).
float e4m3_ulp(float x) {
  int e;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0f, std::max(e - 1, -6) - 3);
}

}  // namespace

TEST_CASE("fp8: a row whose amax is 448 keeps its e4m3 values exactly") {
  // Every value is an e4m3 value (and so a bf16 value); amax 448 makes the scale exactly 1.
  const std::vector<float> row = {448.0f, -448.0f, 1.5f, -0.875f, 0x1p-9f, -0x1p-7f, 0.0f, 240.0f, -13.0f, 0.1171875f};
  const auto w = to_bf16(row);
  const auto f = quantize_fp8(w, 1, static_cast<int64_t>(w.size()));
  REQUIRE(f.scale.size() == 1);
  CHECK(f.scale[0] == 1.0f);
  for (size_t k = 0; k < row.size(); ++k) {
    CAPTURE(k);
    CHECK(fp8_e4m3_to_float(f.q[k]) == row[k]);
  }
  CHECK(f.q[0] == 0x7e);
  CHECK(f.q[1] == 0xfe);
}

TEST_CASE("fp8: an all-zero row has scale 1 and zero codes, and other rows keep their own scale") {
  const std::vector<float> rows = {0.0f, 0.0f,  -0.0f, 0.0f,  //
                                   3.0f, -1.0f, 0.5f,  0.25f};
  const auto f = quantize_fp8(to_bf16(rows), 2, 4);
  CHECK(f.scale[0] == 1.0f);
  for (int k = 0; k < 4; ++k) CHECK(fp8_e4m3_to_float(f.q[k]) == 0.0f);
  CHECK(f.scale[1] == 3.0f / 448.0f);
  CHECK(fp8_e4m3_to_float(f.q[4]) == 448.0f);
}

TEST_CASE("fp8: ties round to the even code, in normal and subnormal binades") {
  // Scale 1 (amax 448). 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): even is 1.0.
  // 1.1875 lies between 1.125 (1) and 1.25 (2): even is 1.25. 3 * 2^-10 lies between 2^-9 (subnormal
  // mantissa 1) and 2^-8 (2): even is 2^-8. 2^-10 lies between 0 and 2^-9: even is 0.
  const std::vector<float> row = {448.0f, 1.0625f, 1.1875f, -1.1875f, 3 * 0x1p-10f, 0x1p-10f, 0x1p-11f};
  const auto f = quantize_fp8(to_bf16(row), 1, static_cast<int64_t>(row.size()));
  REQUIRE(f.scale[0] == 1.0f);
  CHECK(fp8_e4m3_to_float(f.q[1]) == 1.0f);
  CHECK(fp8_e4m3_to_float(f.q[2]) == 1.25f);
  CHECK(fp8_e4m3_to_float(f.q[3]) == -1.25f);
  CHECK(fp8_e4m3_to_float(f.q[4]) == 0x1p-8f);
  CHECK(fp8_e4m3_to_float(f.q[5]) == 0.0f);
  CHECK(fp8_e4m3_to_float(f.q[6]) == 0.0f);
}

TEST_CASE("fp8: the amax element saturates to +-448, never to NaN") {
  // w / (amax / 448) can round above 448 in fp32; the code must saturate, not overflow to 0x7f (NaN).
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(1e-6f, 1e4f);
  int above = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const float a = round_bf16(mag(rng));
    const std::vector<bf16_bits> row = {float_to_bf16(-a), float_to_bf16(a * 0.25f)};
    const float s = fp8_row_scale(row);
    if (a / s > 448.0f) ++above;
    const auto f = quantize_fp8(row, 1, 2);
    CAPTURE(a);
    CHECK(f.q[0] == 0xfe);
  }
  // Direct saturation of the conversion itself.
  CHECK(float_to_fp8_e4m3(1e30f) == 0x7e);
  CHECK(float_to_fp8_e4m3(-464.0f) == 0xfe);
  CHECK(above > 0);  // the fp32 division did overshoot 448 in some rows: the saturating path ran
}

TEST_CASE("fp8: dequantized error is within half an e4m3 step of each value (fresh random rows)") {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-12.0f, 8.0f);
  const int64_t rows = 64, cols = 97;
  std::vector<bf16_bits> w(rows * cols);
  for (int64_t j = 0; j < rows; ++j) {
    const float row_scale = std::exp2(log_scale(rng));
    for (int64_t k = 0; k < cols; ++k) w[j * cols + k] = float_to_bf16(row_scale * normal(rng));
  }
  const auto f = quantize_fp8(w, rows, cols, 3);
  CHECK(f.q == quantize_fp8(w, rows, cols, 1).q);  // thread count does not change a byte
  for (int64_t j = 0; j < rows; ++j) {
    float amax = 0.0f;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(bf16_to_float(w[j * cols + k])));
    CHECK(f.scale[j] == amax / 448.0f);
    for (int64_t k = 0; k < cols; ++k) {
      const float x = bf16_to_float(w[j * cols + k]) / f.scale[j];
      const float q = fp8_e4m3_to_float(f.q[j * cols + k]);
      CAPTURE(j);
      CAPTURE(k);
      CAPTURE(x);
      REQUIRE(std::isfinite(q));
      if (std::fabs(x) <= 448.0f) {
        CHECK(std::fabs(q - x) <= 0.5f * e4m3_ulp(x));
      } else {
        CHECK(std::fabs(q) == 448.0f);  // fp32 rounding of the division, a few ulps above 448
      }
    }
  }
}

TEST_CASE("fp8: a non-finite weight is refused with its row and column") {
  std::vector<bf16_bits> w = to_bf16({1.0f, 2.0f, 3.0f, 4.0f});
  w[3] = float_to_bf16(INFINITY);
  CHECK_THROWS_WITH_AS(quantize_fp8(w, 2, 2), doctest::Contains("row 1, column 1"), Error);
  CHECK_THROWS_WITH_AS(quantize_fp8(w, 3, 2), doctest::Contains("[3, 2]"), Error);
}

TEST_CASE("fp8: mark_fp8_forms lists the linears in use, in kLinears order") {
  auto dense = preset_header("tiny");
  mark_fp8_forms(dense);
  CHECK(dense.fp8 == std::vector<std::string>{"fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head"});
  CHECK_NOTHROW(validate(dense));
  auto two = preset_header("tiny-two-stage");
  mark_fp8_forms(two);
  CHECK(two.fp8 == std::vector<std::string>{"fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lr_a", "lr_b",
                                            "target_head"});
  CHECK_NOTHROW(validate(two));
}

TEST_CASE("fp8: parallel_chunks covers the range once and rethrows a chunk's error") {
  std::vector<int> hits(1001, 0);
  parallel_chunks(1001, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++hits[i];
  });
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  CHECK_THROWS_WITH_AS(parallel_chunks(10, 3,
                                       [](int64_t b, int64_t) {
                                         if (b > 0) fail("chunk at {}", b);
                                       }),
                       doctest::Contains("chunk at"), Error);
}

TEST_CASE("fp8: float_to_fp8_e4m3_fast is float_to_fp8_e4m3, byte for byte") {
  auto check = [](uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const uint8_t want = float_to_fp8_e4m3(f), got = float_to_fp8_e4m3_fast(f);
    if (want != got) {
      CAPTURE(bits);
      CAPTURE(f);
      CHECK(static_cast<int>(got) == static_cast<int>(want));
      return false;
    }
    return true;
  };
  // Every fp32 binade from the fp32 subnormals to inf and NaN, both signs, every kept 3-bit mantissa and
  // three more bits below it, and the dropped bits at the rounding edges: 0, 1, half - 1, half, half + 1, all.
  int bad = 0;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t exp = 0; exp <= 255; ++exp)
      for (uint32_t top = 0; top < 64; ++top)
        for (uint32_t low : {0u, 1u, 0x1ffffu, 0x20000u, 0x20001u, 0x3ffffu})
          bad += !check(sign | exp << 23 | top << 17 | low);
  // Fresh random bit patterns, and random values inside the e4m3 range.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> in_range(-460.0f, 460.0f);
  for (int i = 0; i < 200000 && bad < 10; ++i) {
    bad += !check(static_cast<uint32_t>(rng()));
    bad += !check(std::bit_cast<uint32_t>(in_range(rng) * std::exp2(-static_cast<float>(rng() % 24))));
  }
  CHECK(bad == 0);
}

TEST_CASE("find_first_bad: over bands on several threads, the lowest bad index is the one reported") {
  // 96 MiB of bf16: several 16 MiB bands wherever more than one core is.
  std::vector<bf16_bits> v(size_t{48} << 20, 0x3f80);  // 1.0
  const std::span<const bf16_bits> s(v);
  CHECK(find_bf16_nonfinite(s) == -1);
  const size_t late = v.size() - 1, middle = v.size() / 2 + 7, early = 12345;
  v[late] = 0x7f80;  // +inf, in the last band only
  CHECK(find_bf16_nonfinite(s) == static_cast<int64_t>(late));
  v[middle] = 0xffc1;  // a NaN in a band before it
  CHECK(find_bf16_nonfinite(s) == static_cast<int64_t>(middle));
  v[early] = 0xff80;  // -inf in the first band: the bands after it stop early, and it is still the answer
  CHECK(find_bf16_nonfinite(s) == static_cast<int64_t>(early));
  std::vector<std::byte> codes(size_t{64} << 20, std::byte{0x38});
  codes[codes.size() - 3] = std::byte{0xff};
  codes[(size_t{33} << 20) + 1] = std::byte{0x7f};
  CHECK(find_e4m3_nan(codes) == (int64_t{33} << 20) + 1);
}
