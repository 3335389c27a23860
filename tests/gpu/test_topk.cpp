// topk against the reference on score rows made to reach every path of its bound and radix select:
// random scores; ascending ones (every large key in the last CTAs of the cluster, the bound far below
// them); equal and few-valued scores (ties across CTAs and within a radix bucket, which the early exit
// takes whole; a bound equal to the largest key); signed zeros (which must tie); scores that differ in
// their lowest 11 bits only (a first digit below bit 8, so the next overlaps it); and one peak of equal
// scores every 97 positions over low noise (keys equal to the bound taken, ties to the lower id).
// Shapes: the planner's split (8 CTAs at 32000 scores; 16 and 32 keys a thread in registers at 65536 and
// 131072), keys read from the scores (262144 over 8 CTAs, 40000 over one, as below sm_90), scalar loads
// (a vocabulary not a multiple of four; one key a thread), CTAs past the vocabulary, CAND_K 1 and the
// planner's largest, 512. The selection is exact (no arithmetic on the scores), so the candidates must
// equal the reference's, ties to the lower id included. Each shape runs twice on the same rows: nothing
// of a pass may be left for the next.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "kernels/registry.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "device/kernels.h"
#include "reference/ops.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

enum class Pattern { random, ascending, equal, few_values, signed_zeros, low_bits, peaks };

std::vector<float> score_row(std::mt19937_64& rng, Pattern pattern, int64_t vocab) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> three(0, 2);
  for (int64_t i = 0; i < vocab; ++i) {
    float& v = row[static_cast<size_t>(i)];
    switch (pattern) {
      case Pattern::random:
        v = normal(rng);
        break;
      case Pattern::ascending:
        v = 0.001f * static_cast<float>(i);
        break;
      case Pattern::equal:
        v = 1.5f;
        break;
      case Pattern::few_values:
        v = static_cast<float>(three(rng));
        break;
      case Pattern::signed_zeros:
        v = three(rng) == 0 ? -0.0f : three(rng) == 1 ? 0.0f : -1.0f;
        break;
      case Pattern::peaks:
        v = i % 97 == 0 ? 5.0f : normal(rng) - 10.0f;
        break;
      case Pattern::low_bits: {
        const uint32_t bits = 0x3f800000u | static_cast<uint32_t>(rng() & 0x7ffu);  // 1.0 plus 0 .. 2047 ulps
        std::memcpy(&v, &bits, 4);
        break;
      }
    }
  }
  return row;
}

// cand [rows, CAND_K] of one topk specialization on `scores` [rows, VOCAB], launched `passes` times.
std::vector<std::vector<int32_t>> run_topk(const KernelSpec& spec, const std::vector<float>& scores, int64_t rows,
                                           int passes, cudaStream_t s) {
  const TestKernel kernel = load_test_kernel(spec);

  const int64_t k = spec.constant("CAND_K");
  auto d_scores = cuda::allocate_device(scores.size() * 4, "scores");
  auto cand = cuda::allocate_device(static_cast<size_t>(rows * k) * 4, "cand");
  TFE_CUDA(cudaMemcpyAsync(d_scores.data(), scores.data(), scores.size() * 4, cudaMemcpyHostToDevice, s));
  uint64_t slots[3] = {reinterpret_cast<uint64_t>(d_scores.data()), reinterpret_cast<uint64_t>(cand.data()),
                       static_cast<uint64_t>(rows)};
  const LaunchShape shape = launch_shape(spec, rows);
  std::vector<std::vector<int32_t>> out;
  for (int pass = 0; pass < passes; ++pass) {
    TFE_CUDA(cudaMemsetAsync(cand.data(), 0xFF, static_cast<size_t>(rows * k) * 4, s));  // -1: unwritten
    TFE_CUDA(cuda::launch_kernel(kernel.kernel, cuda::grid_for_rows(shape, rows), shape, slots, s, false));
    std::vector<int32_t> got(static_cast<size_t>(rows * k));
    TFE_CUDA(cudaMemcpyAsync(got.data(), cand.data(), got.size() * 4, cudaMemcpyDeviceToHost, s));
    TFE_CUDA(cudaStreamSynchronize(s));
    out.push_back(std::move(got));
  }
  return out;
}

TFE_GPU_TEST_CASE("topk: equals the reference on random, ascending, tied and signed-zero scores, run twice") {
  auto stream = cuda::create_stream();
  std::mt19937_64 rng(4242);
  const std::vector<Pattern> patterns = {Pattern::random,       Pattern::ascending, Pattern::equal, Pattern::few_values,
                                         Pattern::signed_zeros, Pattern::low_bits,  Pattern::peaks, Pattern::random};
  const int64_t rows = static_cast<int64_t>(patterns.size());
  // (vocab, cand_k, split): tfe-two-stage's first.
  for (const auto& [vocab, k, split] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32000, 64, 8},
                                                                                          {32000, 512, 8},
                                                                                          {65536, 512, 8},
                                                                                          {131072, 512, 8},
                                                                                          {262144, 512, 8},
                                                                                          {40000, 64, 1},
                                                                                          {5001, 300, 2},
                                                                                          {1000, 300, 8},
                                                                                          {300, 16, 1},
                                                                                          {5000, 1, 2}}) {
    CAPTURE(vocab);
    CAPTURE(k);
    CAPTURE(split);
    std::vector<float> scores;
    for (const Pattern p : patterns) {
      const auto row = score_row(rng, p, vocab);
      scores.insert(scores.end(), row.begin(), row.end());
    }
    const KernelSpec spec = make_spec("topk", {{"VOCAB", vocab}, {"CAND_K", k}, {"SPLIT", split}});
    const auto passes = run_topk(spec, scores, rows, 2, stream.get());
    for (int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      std::vector<int32_t> want =
          ref::topk(std::span<const float>(scores).subspan(static_cast<size_t>(r * vocab), static_cast<size_t>(vocab)),
                    static_cast<int>(k));
      std::sort(want.begin(), want.end());
      for (const auto& got : passes) {
        const std::vector<int32_t> row(got.begin() + r * k, got.begin() + (r + 1) * k);
        CHECK(row == want);
      }
    }
  }
}

}  // namespace
}  // namespace tfe::test
