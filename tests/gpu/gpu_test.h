// Shared pieces of the GPU tests: the device probe behind every case's skip decorator, random data, and
// comparison helpers with their tolerances stated where they are used.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "compiler/kernel_registry.h"
#include "runtime/device_handles.h"

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

}  // namespace tfe::test

// A GPU test case: in the test suite "gpu", skipped (and reported as skipped) without a device.
#define TFE_GPU_TEST_CASE(name) \
  TEST_CASE(name * doctest::test_suite("gpu") * doctest::skip(::tfe::test::no_gpu()))
