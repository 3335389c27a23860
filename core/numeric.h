// Host-side number formats: bf16 and FP8 e4m3 conversions, bit-exact with the CUDA intrinsics
// (__float2bfloat16_rn, __nv_cvt_float_to_fp8 with __NV_SATFINITE / E4M3). Shared by the CPU reference,
// the random-head generator, FP8 quantization and the tests.
#pragma once
#include <bit>
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <tfe/dtype.h>

namespace tfe {

inline float bf16_to_float(bf16_bits b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline bf16_bits float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// `d` as a 32-bit float, or nullopt where no float stands for it: not finite, a magnitude past FLT_MAX, or a
// nonzero that would round to 0 (an rms_eps of 1e-300 is not 0).
inline std::optional<float> float32_of(double d) {
  if (!std::isfinite(d) || std::fabs(d) > FLT_MAX) return std::nullopt;
  const float f = static_cast<float>(d);
  if (f == 0.0f && d != 0.0) return std::nullopt;
  return f;
}
// What float32_of refuses, for messages.
inline constexpr const char* kFloat32Range = "a 32-bit float holds 0 and magnitudes 1.4e-45..3.4028235e+38";

// e4m3 (fn): 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; 0x7f / 0xff are NaN; max 448.
inline float fp8_e4m3_to_float(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 0x7;
  float mag;
  if (exp == 0xf && man == 0x7) {
    mag = std::nanf("");
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -mag : mag;
}

// Round to nearest even, saturating to +-448 (NaN -> 0x7f).
inline uint8_t float_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (448 = 0x7e)
  // Smallest subnormal step is 2^-9; values are multiples of 2^(e-3) within each binade.
  int e;
  std::frexp(a, &e);                         // a = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;                  // a in [2^exp_unbiased, 2^(exp_unbiased+1))
  if (exp_unbiased < -6) exp_unbiased = -6;  // subnormal range shares the step of binade -6
  const float step = std::ldexp(1.0f, exp_unbiased - 3);
  float q = std::nearbyint(a / step);  // default rounding mode: nearest even
  float r = q * step;
  if (r >= 448.0f) return sign | 0x7e;
  // Encode r.
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  int ex = re - 1;
  if (ex < -6) {  // subnormal
    return sign | static_cast<uint8_t>(std::lround(r / std::ldexp(1.0f, -9)));
  }
  const int man = static_cast<int>(std::lround((r / std::ldexp(1.0f, ex) - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>(((ex + 7) << 3) | man);
}

namespace detail {

// The first index in [begin, end) of `values` for which `bad` holds, or -1; gives up (-1) once `stop()` says
// an earlier band has a hit. Blocks reduced without a branch (the loop vectorizes), then the one block that
// holds a hit searched element by element.
template <typename T, typename Bad, typename Stop>
int64_t find_first_bad_in(std::span<const T> values, size_t begin, size_t end, Bad bad, Stop stop) {
  constexpr size_t kBlock = 4096 / sizeof(T);
  for (size_t first = begin; first < end; first += kBlock) {
    const size_t last = std::min(end, first + kBlock);
    unsigned any = 0;
    for (size_t i = first; i < last; ++i) any |= bad(values[i]) ? 1u : 0u;
    if (any != 0)
      for (size_t i = first; i < last; ++i)
        if (bad(values[i])) return static_cast<int64_t>(i);
    if (stop()) return -1;
  }
  return -1;
}

}  // namespace detail

// The index of the first element of `values` for which `bad` holds, or -1. A large span is split into
// bands checked on several threads (a head's 1.9 GB of weights at the memory bandwidth of several cores,
// not of one); the lowest band with a hit answers, so the index is the lowest, as on one thread. A band
// stops early once a band before it has a hit.
template <typename T, typename Bad>
int64_t find_first_bad(std::span<const T> values, Bad bad) {
  constexpr size_t kMinBandBytes = size_t{16} << 20;
  const size_t n = values.size();
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const size_t bands = std::clamp<size_t>(n * sizeof(T) / kMinBandBytes, 1, threads);
  if (bands == 1) return detail::find_first_bad_in(values, 0, n, bad, [] { return false; });
  const size_t band = (n + bands - 1) / bands;
  std::atomic<size_t> first_hit_band{bands};
  std::vector<std::future<int64_t>> found;
  for (size_t b = 0; b < bands; ++b)
    found.push_back(std::async(std::launch::async, [&, b] {
      const int64_t at = detail::find_first_bad_in(values, b * band, std::min(n, (b + 1) * band), bad,
                                                   [&] { return first_hit_band.load(std::memory_order_relaxed) < b; });
      if (at >= 0) {
        size_t seen = first_hit_band.load(std::memory_order_relaxed);
        while (b < seen && !first_hit_band.compare_exchange_weak(seen, b, std::memory_order_relaxed)) {
        }
      }
      return at;
    }));
  int64_t first = -1;
  for (auto& f : found) {  // every band joined before returning: they read `values`
    const int64_t at = f.get();
    if (first < 0) first = at;
  }
  return first;
}

// The index of the first e4m3 NaN code (0x7f or 0xff) in `bytes`, or -1 when every byte is a finite value.
// FP8 weights must be finite: quantize_fp8 never writes a NaN code, and the FP8 GEMV widens e4m3 by bit
// placement, which reads a NaN code as a finite weight (kernels/gemv.cuh, fp8x4_widen). HeadFile's value
// check, the writer and the runtime's upload refuse a tensor that holds one.
inline int64_t find_e4m3_nan(std::span<const std::byte> bytes) {
  return find_first_bad(bytes, [](std::byte b) { return (std::to_integer<unsigned>(b) & 0x7fu) == 0x7fu; });
}

// The index of the first bf16 value of `values` that is NaN or infinite (exponent all ones), or -1.
inline int64_t find_bf16_nonfinite(std::span<const bf16_bits> values) {
  return find_first_bad(values, [](bf16_bits b) { return (b & 0x7f80u) == 0x7f80u; });
}

}  // namespace tfe
