// Launch shapes of the kernels in kernels/*.cuh. Each case mirrors its kernel's grid mapping; the
// constexpr shape helpers below repeat the ones in the kernel sources (which cannot include host headers),
// and the kernel comments point back here.
#include "compiler/kernel_registry.h"
#include "plan/error.h"

namespace tfe {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// gemv (kernels/gemv.cuh, GemvShape): a CTA owns 16 output columns (for SwiGLU: 16 gate rows and the
// 16 matching up rows) and KSPLIT warps that split K in steps of 4 lanes x one 16-byte weight chunk.
constexpr int64_t kGemvTile = 16;
int64_t gemv_ksplit(int64_t k, int64_t weight) {
  const int64_t step = weight == kc::kWeightFP8 ? 64 : 32;
  const int64_t steps = ceil_div(k, step);
  return steps < 8 ? steps : 8;
}

// ring_attention (kernels/ring_attention.cuh, AttnShape): dynamic shared memory holds the fp32 query
// group, the group's probabilities over the window, and the per-key-group partial outputs.
constexpr int64_t kAttnThreads = 256;
int64_t attention_smem(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window) {
  const int64_t group = heads / kv_heads;
  const int64_t keys = window + 1;
  const int64_t key_groups = kAttnThreads / (head_dim / 2);
  return 4 * (group * head_dim + group * keys + key_groups * group * head_dim);
}

// topk_partial / topk_join (kernels/topk.cuh, kTopkThreads) and rescore_logits (kernels/rescore.cuh,
// kRescoreWarps).
constexpr int64_t kTopkThreads = 512;
constexpr int64_t kRescoreWarps = 4;

}  // namespace

LaunchShape launch_shape(const KernelSpec& spec, int64_t rows) {
  if (rows < 1) fail("launch_shape {}: rows is {}, must be at least 1", spec.uri(), rows);
  LaunchShape s;
  const std::string& k = spec.kernel;
  if (k == "rmsnorm" || k == "prepare_x" || k == "copy_rows") {
    // One CTA per row.
    s.grid[0] = rows;
    s.block = spec.constant("THREADS");
    s.rows_axis = 0;
  } else if (k == "gemv") {
    const int64_t row_tile = spec.constant("ROWS");
    s.grid[0] = ceil_div(spec.constant("N"), kGemvTile);
    s.grid[1] = ceil_div(rows, row_tile);
    s.block = 32 * gemv_ksplit(spec.constant("K"), spec.constant("WEIGHT"));
    s.rows_axis = 1;
    s.rows_per_block = row_tile;
  } else if (k == "qk_rope_kv") {
    // One CTA per row; its warps take the q, k and v heads in turn.
    s.grid[0] = rows;
    s.block = 256;
    s.rows_axis = 0;
  } else if (k == "ring_attention") {
    // One CTA per (kv head, row): the query heads of one GQA group against the window.
    s.grid[0] = spec.constant("KV_HEADS");
    s.grid[1] = rows;
    s.block = kAttnThreads;
    s.smem = attention_smem(spec.constant("HEADS"), spec.constant("KV_HEADS"), spec.constant("HEAD_DIM"),
                            spec.constant("WINDOW"));
    s.rows_axis = 1;
  } else if (k == "top1_partial") {
    s.grid[0] = ceil_div(spec.constant("VOCAB"), spec.constant("CHUNK"));
    s.grid[1] = rows;
    s.block = 256;
    s.rows_axis = 1;
  } else if (k == "top1_join") {
    // One warp per row joins the row's partials.
    s.grid[0] = rows;
    s.block = 32;
    s.rows_axis = 0;
  } else if (k == "topk_partial") {
    // A CTA per (chunk of CHUNK scores, row).
    s.grid[0] = ceil_div(spec.constant("VOCAB"), spec.constant("CHUNK"));
    s.grid[1] = rows;
    s.block = kTopkThreads;
    s.rows_axis = 1;
  } else if (k == "topk_join") {
    s.grid[0] = rows;
    s.block = kTopkThreads;
    s.rows_axis = 0;
  } else if (k == "rescore_logits") {
    // A warp per candidate, kRescoreWarps candidates per CTA.
    s.grid[0] = ceil_div(spec.constant("CAND_K"), kRescoreWarps);
    s.grid[1] = rows;
    s.block = 32 * kRescoreWarps;
    s.rows_axis = 1;
  } else if (k == "rescore_join") {
    // One warp per row.
    s.grid[0] = rows;
    s.block = 32;
    s.rows_axis = 0;
  } else {
    fail("launch_shape: no launch shape for kernel `{}`", k);
  }
  return s;
}

}  // namespace tfe
