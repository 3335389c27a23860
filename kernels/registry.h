// The kernels tfe can specialize: for each, its source in kernels/, the template it instantiates, the
// compile-time constants a specialization fixes, and the launch parameters in order.
//
// Every kernel takes one parameter: a struct of 8-byte slots in the order listed here (pointers, int64,
// or an f32 in the low half of its slot). The planner binds each slot by name; the runtime packs them.
// This table and the structs in kernels/*.cuh must agree; tests/test_kernels_compile.cpp checks it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tfe {

enum class ParamKind : uint8_t { ptr, i64, f32 };
std::string_view param_kind_name(ParamKind k);

struct KernelParam {
  std::string name;
  ParamKind kind;
};

struct KernelDef {
  std::string name;      // registry name, e.g. "gemv"
  std::string source;    // file under kernels/, e.g. "gemv.cuh"
  std::string function;  // template, e.g. "tfe::kernels::gemv"; instantiated as function<Config>
  std::vector<std::string> constants;  // names of the config's constexpr int64 members, in order
  std::vector<KernelParam> params;     // the parameter struct's slots, in order
};

const std::vector<KernelDef>& kernel_defs();
const KernelDef& kernel_def(std::string_view name);  // throws tfe::Error for an unknown kernel

// A specialization: a kernel with every constant fixed.
struct KernelSpec {
  std::string kernel;
  std::vector<std::pair<std::string, int64_t>> constants;  // in the KernelDef's order
  int64_t constant(std::string_view name) const;
  // Readable, unique id: "<kernel>__<const>_<value>__..." (lower-case constant names).
  std::string uri() const;
  bool operator==(const KernelSpec&) const = default;
};
// Builds a spec, checking that exactly the kernel's constants are given.
KernelSpec make_spec(std::string_view kernel, std::vector<std::pair<std::string, int64_t>> constants);

// Launch shape of a specialization for `rows` rows (the grid may depend on rows; block and shared
// memory do not).
struct LaunchShape {
  int64_t grid[3] = {1, 1, 1};
  int64_t block = 128;
  int64_t smem = 0;
  int rows_axis = -1;           // grid axis that scales with rows (-1: none)
  int64_t rows_per_block = 1;   // rows covered by one step along rows_axis
  bool operator==(const LaunchShape&) const = default;
};
LaunchShape launch_shape(const KernelSpec& spec, int64_t rows);
// A gemv, gemv_cluster or gemv_rope_kv spec as the gemv spec of its GEMV (gemv_cluster: without CSPLIT;
// gemv_rope_kv: N = (HEADS + 2 KV_HEADS) x HEAD_DIM, EPILOGUE bf16): its block, tiles and columns are that
// spec's (gemv_cluster's grid.x is CSPLIT times its).
KernelSpec gemv_equivalent(const KernelSpec& spec);
// gemv, gemv_cluster, gemv_rope_kv: the column tiles one CTA runs (kernels/gemv.cuh GemvShape::TILES): 1, or
// more where K is too short to give each of a tile's warps 4 steps.
int64_t gemv_tiles_per_cta(const KernelSpec& spec);
// The most CTAs a column tile of this GEMV's shape may split its K over as gemv_cluster: every warp of the
// cluster at least one K step, for a narrow output (GemvShape::NARROW); 1 where the shape is not narrow.
int64_t gemv_cluster_split_limit(const KernelSpec& spec);

// What a launch of a specialization for `rows` rows may touch through each pointer parameter: bytes from
// the argument's offset (0: the parameter is not read, and may be null). Operands addressed through an id
// rather than by row are sized by the id's domain. Plan validation checks every argument against it, so
// that a plan whose buffers are smaller than its kernels reach is refused before a launch.
struct Reach {
  int64_t rows = 0;         // the launch's rows: a bucket's streams, or the most rows or slots a chunk takes
  int64_t slots = 0;        // slot ids (ring_k, ring_v, slot_g rows): max_slots + 1, with the scratch slot
  int64_t vocab = 0;        // target ids (embed, target_head rows)
  int64_t draft_vocab = 0;  // draft ids (d2t entries)
  std::function<int64_t(std::string_view)> i64;          // an i64 argument's value (rmsnorm's strides)
  std::function<int64_t(std::string_view)> index_rows;   // copy_rows: ids an index argument may hold (0: null)
};
int64_t param_reach(const KernelSpec& spec, std::string_view param, const Reach& r);
// The alignment in bytes that a kernel's loads through a pointer parameter need of the argument's address
// (buffer offset + byte_offset; every arena's base is at least 256-byte aligned): 1 where the kernel
// checks at run time or loads bytewise. Plan validation refuses an argument that breaks it.
int64_t param_alignment(const KernelSpec& spec, std::string_view param);

// Values of the kernels' enumerated constants (mirrored in kernels/common.cuh).
namespace kc {
inline constexpr int64_t kWeightBF16 = 0, kWeightFP8 = 1;
inline constexpr int64_t kEpilogueBF16 = 0,      // y = bf16(acc)
    kEpilogueF32 = 1,                             // y = acc (fp32 logits / scores)
    kEpilogueResidual = 2,                        // y = bf16(residual + acc): the add rounded once
    kEpilogueSwiGLU = 3,                          // rows j and N+j of w: y = bf16(bf16(silu(gate)) * up)
    kEpilogueTop1 = 4;                            // y = per row, one top1 partial of the CTA's COLS columns
inline constexpr int64_t kTop1PartBytes = 16;     // one top1 partial (kernels/common.cuh Top1Part)
inline constexpr int64_t kHostTableColumns = 4;   // a host_tables row: slot, pos, first_pos, tok (load_tables.cuh)
}  // namespace kc

}  // namespace tfe
