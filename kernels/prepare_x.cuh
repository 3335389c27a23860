// The layer input of a row: x[r] = concat(rms_in(embed[tokens[r]]), rms_hidden(g[r])), width 2*HIDDEN,
// embedding first. Grid (2, rows): blockIdx.x 0 normalizes the embedding row, 1 the hidden row, side by
// side (each norm is a latency-bound row reduction, so two CTAs halve the kernel's time).
#pragma once
#include "common.cuh"
#include "rmsnorm.cuh"

namespace tfe {
namespace kernels {

struct PrepareXParams {
  const bf16* embed;        // [vocab, HIDDEN]
  const bf16* input_norm;   // [HIDDEN]
  const bf16* hidden_norm;  // [HIDDEN]
  const int* tokens;        // [rows] target ids
  const bf16* g;            // [rows, HIDDEN]
  bf16* x;                  // [rows, 2 * HIDDEN]
  long long rows;
  F32Slot eps;
};
static_assert(sizeof(PrepareXParams) == 8 * 8, "one 8-byte slot per registry parameter");

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS) prepare_x(const PrepareXParams p) {
  constexpr long long H = Cfg::HIDDEN;
  const bf16* weights = blockIdx.x == 0 ? p.input_norm : p.hidden_norm;
  RmsRow<H, Cfg::THREADS> row;
  row.load_weights(weights);  // before the wait: see RmsRow
  start_after_predecessors();
  __shared__ float scratch[32];
  const long long r = blockIdx.y;
  if (r >= p.rows) return;
  bf16* x = p.x + r * 2 * H;
  if (blockIdx.x == 0)
    row.run(p.embed + static_cast<long long>(p.tokens[r]) * H, weights, x, p.eps.v, scratch);
  else
    row.run(p.g + r * H, weights, x + H, p.eps.v, scratch);
}

}  // namespace kernels
}  // namespace tfe
