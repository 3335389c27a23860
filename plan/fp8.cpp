#include "plan/fp8.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "plan/error.h"

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
      for (int64_t k = 0; k < cols; ++k) q[k] = float_to_fp8_e4m3(bf16_to_float(row[k]) / s);
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
    const bool known = std::any_of(expected.begin(), expected.end(), [&](const TensorSpec& s) {
      return s.name == t.name && !is_fp8_form(s);
    });
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

  HeadWriter writer(h);
  for (const auto& spec : expected) {
    if (is_fp8_form(spec)) continue;
    auto it = find(spec.name);
    if (it == tensors.end()) fail("assemble_head: tensor `{}` is missing", spec.name);
    writer.add(it->name, it->dtype, std::move(it->shape), std::move(it->bytes));
  }
  for (auto& [l, f] : forms) {
    const auto shape = linear_shape(h, l);
    writer.add(l + ".fp8", DType::F8_E4M3, shape, to_bytes(f.q));
    writer.add(l + ".scale", DType::F32, {shape[0]}, to_bytes(f.scale));
    f = {};
  }
  return writer;
}

}  // namespace tfe
