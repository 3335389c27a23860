#include "head/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"

namespace tfe {

void parallel_chunks(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t t = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  t = std::min(t, n);
  if (t == 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    const int64_t begin = n * i / t, end = n * (i + 1) / t;
    pool.emplace_back([&, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

uint8_t float_to_fp8_e4m3_fast(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7f;          // NaN
  if (u >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (u >= 0x3c800000u) {                    // >= 2^-6: a normal e4m3 value
    // Round the 23-bit mantissa to 3 bits, nearest even; a carry moves into the exponent as it should.
    u += 0x7ffffu + ((u >> 20) & 1u);
    // fp32 exponent bias 127, e4m3 bias 7: rebias the 8-bit exponent field into 4 bits.
    return sign | static_cast<uint8_t>((u >> 20) - (120u << 3));
  }
  // Subnormal: multiples of 2^-9. Adding 2^23 leaves an ulp of 1, so the add rounds to an integer, nearest
  // even; a result of 8 is the code of 2^-6, the smallest normal, which is exactly right.
  const float steps = std::bit_cast<float>(u) * 512.0f;
  return sign | static_cast<uint8_t>((steps + 8388608.0f) - 8388608.0f);
}

float fp8_row_scale(std::span<const bf16_bits> row) {
  float amax = 0.0f;
  for (bf16_bits b : row) amax = std::max(amax, std::fabs(bf16_to_float(b)));
  return amax == 0.0f ? 1.0f : amax / kFp8E4m3Max;
}

Fp8Linear quantize_fp8(std::span<const bf16_bits> w, int64_t rows, int64_t cols, int threads) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(w.size()) != rows * cols)
    fail("quantize_fp8: {} values do not form a [{}, {}] linear", w.size(), rows, cols);
  Fp8Linear out;
  out.q.resize(w.size());
  out.scale.resize(static_cast<size_t>(rows));
  parallel_chunks(rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const auto row = w.subspan(static_cast<size_t>(j * cols), static_cast<size_t>(cols));
      for (int64_t k = 0; k < cols; ++k)
        if (!std::isfinite(bf16_to_float(row[k])))
          fail("quantize_fp8: value at row {}, column {} is not finite ({})", j, k, bf16_to_float(row[k]));
      const float s = fp8_row_scale(row);
      out.scale[j] = s;
      uint8_t* q = out.q.data() + j * cols;
      for (int64_t k = 0; k < cols; ++k) q[k] = float_to_fp8_e4m3_fast(bf16_to_float(row[k]) / s);
    }
  });
  return out;
}

void mark_fp8_forms(HeadHeader& h) {
  const auto in_use = linears_in_use(h);
  h.fp8.clear();
  for (auto l : kLinears)
    if (std::find(in_use.begin(), in_use.end(), l) != in_use.end()) h.fp8.emplace_back(l);
}

namespace {

template <typename T>
std::vector<std::byte> to_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::copy_n(reinterpret_cast<const std::byte*>(v.data()), b.size(), b.data());
  return b;
}

}  // namespace

bool is_fp8_form(const TensorSpec& s) {
  return s.dtype == DType::F8_E4M3 || (s.dtype == DType::F32 && s.name.ends_with(".scale"));
}

HeadWriter assemble_head(const HeadHeader& h, std::vector<HeadTensor> tensors, int threads) {
  const auto expected = expected_tensors(h);
  auto find = [&](std::string_view name) {
    return std::find_if(tensors.begin(), tensors.end(), [&](const HeadTensor& t) { return t.name == name; });
  };
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    if (!seen.insert(t.name).second) fail("assemble_head: tensor `{}` is given twice", t.name);
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&](const TensorSpec& s) { return s.name == t.name && !is_fp8_form(s); });
    if (!known) fail("assemble_head: tensor `{}` is not a bf16 or int32 tensor of this head", t.name);
  }

  // FP8 forms first, while the bf16 bytes are still ours; the bf16 tensors are then moved, not copied.
  std::vector<std::pair<std::string, Fp8Linear>> forms;
  for (const auto& l : h.fp8) {
    auto it = find(l);
    if (it == tensors.end()) fail("assemble_head: linear `{}` is listed for FP8 but its bf16 tensor is missing", l);
    const auto shape = linear_shape(h, l);
    if (it->dtype != DType::BF16 || it->shape != shape)
      fail("assemble_head: linear `{}` must be BF16 [{}, {}] to be quantized", l, shape[0], shape[1]);
    std::span<const bf16_bits> w(reinterpret_cast<const bf16_bits*>(it->bytes.data()), it->bytes.size() / 2);
    forms.emplace_back(l, quantize_fp8(w, shape[0], shape[1], threads));
  }

  // The reader maps tensors in place, so each must start at a multiple of its element size: wider
  // elements go first (F32 scales, I32 d2t, BF16, then F8), each group in expected_tensors order.
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Pending> out;
  for (const auto& spec : expected) {
    if (is_fp8_form(spec)) continue;
    auto it = find(spec.name);
    if (it == tensors.end()) fail("assemble_head: tensor `{}` is missing", spec.name);
    out.push_back({it->name, it->dtype, std::move(it->shape), std::move(it->bytes)});
  }
  for (auto& [l, f] : forms) {
    const auto shape = linear_shape(h, l);
    out.push_back({l + ".fp8", DType::F8_E4M3, shape, to_bytes(f.q)});
    out.push_back({l + ".scale", DType::F32, {shape[0]}, to_bytes(f.scale)});
    f = {};
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Pending& a, const Pending& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  HeadWriter writer(h);
  for (auto& p : out) writer.add(p.name, p.dtype, std::move(p.shape), std::move(p.bytes));
  return writer;
}

}  // namespace tfe
