// cuBLASLt GEMMs of a plan: y[rows, n] = x[rows, k] . w[n, k]^T, bf16 in and out, fp32 compute
// (CUBLAS_COMPUTE_32F: no TF32, no reduced-precision reductions), one fixed workspace.
//
// cuBLASLt is column-major. The row-major w[n, k] is the column-major k x n matrix W (ld k), x[rows, k]
// is X (k x rows, ld k) and y[rows, n] is Y (n x rows, ld n), so y = x w^T is Y = W^T X: A = W with
// transa = T, B = X, m = n, n = rows.
//
// The algorithm of a GEMM depends on its row count, so each (GEMM, rows) gets its own layouts and
// heuristic choice, made once and kept: the same rows always run the same algorithm, which keeps a
// graph replay equal to an eager pass bit for bit. Only split-K schemes that reduce in fp32 are allowed
// (in-place and output-type reductions would sum partials in bf16).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "device/handles.h"

namespace tfe::cuda {

struct GemmOperands {
  std::string name;  // the plan node, for errors
  const void* w = nullptr;
  const void* x = nullptr;
  void* y = nullptr;
  int64_t n = 0, k = 0;
  int64_t ldx = 0, ldy = 0;  // row strides of x and y in elements (>= k, >= n)
  int64_t max_rows = 0;      // rows the x and y buffers hold
};

class GemmRunner {
 public:
  GemmRunner() = default;
  GemmRunner(std::byte* workspace, size_t workspace_bytes);

  // Registers a GEMM; returns its id. Pointers are fixed from here on.
  int add(GemmOperands op);
  // Chooses the algorithm for `rows` now (open time), so that the first pass does not pay for it.
  void prepare(int id, int64_t rows);
  // Enqueues the GEMM for `rows` rows on `stream` (capturable: no allocation, no synchronization).
  void run(int id, int64_t rows, cudaStream_t stream);

  size_t configs() const;  // (GEMM, rows) pairs prepared so far

 private:
  struct Config {
    MatrixLayout b, c;
    cublasLtMatmulAlgo_t algo{};
  };
  struct Entry {
    GemmOperands op;
    MatrixLayout a;
    MatmulPreference preference;
    std::map<int64_t, Config> by_rows;
  };
  Config& config(int id, int64_t rows);

  CublasLt handle_;
  MatmulDesc desc_;
  std::byte* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<Entry> gemms_;
};

}  // namespace tfe::cuda
