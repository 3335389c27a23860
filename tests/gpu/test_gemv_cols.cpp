// The gemv's output width per CTA (COLS 16 or 32) changes which CTA computes a column, never its bits:
// at either width a column is the same per-warp step sums joined in the same warp order. The planner
// picks the width for speed alone (plan/planner.cpp gemv_cols), so both specializations of one shape
// must write identical outputs. The same holds for the weights' layout (kernels/weight_layout.h): tiled, a
// lane loads the same chunks from other addresses, so where a shape has a tiled form (N a multiple of 16,
// rows of whole 64-byte steps) TILED 1 on the tiled weights must write the bits of TILED 0 on the rows.
// Each runs on the same fresh random x, weights and residual, into outputs
// filled with NaN first; N is not a multiple of 32 (the last COLS 32 CTA has a partial second tile) and
// the row counts cover a full and a partial 8-row input tile.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/registry.h"
#include "core/numeric.h"
#include "kernels/weight_layout.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "device/kernels.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

struct Inputs {
  std::vector<uint8_t> w;  // [N, K] bf16 or e4m3 bytes
  std::vector<float> scale;
  std::vector<uint16_t> x, residual;
};

Inputs random_inputs(std::mt19937_64& rng, int64_t rows, int64_t k, int64_t n, bool fp8) {
  Inputs in;
  if (fp8) {
    std::uniform_int_distribution<int> byte(0, 255);
    in.w.resize(static_cast<size_t>(n * k));
    for (auto& b : in.w) {
      do b = static_cast<uint8_t>(byte(rng));
      while ((b & 0x7f) == 0x7f);  // e4m3 NaN
    }
    std::uniform_real_distribution<float> s(0.001f, 0.01f);
    for (int64_t j = 0; j < n; ++j) in.scale.push_back(s(rng));
  } else {
    const auto w = random_bf16(rng, static_cast<size_t>(n * k), 0.05f);
    in.w.resize(w.size() * 2);
    std::memcpy(in.w.data(), w.data(), in.w.size());
    in.scale.assign(static_cast<size_t>(n), 1.0f);
  }
  in.x = random_bf16(rng, static_cast<size_t>(rows * k), 2.0f);
  in.residual = random_bf16(rng, static_cast<size_t>(rows * n), 1.0f);
  return in;
}

template <typename T>
cuda::DeviceMemory upload(const std::vector<T>& v, cudaStream_t s) {
  auto d = cuda::allocate_device(v.size() * sizeof(T), "test input");
  TFE_CUDA(cudaMemcpyAsync(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return d;
}

// y of one gemv specialization on `in`, as bytes; its weights tiled first where the spec says TILED.
std::vector<uint8_t> run_gemv(const KernelSpec& spec, const Inputs& in, int64_t rows, cudaStream_t s) {
  const TestKernel kernel = load_test_kernel(spec);

  const int64_t n = spec.constant("N");
  const size_t y_bytes = static_cast<size_t>(rows * n) * (spec.constant("EPILOGUE") == kc::kEpilogueF32 ? 4 : 2);
  std::vector<uint8_t> w_bytes = in.w;
  if (spec.constant("TILED")) {
    const int64_t row_bytes = static_cast<int64_t>(in.w.size()) / n;
    tile_rows(in.w.data(), n, row_bytes, w_bytes.data());
  }
  auto w = upload(w_bytes, s), scale = upload(in.scale, s), x = upload(in.x, s), residual = upload(in.residual, s);
  auto y = cuda::allocate_device(y_bytes, "y");
  TFE_CUDA(cudaMemsetAsync(y.data(), 0xFF, y_bytes, s));  // NaN in bf16 and f32
  uint64_t slots[6] = {reinterpret_cast<uint64_t>(w.data()),        reinterpret_cast<uint64_t>(scale.data()),
                       reinterpret_cast<uint64_t>(x.data()),        reinterpret_cast<uint64_t>(y.data()),
                       reinterpret_cast<uint64_t>(residual.data()), static_cast<uint64_t>(rows)};
  const LaunchShape shape = launch_shape(spec, rows);
  TFE_CUDA(cuda::launch_kernel(kernel.kernel, cuda::grid_for_rows(shape, rows), shape, slots, s, false));
  std::vector<uint8_t> out(y_bytes);
  TFE_CUDA(cudaMemcpyAsync(out.data(), y.data(), y_bytes, cudaMemcpyDeviceToHost, s));
  TFE_CUDA(cudaStreamSynchronize(s));
  return out;
}

TFE_GPU_TEST_CASE(
    "gemv: COLS 16 and COLS 32, row-major and tiled weights write the same bits, bf16 and FP8, f32 "
    "and residual outputs") {
  auto stream = cuda::create_stream();
  std::mt19937_64 rng(2026);
  // 1000 = 31 x 32 + 8: the last COLS 32 CTA holds 8 columns. K 512 gives a warp too few steps, so a CTA
  // runs several column tiles (69 of 16 columns, 35 of 32: the last CTA's later tiles lie past N); K 100
  // the same through the direct-load loop (its rows are not a whole number of 16-byte chunks). The last
  // three have tiled forms: 1104 columns at K 512 (several tiles a CTA), 1008 (63 tiles of 16: a narrow
  // output, the direct-load loop) and 2064 at K 4096 (the ring; a partial last COLS 32 CTA).
  struct Shape {
    int64_t k, n;
  };
  for (const Shape& shape : {Shape{2048, 1000}, Shape{512, 1096}, Shape{100, 1096}, Shape{512, 1104}, Shape{1024, 1008},
                             Shape{4096, 2064}}) {
    const int64_t K = shape.k, N = shape.n;
    for (const int64_t weight : {kc::kWeightBF16, kc::kWeightFP8})
      for (const int64_t epilogue : {kc::kEpilogueF32, kc::kEpilogueResidual})
        for (const int64_t rows : {int64_t{16}, int64_t{11}}) {
          CAPTURE(K);
          CAPTURE(weight);
          CAPTURE(epilogue);
          CAPTURE(rows);
          const Inputs in = random_inputs(rng, rows, K, N, weight == kc::kWeightFP8);
          const bool tileable_shape = tileable(N, K * (weight == kc::kWeightFP8 ? 1 : 2));
          std::vector<uint8_t> y[4];
          for (int i = 0; i < (tileable_shape ? 4 : 2); ++i) {
            CAPTURE(i);
            const KernelSpec spec = make_spec("gemv", {{"ROWS", 16},
                                                       {"K", K},
                                                       {"N", N},
                                                       {"WEIGHT", weight},
                                                       {"EPILOGUE", epilogue},
                                                       {"COLS", i % 2 == 0 ? 16 : 32},
                                                       {"TILED", i / 2}});
            y[i] = run_gemv(spec, in, rows, stream.get());
            CHECK(y[i] == y[0]);
          }
          // Every output was written: no NaN left from the fill.
          size_t unwritten = 0;
          if (epilogue == kc::kEpilogueF32) {
            for (size_t e = 0; e < y[1].size(); e += 4) {
              float v;
              std::memcpy(&v, &y[1][e], 4);
              unwritten += v != v;
            }
          } else {
            for (size_t e = 0; e < y[1].size(); e += 2) {
              const unsigned bits = y[1][e] | (y[1][e + 1] << 8);
              unwritten += (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu) != 0;  // bf16 NaN
            }
          }
          CHECK(unwritten == 0);
        }
  }
}

// Every finite e4m3 code through the FP8 gemv, exactly: weight row j holds one code (j % 256, NaN codes
// replaced by +0) at column k = (7 j) % K and zeros elsewhere, x holds signed powers of two from 2^-24 to
// 2^24, and the row scales are random. Each y is then one product, w x exact in fp32, times the scale:
// the CPU's `(w * x) * scale` rounds once as the kernel's must, so y is compared bit for bit. Subnormal
// codes (e = 0), both zeros, 448 and the least subnormal 2^-9 are all in; rows 1 and 11 (one input tile,
// a partial second); COLS 16 and 32, row-major and tiled.
TFE_GPU_TEST_CASE("gemv: every e4m3 code times a power of two, bit for bit against the CPU, FP8 f32 output") {
  auto stream = cuda::create_stream();
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t K = 1024, N = 1024;  // tileable: N a multiple of 16, 1024-byte rows
  Inputs in;
  in.w.assign(static_cast<size_t>(N * K), 0);
  std::vector<uint8_t> code(N);
  for (int64_t j = 0; j < N; ++j) {
    code[j] = static_cast<uint8_t>(j % 256);
    if ((code[j] & 0x7f) == 0x7f) code[j] = 0;  // e4m3 NaN
    in.w[static_cast<size_t>(j * K + (7 * j) % K)] = code[j];
  }
  std::uniform_real_distribution<float> s(0.001f, 10.0f);
  for (int64_t j = 0; j < N; ++j) in.scale.push_back(s(rng));
  std::uniform_int_distribution<int> exponent(-24, 24), sign(0, 1);
  for (const int64_t rows : {int64_t{1}, int64_t{11}}) {
    CAPTURE(rows);
    in.x.resize(static_cast<size_t>(rows * K));
    for (auto& v : in.x) v = float_to_bf16(std::ldexp(sign(rng) ? -1.0f : 1.0f, exponent(rng)));
    in.residual.assign(static_cast<size_t>(rows * N), 0);
    std::vector<float> want(static_cast<size_t>(rows * N));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < N; ++j) {
        const float w = fp8_e4m3_to_float(code[j]);
        const float x = bf16_to_float(in.x[static_cast<size_t>(r * K + (7 * j) % K)]);
        const float sum = 0.0f + w * x;  // the other K - 1 products are +-0; the mma starts from +0
        want[static_cast<size_t>(r * N + j)] = sum * in.scale[static_cast<size_t>(j)];
      }
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      const KernelSpec spec = make_spec("gemv", {{"ROWS", 16},
                                                 {"K", K},
                                                 {"N", N},
                                                 {"WEIGHT", kc::kWeightFP8},
                                                 {"EPILOGUE", kc::kEpilogueF32},
                                                 {"COLS", i % 2 == 0 ? 16 : 32},
                                                 {"TILED", i / 2}});
      const std::vector<uint8_t> y = run_gemv(spec, in, rows, stream.get());
      REQUIRE(y.size() == want.size() * 4);
      size_t differ = 0;
      for (size_t e = 0; e < want.size(); ++e) {
        uint32_t got, expect;
        std::memcpy(&got, &y[4 * e], 4);
        std::memcpy(&expect, &want[e], 4);
        if (got != expect && differ++ < 8)
          MESSAGE(fmt::format("row {} column {} (code 0x{:02x}): got 0x{:08x}, want 0x{:08x}", e / N, e % N,
                              code[e % N], got, expect));
      }
      CHECK(differ == 0);
    }
  }
}

}  // namespace
}  // namespace tfe::test
