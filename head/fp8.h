// FP8 e4m3 forms of a head's linears (docs/head.md, "FP8"), and the one place where a head's tensors
// are assembled into a HeadWriter: `random` and `convert` both hand their bf16 tensors here, and the FP8
// form of every linear the header lists is derived from those bf16 bytes, never from a wider source, so
// that a converted and a random head quantize by the same rule.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <tfe/dtype.h>
#include <tfe/head_file.h>
#include <tfe/header.h>
#include "core/numeric.h"

namespace tfe {

// Largest finite e4m3 magnitude: a row's amax maps onto it.
inline constexpr float kFp8E4m3Max = 448.0f;

// The e4m3 form of a bf16 linear [rows, cols] (row-major): q [rows, cols] e4m3 bytes and scale [rows].
struct Fp8Linear {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};

// float_to_fp8_e4m3 (core/numeric.h) computed on the fp32 bits: the same byte for every input (the tests
// sweep every rounding case of every binade), several times faster. quantize_fp8 runs it per weight.
uint8_t float_to_fp8_e4m3_fast(float f);

// scale_j = amax_k |w_jk| / 448 in fp32; 1 where the row is all zero (so that q is all zero, not NaN).
float fp8_row_scale(std::span<const bf16_bits> row);
// q_jk = e4m3(w_jk / scale_j): the division in fp32, then round to nearest even, saturating at +-448.
// Rows are quantized on `threads` threads (0: one per hardware thread); the result does not depend on it.
Fp8Linear quantize_fp8(std::span<const bf16_bits> w, int64_t rows, int64_t cols, int threads = 0);

// Lists every linear the head uses (linears_in_use) in header.fp8, in kLinears order.
void mark_fp8_forms(HeadHeader& h);

// `<l>.fp8` or `<l>.scale`: the tensors assemble_head derives rather than takes.
bool is_fp8_form(const TensorSpec& s);

// One tensor held in memory until the head is assembled.
struct HeadTensor {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// Moves `tensors` (the bf16 and int32 forms, any order) into a writer and adds `<l>.fp8` / `<l>.scale`
// for every linear h.fp8 lists, quantized from its bf16 tensor. File order: wider elements first (each
// tensor then starts at a multiple of its element size), expected_tensors(h) order within a width. Throws
// naming the tensor when one the header expects is missing or one it does not expect is given.
HeadWriter assemble_head(const HeadHeader& h, std::vector<HeadTensor> tensors, int threads = 0);

// Runs fn(begin, end) over [0, n) cut into contiguous chunks, one per thread (0: one per hardware
// thread), and rethrows the first exception a chunk raised. Chunks are a partition of the index range,
// so any per-index computation gives the same result for every thread count.
void parallel_chunks(int64_t n, int threads, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace tfe
