// Shared pieces of the GPU tests: the device probe behind every case's skip decorator, random data, and
// comparison helpers with their tolerances stated where they are used.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/registry.h"
#include "device/handles.h"

namespace tfe::test {

// One specialization compiled (through the kernel cache, for the current device's arch) and loaded on its
// own, for the tests that launch a kernel directly; it may launch with its launch shape's dynamic shared
// memory.
struct TestKernel {
  cuda::Library library;
  cudaKernel_t kernel = nullptr;
};
TestKernel load_test_kernel(const KernelSpec& spec);

// True when cudaGetDeviceCount fails or finds no device (probed once, at registration).
bool no_gpu();
// Why (the CUDA error or "0 devices"), for the skip message.
const std::string& no_gpu_reason();

// bf16 bit patterns of values drawn uniformly from [-scale, scale).
std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n, float scale);

// Differences between two bf16 arrays: how many differ by more than one bf16 ulp, and the normalized
// error |a - b|_2 / |b|_2 computed in double.
struct Bf16Diff {
  size_t beyond_one_ulp = 0;
  size_t n = 0;
  double normalized_error = 0;
  size_t first_bad = SIZE_MAX;
};
Bf16Diff compare_bf16(std::span<const uint16_t> got, std::span<const uint16_t> want);

// sqrt(sum (got - want)^2 / sum want^2) in double: the normalized error of fp32 outputs.
double f32_error(std::span<const float> got, std::span<const float> want);

// One top1 partial as the lm_head gemv's top1 epilogue writes it (kernels/common.cuh, Top1Part).
struct Top1Record {
  float max;
  int32_t idx;
  float sum;
  float pad;
};
static_assert(sizeof(Top1Record) == 16, "one 16-byte record per partial");

// The dense vocabulary head's two kernels against reference logits [rows, vocab] (fp32, the CPU's): the
// gemv's partials `parts` [rows, ceil(vocab / cols)] and top1's picks token[r * stride] (target ids:
// draft id + d2t) and conf[r * stride]. Tolerances:
//  - partials, against the same partials of the reference logits: every record written (idx inside its
//    part, pad 0); maxima and sums within normalized error 1e-4 (the logits' own tolerance); idx equal
//    wherever the part's largest logit stands more than 1e-3 (relative) above the next smaller one (logits
//    that are equal on the CPU are equal on the GPU too where they come from equal weight rows, so exact
//    ties must go to the lower id);
//  - the join, on the GPU's own partials: the draft id is their argmax (ties: lower id) exactly, and conf
//    is 1 / sum_p sum_p exp(max_p - M) computed in double within 1e-5 relative (summation order only);
//  - end to end: the draft id equals the reference's wherever the row's largest logit stands more than 1e-3
//    (relative) above the next smaller one, and conf is within 1e-3 relative of the reference's softmax at
//    it (the logits' fp32 error, about 1e-5, enters through exp).
void check_top1(std::span<const float> logits, int64_t rows, int64_t vocab, int64_t cols,
                std::span<const Top1Record> parts, std::span<const int32_t> d2t, std::span<const int32_t> token,
                std::span<const float> conf, int64_t stride);

}  // namespace tfe::test

// A GPU test case: in the test suite "gpu", skipped (and reported as skipped) without a device.
#define TFE_GPU_TEST_CASE(name) TEST_CASE(name* doctest::test_suite("gpu") * doctest::skip(::tfe::test::no_gpu()))
