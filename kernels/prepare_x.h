// prepare_x's description (kernels/kernel_def.h); the kernel is kernels/prepare_x.cuh.
#pragma once
#include "kernels/kernel_def.h"

namespace tfe::kernel_desc {

// prepare_x's specialization constants, in its config's order.
TFE_KERNEL_CONSTANTS(PrepareXConstants, "prepare_x", HIDDEN, THREADS);

// x[r] = concat(rms_in(embed[tokens[r]]), rms_hidden(g[r])): the layer input of width 2H. Two CTAs of
// THREADS per row: the embedding's norm and the hidden row's norm.
inline KernelDef prepare_x() {
  const ReachFn norm = [](const KernelSpec& s, const Reach&) { return product({s.constant("HIDDEN"), kBf16}); };
  return {
      .name = "prepare_x",
      .source = "prepare_x.cuh",
      .function = "tfe::kernels::prepare_x",
      .constants = PrepareXConstants::names(),
      .params = {weights(in("embed", DType::BF16,
                            [](const KernelSpec& s, const Reach& r) {
                              return product({r.vocab, s.constant("HIDDEN"), kBf16});
                            })),
                 weights(in("input_norm", DType::BF16, norm)), weights(in("hidden_norm", DType::BF16, norm)),
                 in("tokens", DType::I32,
                    [](const KernelSpec&, const Reach& r) {
                      return product({r.rows, kI32});
                    }),
                 in("g", DType::BF16,
                    [](const KernelSpec& s, const Reach& r) {
                      return product({r.rows, s.constant("HIDDEN"), kBf16});
                    }),
                 out("x", DType::BF16,
                     [](const KernelSpec& s, const Reach& r) {
                       return product({r.rows, 2, s.constant("HIDDEN"), kBf16});
                     }),
                 i64("rows"), f32("eps")},
      .launch =
          [](const KernelSpec& s, int64_t rows) {
            return LaunchShape{.grid = {2, rows, 1}, .block = s.constant("THREADS"), .rows_axis = 1};
          },
  };
}

}  // namespace tfe::kernel_desc
