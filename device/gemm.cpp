#include "device/gemm.h"

#include <bit>

#include "core/error.h"

namespace tfe::cuda {

namespace {

// Largest power of two (up to 256) that divides the address: the alignment cuBLASLt may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(low >= 256 ? 256 : low);
}

MatrixLayout bf16_layout(int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  TFE_CUBLASLT(
      cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  return MatrixLayout(l);
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  TFE_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

}  // namespace

GemmRunner::GemmRunner(std::byte* workspace, size_t workspace_bytes)
    : handle_(create_cublaslt()), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  cublasLtMatmulDesc_t d = nullptr;
  TFE_CUBLASLT(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  desc_ = MatmulDesc(d);
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  TFE_CUBLASLT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  TFE_CUBLASLT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
}

int GemmRunner::add(GemmOperands op) {
  if (!handle_) fail("gemm {}: the GEMM runner was not set up", op.name);
  if (op.n < 1 || op.k < 1 || op.ldx < op.k || op.ldy < op.n || op.max_rows < 1)
    fail("gemm {}: n {} k {} ldx {} ldy {} max_rows {}: need n, k >= 1, ldx >= k, ldy >= n", op.name, op.n, op.k,
         op.ldx, op.ldy, op.max_rows);
  Entry e;
  e.a = bf16_layout(op.k, op.n, op.k);
  cublasLtMatmulPreference_t p = nullptr;
  TFE_CUBLASLT(cublasLtMatmulPreferenceCreate(&p));
  e.preference = MatmulPreference(p);
  set_preference<uint64_t>(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes_);
  set_preference<uint32_t>(p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                           static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  set_preference<uint32_t>(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(op.w));
  set_preference<uint32_t>(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(op.x));
  set_preference<uint32_t>(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(op.y));
  set_preference<uint32_t>(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(op.y));
  e.op = std::move(op);
  gemms_.push_back(std::move(e));
  return static_cast<int>(gemms_.size()) - 1;
}

GemmRunner::Config& GemmRunner::config(int id, int64_t rows) {
  Entry& e = gemms_.at(static_cast<size_t>(id));
  if (rows < 1 || rows > e.op.max_rows)
    fail("gemm {}: {} rows asked, its buffers hold 1..{}", e.op.name, rows, e.op.max_rows);
  if (auto it = e.by_rows.find(rows); it != e.by_rows.end()) return it->second;
  Config c;
  c.b = bf16_layout(e.op.k, rows, e.op.ldx);
  c.c = bf16_layout(e.op.n, rows, e.op.ldy);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  TFE_CUBLASLT(cublasLtMatmulAlgoGetHeuristic(handle_.get(), desc_.get(), e.a.get(), c.b.get(), c.c.get(), c.c.get(),
                                              e.preference.get(), 1, &result, &found));
  if (found < 1)
    fail("gemm {}: cuBLASLt has no algorithm for y[{}, {}] = x[{}, {}] w^T in bf16 with {} bytes of workspace",
         e.op.name, rows, e.op.n, rows, e.op.k, workspace_bytes_);
  c.algo = result.algo;
  return e.by_rows.emplace(rows, std::move(c)).first->second;
}

void GemmRunner::prepare(int id, int64_t rows) { (void)config(id, rows); }

void GemmRunner::run(int id, int64_t rows, cudaStream_t stream) {
  Config& c = config(id, rows);
  const GemmOperands& op = gemms_[static_cast<size_t>(id)].op;
  const float alpha = 1.0f, beta = 0.0f;
  TFE_CUBLASLT(cublasLtMatmul(handle_.get(), desc_.get(), &alpha, op.w, gemms_[static_cast<size_t>(id)].a.get(), op.x,
                              c.b.get(), &beta, op.y, c.c.get(), op.y, c.c.get(), &c.algo, workspace_, workspace_bytes_,
                              stream));
}

size_t GemmRunner::configs() const {
  size_t n = 0;
  for (const auto& e : gemms_) n += e.by_rows.size();
  return n;
}

}  // namespace tfe::cuda
