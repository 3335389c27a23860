// What a kernel is to the host: its description (KernelDef), a specialization of it (KernelSpec), and the
// registry's functions over them. Each kernel's description is written once, in kernels/<kernel>.h: its
// source and template, its constants, its parameters in the order of its Params struct (kind, direction,
// what a launch may reach through each pointer), and its launch shape. The registry
// (kernels/registry.cpp), plan validation, the planner and the runtime's packing all read it from there;
// tests/test_kernels_compile.cpp checks it against the kernels through NVRTC.
//
// Every kernel takes one parameter: a struct of 8-byte slots in the order listed (pointers, int64, or an
// f32 in the low half of its slot). The planner binds each slot by name; the runtime packs them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/constants.h"
#include <tfe/dtype.h>

namespace tfe {

enum class ParamKind : uint8_t { ptr, i64, f32 };
std::string_view param_kind_name(ParamKind k);

// Where a plan's buffer lives and what it is for (plan/plan.h's Buffer::role); a kernel's description
// states which of them each pointer parameter may bind.
enum class BufferRole : uint8_t {
  weight,      // uploaded once at open (weights arena)
  state,       // per slot, leading dim = max_slots + 1 (the last is the scratch slot)
  table,       // an extend chunk's inputs, uploaded from the host before it, inside the tables region
  activation,  // written and read within a pass
  output,      // a pass's results, on the device (Runtime::device_outputs)
  input,       // an enqueued draft's slot ids, written on the caller's stream before the pass
  host,        // in the host arena: mapped pinned host memory that the draft pass's kernels read and write
};
std::string_view buffer_role_name(BufferRole r);

// A set of buffer roles, one bit a role.
using BufferRoles = uint8_t;
constexpr BufferRoles role_bit(BufferRole r) { return static_cast<BufferRoles>(1u << static_cast<unsigned>(r)); }
// The device arena's roles: what a pass reads and writes on the device, a weight or host memory excepted.
inline constexpr BufferRoles kArenaRoles = role_bit(BufferRole::state) | role_bit(BufferRole::table) |
                                           role_bit(BufferRole::activation) | role_bit(BufferRole::output);
// The roles of a set in words: "weight", "state or output", "state, table, activation or output".
std::string buffer_roles_name(BufferRoles roles);

// A specialization: a kernel with every constant fixed.
struct KernelSpec {
  std::string kernel;
  std::vector<std::pair<std::string, int64_t>> constants;  // in the KernelDef's order
  int64_t constant(std::string_view name) const;
  // Readable, unique id: "<kernel>__<const>_<value>__..." (lower-case constant names).
  std::string uri() const;
  bool operator==(const KernelSpec&) const = default;
};

// Launch shape of a specialization for `rows` rows (the grid may depend on rows; block and shared
// memory do not).
struct LaunchShape {
  int64_t grid[3] = {1, 1, 1};
  int64_t block = 128;
  int64_t smem = 0;
  int rows_axis = -1;          // grid axis that scales with rows (-1: none)
  int64_t rows_per_block = 1;  // rows covered by one step along rows_axis
  bool operator==(const LaunchShape&) const = default;
};

// What a launch of a specialization for `rows` rows may touch through each pointer parameter: bytes from
// the argument's offset (0: the parameter is not read, and may be null). Operands addressed through an id
// rather than by row are sized by the id's domain. Plan validation checks every argument against it, so
// that a plan whose buffers are smaller than its kernels reach is refused before a launch.
struct Reach {
  int64_t rows = 0;         // the launch's rows: a bucket's streams, or the most rows or slots a chunk takes
  int64_t slots = 0;        // slot ids (ring_k, ring_v, slot_g rows): max_slots + 1, with the scratch slot
  int64_t vocab = 0;        // target ids (embed, target_head rows)
  int64_t draft_vocab = 0;  // draft ids (d2t entries)
  std::function<int64_t(std::string_view)> i64;         // an i64 argument's value (rmsnorm's strides)
  std::function<int64_t(std::string_view)> index_rows;  // copy_rows: ids an index argument may hold (0: null)
};

// Bytes a launch of `spec` may touch through a pointer parameter (products saturate at INT64_MAX).
using ReachFn = std::function<int64_t(const KernelSpec& spec, const Reach& r)>;
// The element type a pointer parameter's buffer must have under `spec` (gemv's w: bf16 or e4m3 by WEIGHT).
using DTypeFn = std::function<DType(const KernelSpec& spec)>;

struct KernelParam {
  std::string name;
  ParamKind kind = ParamKind::ptr;
  bool writes = false;      // ptr: the kernel writes through it (and may read it too); every other is only read
  ReachFn reach = nullptr;  // ptr: what a launch may touch through it
  DTypeFn dtype = nullptr;  // ptr: the element type of the buffer it binds
  // ptr: the roles the buffer it binds may have. Plan validation refuses a buffer of another dtype or role:
  // a kernel that reads a weight as its x, or an e4m3 matrix as bf16, would run on bytes of another meaning.
  BufferRoles roles = kArenaRoles;
  // ptr: the alignment in bytes that the kernel's loads need of the argument's address (buffer offset +
  // byte_offset; every arena's base is at least 256-byte aligned): 1 where the kernel checks at run time
  // or loads bytewise.
  int64_t alignment = 1;
};

struct KernelDef {
  std::string name;                    // registry name, e.g. "gemv"
  std::string source;                  // file under kernels/, e.g. "gemv.cuh"
  std::string function;                // template, e.g. "tfe::kernels::gemv"; instantiated as function<Config>
  std::vector<std::string> constants;  // names of the config's constexpr int64 members, in order
  std::vector<KernelParam> params;     // the parameter struct's slots, in order
  std::function<LaunchShape(const KernelSpec& spec, int64_t rows)> launch = nullptr;  // rows >= 1
};

// The registry (kernels/registry.cpp): every kernel's description, in a fixed order.
const std::vector<KernelDef>& kernel_defs();
const KernelDef& kernel_def(std::string_view name);  // throws tfe::Error for an unknown kernel

// Builds a spec, checking that exactly the kernel's constants are given.
KernelSpec make_spec(std::string_view kernel, std::vector<std::pair<std::string, int64_t>> constants);

// The description's launch shape; throws for rows < 1 and for a shape the kernel cannot run.
LaunchShape launch_shape(const KernelSpec& spec, int64_t rows);
// The description's reach of a pointer parameter; throws for a name that is not one.
int64_t param_reach(const KernelSpec& spec, std::string_view param, const Reach& r);
// The description's alignment of a pointer parameter (plan validation refuses an argument that breaks it).
int64_t param_alignment(const KernelSpec& spec, std::string_view param);
// The description's element type and roles of a pointer parameter (plan validation refuses an argument
// bound to a buffer of another dtype or role).
DType param_dtype(const KernelSpec& spec, std::string_view param);
BufferRoles param_roles(const KernelSpec& spec, std::string_view param);
// Whether kernel `kernel` writes through its parameter `param` (false for a name it does not have): plan
// validation refuses a node that writes a weight, and the tests' data-flow checks follow it.
bool param_writes(std::string_view kernel, std::string_view param);

// The vocabulary of the descriptions in kernels/<kernel>.h.
namespace kernel_desc {

inline constexpr int64_t kBf16 = 2, kF32 = 4, kI32 = 4;  // element bytes

// The product of non-negative factors, saturating at INT64_MAX: a reach past any buffer then fails the
// size check it feeds instead of wrapping around.
int64_t product(std::initializer_list<int64_t> factors);
int64_t saturating_add(int64_t a, int64_t b);

// One element type whatever the spec.
inline DTypeFn same(DType t) {
  return [t](const KernelSpec&) { return t; };
}

// Parameters: a pointer the kernel only reads, one it writes (each binding a buffer of the device arena
// unless weights(), state(), output() or host() says otherwise), and the scalars.
inline KernelParam in(std::string name, DTypeFn dtype, ReachFn reach, int64_t alignment = 1) {
  return {.name = std::move(name),
          .kind = ParamKind::ptr,
          .reach = std::move(reach),
          .dtype = std::move(dtype),
          .alignment = alignment};
}
inline KernelParam in(std::string name, DType dtype, ReachFn reach, int64_t alignment = 1) {
  return in(std::move(name), same(dtype), std::move(reach), alignment);
}
inline KernelParam out(std::string name, DTypeFn dtype, ReachFn reach) {
  return {.name = std::move(name),
          .kind = ParamKind::ptr,
          .writes = true,
          .reach = std::move(reach),
          .dtype = std::move(dtype)};
}
inline KernelParam out(std::string name, DType dtype, ReachFn reach) {
  return out(std::move(name), same(dtype), std::move(reach));
}
inline KernelParam i64(std::string name) { return {.name = std::move(name), .kind = ParamKind::i64}; }
inline KernelParam f32(std::string name) { return {.name = std::move(name), .kind = ParamKind::f32}; }

// A pointer parameter that binds a buffer of one role only: a weight, a slot's state, a pass's outputs,
// the host arena.
inline KernelParam bound_to(BufferRole role, KernelParam p) {
  p.roles = role_bit(role);
  return p;
}
// One that binds a buffer of any of `roles` (load_tables' ids: the host arena's or draft_slots).
inline KernelParam bound_to_any(BufferRoles roles, KernelParam p) {
  p.roles = roles;
  return p;
}
inline KernelParam weights(KernelParam p) { return bound_to(BufferRole::weight, std::move(p)); }
inline KernelParam state(KernelParam p) { return bound_to(BufferRole::state, std::move(p)); }
inline KernelParam output(KernelParam p) { return bound_to(BufferRole::output, std::move(p)); }
inline KernelParam host(KernelParam p) { return bound_to(BufferRole::host, std::move(p)); }

// One specialization constant of a kernel's constants struct (TFE_KERNEL_CONSTANTS): unset until given.
class Constant {
 public:
  Constant() = default;
  Constant(int64_t v) : value_(v), set_(true) {}  // NOLINT(google-explicit-constructor): set by designation
  operator int64_t() const { return value_; }     // NOLINT(google-explicit-constructor)
  bool set() const { return set_; }

 private:
  int64_t value_ = 0;
  bool set_ = false;
};

// The names of a constants struct's members, from their declaration's text ("VOCAB, CAND_K, SPLIT").
std::vector<std::string> constant_names(std::string_view declared);
// The spec of `kernel` with the constants `declared` names, in order; throws naming a constant left unset.
KernelSpec constants_spec(std::string_view kernel, std::string_view declared, std::initializer_list<Constant> values);
// The values of `spec`'s constants, which must be those `declared` names, in order.
std::vector<int64_t> constants_of(const KernelSpec& spec, std::string_view kernel, std::string_view declared);

}  // namespace kernel_desc

}  // namespace tfe

// Declares NAME, a kernel's specialization constants as a struct, beside its description in
// kernels/<kernel>.h: each constant is written once, as a member, in the order of the kernel's config.
// The description lists them (`NAME::names()`), the planner and the tests set them by name and read them
// back typed:
//   TFE_KERNEL_CONSTANTS(TopkConstants, "topk", VOCAB, CAND_K, SPLIT);
//   KernelSpec s = TopkConstants{.VOCAB = 32000, .CAND_K = 64, .SPLIT = 8}.spec();
//   int64_t k = TopkConstants::of(s).CAND_K;
// A constant left out of a designation is a compile error (-Wmissing-field-initializers), and one never
// set is refused by spec(), by name.
#define TFE_KERNEL_CONSTANTS(NAME, KERNEL, ...)                                                                    \
  struct NAME {                                                                                                    \
    static constexpr std::string_view kernel = KERNEL;                                                             \
    static constexpr std::string_view declared = #__VA_ARGS__;                                                     \
    __VA_OPT__(::tfe::kernel_desc::Constant __VA_ARGS__;)                                                          \
    static std::vector<std::string> names() { return ::tfe::kernel_desc::constant_names(declared); }               \
    ::tfe::KernelSpec spec() const { return ::tfe::kernel_desc::constants_spec(kernel, declared, {__VA_ARGS__}); } \
    auto members() { return std::tie(__VA_ARGS__); }                                                               \
    static NAME of(const ::tfe::KernelSpec& s) {                                                                   \
      NAME c;                                                                                                      \
      [[maybe_unused]] const auto values = ::tfe::kernel_desc::constants_of(s, kernel, declared);                  \
      [[maybe_unused]] size_t i = 0;                                                                               \
      std::apply([&](auto&... member) { ((member = values[i++]), ...); }, c.members());                            \
      return c;                                                                                                    \
    }                                                                                                              \
  }
