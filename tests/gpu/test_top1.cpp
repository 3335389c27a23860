// The dense vocabulary head's two kernels on their own, launched as the runtime launches them: the lm_head
// gemv with the top1 epilogue (per row, one partial of each CTA's COLS logits) and top1's join, on fresh
// random weights, inputs and d2t, against logits computed on the CPU (reference/ops.h,
// linear_f32). check_top1 (gpu_test.h) states the tolerances.
//
// Weight patterns: random rows; every row the same (every logit of a row ties, so the lowest id must win
// in each partial and in the join); rows copied from three (exact ties inside and across partials, with a
// clear winner). Shapes: llama3-8b-eagle3's lm_head at 1 and 16 rows; a column tail at both COLS (N 5000)
// in one and in two row tiles (rows 11 at ROWS 16 and at ROWS 8); a narrow output (N 1000: 16 warps, the
// direct-load loop); a K tail with unaligned rows (K 100). Each case runs twice into records and outputs
// filled with NaN / -1 first: the second run must write the same bits.
#include <algorithm>
#include <cstring>
#include <thread>

#include "kernels/registry.h"
#include "head/fp8.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "device/kernels.h"
#include "reference/ops.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

enum class Pattern { random, equal, three_rows };

struct Head {
  std::vector<uint16_t> w;   // bf16 [N, K]
  std::vector<uint8_t> q;    // FP8 form [N, K]
  std::vector<float> scale;  // [N]
  std::vector<uint16_t> x;   // [rows, K]
  std::vector<int32_t> d2t;  // [N]
};

Head random_head(std::mt19937_64& rng, Pattern pattern, int64_t rows, int64_t k, int64_t n, bool fp8) {
  Head h;
  // |w| < 0.05 and |x| < 2: logits of a few units at K 4096, so the softmax spreads over many ids.
  h.w = random_bf16(rng, static_cast<size_t>(n * k), 0.05f);
  std::uniform_int_distribution<int64_t> pick(0, 2);
  for (int64_t j = 1; j < n; ++j) {
    const int64_t from = pattern == Pattern::equal ? 0 : pattern == Pattern::three_rows && j >= 3 ? pick(rng) : j;
    if (from != j) std::copy_n(h.w.begin() + from * k, k, h.w.begin() + j * k);
  }
  if (fp8) {
    Fp8Linear f = quantize_fp8(h.w, n, k);  // equal rows get equal bytes and scales
    h.q = std::move(f.q);
    h.scale = std::move(f.scale);
  } else {
    h.scale.assign(static_cast<size_t>(n), 1.0f);
  }
  h.x = random_bf16(rng, static_cast<size_t>(rows * k), 2.0f);
  std::uniform_int_distribution<int32_t> offset(0, 1000);
  for (int64_t j = 0; j < n; ++j) h.d2t.push_back(offset(rng));
  return h;
}

template <typename T>
cuda::DeviceMemory upload(const std::vector<T>& v, cudaStream_t s) {
  auto d = cuda::allocate_device(std::max<size_t>(1, v.size() * sizeof(T)), "test input");
  if (!v.empty()) TFE_CUDA(cudaMemcpyAsync(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return d;
}

template <typename T>
std::vector<T> download(const cuda::DeviceMemory& d, size_t count, cudaStream_t s) {
  std::vector<T> v(count);
  TFE_CUDA(cudaMemcpyAsync(v.data(), d.data(), count * sizeof(T), cudaMemcpyDeviceToHost, s));
  TFE_CUDA(cudaStreamSynchronize(s));
  return v;
}

struct Outputs {
  std::vector<Top1Record> parts;
  std::vector<int32_t> token;
  std::vector<float> conf;
};

// The gemv (EPILOGUE top1) and top1 of one (ROWS, COLS) on `h`, `rows` input rows, step 1 of MAX_STEPS 2.
Outputs run_pair(const Head& h, int64_t tile_rows, int64_t rows, int64_t k, int64_t n, int64_t cols, bool fp8,
                 cudaStream_t s) {
  constexpr int64_t kMaxSteps = 2;
  const KernelSpec gemv = make_spec("gemv", {{"ROWS", tile_rows},
                                             {"K", k},
                                             {"N", n},
                                             {"WEIGHT", fp8 ? kc::kWeightFP8 : kc::kWeightBF16},
                                             {"EPILOGUE", kc::kEpilogueTop1},
                                             {"COLS", cols},
                                             {"TILED", 0}});
  const KernelSpec top1 = make_spec("top1", {{"VOCAB", n}, {"COLS", cols}, {"MAX_STEPS", kMaxSteps}});
  const TestKernel gk = load_test_kernel(gemv), tk = load_test_kernel(top1);
  const int64_t n_parts = (n + cols - 1) / cols;
  auto w = fp8 ? upload(h.q, s) : upload(h.w, s);
  auto scale = upload(h.scale, s), x = upload(h.x, s), d2t = upload(h.d2t, s);
  const size_t part_bytes = static_cast<size_t>(rows * n_parts) * sizeof(Top1Record);
  const size_t out_count = static_cast<size_t>(rows * kMaxSteps);
  auto parts = cuda::allocate_device(part_bytes, "top1 partials");
  auto token = cuda::allocate_device(out_count * 4, "out_token");
  auto conf = cuda::allocate_device(out_count * 4, "out_conf");
  auto next = cuda::allocate_device(static_cast<size_t>(rows) * 4, "next_token");
  // NaN in every float, -1 in every int: anything left unwritten shows.
  for (auto* d : {&parts, &token, &conf, &next}) TFE_CUDA(cudaMemsetAsync(d->data(), 0xFF, d->bytes(), s));
  const auto ptr = [](const cuda::DeviceMemory& d) { return reinterpret_cast<uint64_t>(d.data()); };
  uint64_t gemv_slots[6] = {ptr(w), ptr(scale), ptr(x), ptr(parts), 0, static_cast<uint64_t>(rows)};
  uint64_t top1_slots[7] = {ptr(parts), ptr(d2t), ptr(token), ptr(conf), ptr(next), 1, static_cast<uint64_t>(rows)};
  const LaunchShape gs = launch_shape(gemv, rows), ts = launch_shape(top1, rows);
  TFE_CUDA(cuda::launch_kernel(gk.kernel, cuda::grid_for_rows(gs, rows), gs, gemv_slots, s, false));
  TFE_CUDA(cuda::launch_kernel(tk.kernel, cuda::grid_for_rows(ts, rows), ts, top1_slots, s, false));
  Outputs o;
  o.parts = download<Top1Record>(parts, static_cast<size_t>(rows * n_parts), s);
  o.token = download<int32_t>(token, out_count, s);
  o.conf = download<float>(conf, out_count, s);
  const auto next_token = download<int32_t>(next, static_cast<size_t>(rows), s);
  for (int64_t r = 0; r < rows; ++r) {
    CHECK(next_token[static_cast<size_t>(r)] == o.token[static_cast<size_t>(r * kMaxSteps)]);
    CHECK(o.token[static_cast<size_t>(r * kMaxSteps + 1)] == -1);  // step 2's column is left alone
  }
  return o;
}

bool same_bits(const Outputs& a, const Outputs& b) {
  return a.parts.size() == b.parts.size() &&
         std::memcmp(a.parts.data(), b.parts.data(), a.parts.size() * sizeof(Top1Record)) == 0 && a.token == b.token &&
         std::memcmp(a.conf.data(), b.conf.data(), a.conf.size() * sizeof(float)) == 0;
}

struct Case {
  int64_t k, n, tile_rows, rows;
  std::vector<Pattern> patterns;
};

TFE_GPU_TEST_CASE(
    "top1: the lm_head gemv's partials and their join against CPU logits, bf16 and FP8, COLS 16 "
    "and 32, random and tied weight rows, run twice") {
  auto stream = cuda::create_stream();
  std::mt19937_64 rng(3131);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<Pattern> all = {Pattern::random, Pattern::equal, Pattern::three_rows};
  const std::vector<Case> cases = {
      {4096, 32000, 1, 1, {Pattern::random}},
      {4096, 32000, 16, 16, {Pattern::random, Pattern::three_rows}},
      {2048, 5000, 16, 11, all},
      {2048, 5000, 8, 11, all},
      {2048, 1000, 4, 3, all},
      // A short K: a CTA runs several column tiles (2 in bf16, 4 in FP8 at K 512; 4 and 8 at K 256), and
      // the last CTA's tiles past N write no record.
      {512, 2000, 4, 3, all},
      {256, 1300, 16, 16, {Pattern::random}},
      {100, 1300, 4, 3, {Pattern::random}},  // rows not 16-byte aligned: the direct-load loop, 8 tiles a CTA
      {100, 300, 2, 2, all},
  };
  for (const Case& c : cases)
    for (const Pattern pattern : c.patterns)
      for (const bool fp8 : {false, true}) {
        CAPTURE(c.k);
        CAPTURE(c.n);
        CAPTURE(c.tile_rows);
        CAPTURE(c.rows);
        CAPTURE(static_cast<int>(pattern));
        CAPTURE(fp8);
        const Head h = random_head(rng, pattern, c.rows, c.k, c.n, fp8);
        const ref::Linear lin =
            fp8 ? ref::Linear::fp8("lm_head", h.q, h.scale, c.n, c.k) : ref::Linear::bf16("lm_head", h.w, c.n, c.k);
        std::vector<float> logits(static_cast<size_t>(c.rows * c.n));
        ref::linear_f32(lin, h.x, logits, threads);
        for (const int64_t cols : {int64_t{16}, int64_t{32}}) {
          CAPTURE(cols);
          const Outputs first = run_pair(h, c.tile_rows, c.rows, c.k, c.n, cols, fp8, stream.get());
          check_top1(logits, c.rows, c.n, cols, first.parts, h.d2t, first.token, first.conf, 2);
          CHECK(same_bits(first, run_pair(h, c.tile_rows, c.rows, c.k, c.n, cols, fp8, stream.get())));
        }
      }
}

}  // namespace
}  // namespace tfe::test
