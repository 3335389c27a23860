// The plan: everything the runtime does for one head, as data. The device arena (every buffer with its
// fixed place), the weights (each a tensor of the file or a concatenation of some), the tables an
// extend uploads, the host arena (a draft's tables and outputs in mapped host memory), the kernel
// specializations, and node lists: one per streams bucket for the draft pass, one for the eager extend.
// Dumped as YAML (plan/plan_yaml.h); a dumped plan loads back equal.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "plan/tuning.h"
#include <tfe/dtype.h>
#include <tfe/header.h>
#include <tfe/options.h>

namespace tfe {

// Version of the plan schema (YAML and struct). Loading another version is refused.
inline constexpr int kPlanSchemaVersion = 18;

// A plan buffer's dtypes: a head's, and I64 for the device addresses an extend of device rows uploads.
constexpr bool plan_dtype(DType t) { return head_dtype(t) || t == DType::I64; }

// The order of a weight matrix's bytes in the weights arena.
enum class Layout : uint8_t {
  rows,   // row-major, as in the head file
  tiled,  // whole 16-row tiles, their rows interleaved one 64-byte K step at a time (kernels/weight_layout.h)
};
std::string_view layout_name(Layout l);

struct Buffer {
  std::string name;
  BufferRole role = BufferRole::activation;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // bytes from the arena's base
  int64_t bytes = 0;
  int64_t alignment = 256;
  // weights: the file tensors concatenated along dim 0 to make it ("computed:rope_inv_freq" for the
  // RoPE table computed at open).
  std::vector<std::string> from;
  // weights: a matrix [rows, K] that only GEMVs read may be tiled; the runtime reorders it at upload.
  Layout layout = Layout::rows;
  bool operator==(const Buffer&) const = default;
};

struct Arena {
  std::vector<Buffer> buffers;
  int64_t bytes = 0;
  const Buffer& at(std::string_view name) const;  // throws naming the buffer
  const Buffer* find(std::string_view name) const;
  bool operator==(const Arena&) const = default;
};

// One argument of a node, bound by parameter name.
struct Arg {
  enum class Kind : uint8_t { buffer, i64, f32, null, rows };  // rows: the node's row count at launch
  std::string param;
  Kind kind = Kind::null;
  std::string buffer;       // kind == buffer: a buffer of the weights arena, the arena or the host arena
  int64_t byte_offset = 0;  // kind == buffer: bytes into that buffer (e.g. a column slice, a tap)
  int64_t i = 0;            // kind == i64
  float f = 0.0f;           // kind == f32
  bool operator==(const Arg&) const = default;
};

// A cuBLASLt GEMM: y[rows, n] = x[rows, k] . w[n, k]^T, bf16 in and out, fp32 accumulation.
struct Gemm {
  std::string w;
  int64_t w_offset = 0;
  std::string x, y;
  int64_t n = 0, k = 0;
  bool operator==(const Gemm&) const = default;
};

struct Node {
  enum class Kind : uint8_t { kernel, gemm };
  std::string name;  // e.g. "s3.wo" (step 3) or "extend.fc"
  int step = 0;      // draft pass: 1..max_steps; extend: 0
  // A draft node that runs only in a pass whose last step is its step (the pass's final node, e.g. the
  // outputs' copy to host memory): the graph of (streams, s) leaves out such nodes of steps below s.
  bool last_step_only = false;
  Kind kind = Kind::kernel;
  std::string spec;  // kernel: KernelSpec::uri() of a spec in Plan::specs
  LaunchShape launch;
  // Launched with programmatic stream serialization: the kernel may start while its predecessor
  // finishes (every kernel waits in-kernel before it touches an earlier node's output; a GEMV streams
  // its first weights before that wait). Kernel nodes of a draft pass only.
  bool dependent = false;
  std::vector<Arg> args;  // kernel: one per KernelDef param, in order
  Gemm gemm;              // gemm
  // The rows a node runs on. `fixed`: a draft node, for its bucket's streams (baked into its args and
  // launch). Extend nodes are launched for a count known only at the call: `chunk_rows` (the chunk's
  // rows: gemm m, Arg::Kind::rows) or `chunk_slots` (the slots the chunk touches); their launch is
  // planned for the largest count (extend_rows, max_slots) and scaled along rows_axis.
  enum class Rows : uint8_t { fixed, chunk_rows, chunk_slots };
  Rows rows = Rows::fixed;
  bool operator==(const Node&) const = default;
};
std::string_view node_rows_name(Node::Rows r);

// A decision the planner made, with its reason, e.g. {"wqkv", "gemv fp8", "file has FP8 forms; fp8=auto"}.
struct Choice {
  std::string subject;
  std::string decision;
  std::string reason;
  bool operator==(const Choice&) const = default;
};

// The draft pass of one streams bucket for max_steps steps. The graph of (streams, steps) is the
// prefix of nodes with step <= steps, less the last_step_only nodes of steps below it.
struct Bucket {
  int streams = 0;
  std::vector<Node> nodes;
  bool operator==(const Bucket&) const = default;
};

struct Plan {
  int schema_version = kPlanSchemaVersion;
  std::string head_sha256;  // of the head file's JSON header ("" when planned from a bare header)
  HeadHeader header;
  PlanOptions options;
  Tuning tuning;      // the measured choices it was planned with
  int ring_rows = 0;  // R >= window + 1 + max_steps
  bool fp8 = false;   // any FP8 form in use
  Arena weights;      // uploaded once
  Arena arena;        // state, tables, activations, outputs
  // Mapped pinned host memory, read and written by the draft pass's kernels over the host link: the
  // draft's tables, which the host fills before a call and the pass's first node copies into the arena,
  // and a copy of its outputs, which the pass's last node writes where the host reads them. A draft call
  // is then one graph launch and one wait, with no copy-engine transfer (BENCHMARKS.md, "A draft call
  // without copies").
  Arena host;
  int64_t tables_offset = 0;  // the tables region of `arena`, uploaded in one copy
  int64_t tables_bytes = 0;
  std::vector<KernelSpec> specs;  // every specialization the nodes name, sorted by uri
  std::vector<Choice> choices;
  std::vector<Bucket> buckets;  // ascending streams
  std::vector<Node> extend;     // for one chunk of up to options.extend_rows rows
  int64_t device_bytes = 0;     // weights + arena (+ the cuBLASLt workspace)
  int64_t cublaslt_workspace = 32 << 20;

  const KernelSpec& spec(std::string_view uri) const;  // throws naming the uri
  bool operator==(const Plan&) const = default;
};

// Plans `header` under `options` and `tuning`. Throws tfe::Error naming the option and its limit.
Plan make_plan(const HeadHeader& header, const PlanOptions& options, const Tuning& tuning = {},
               std::string head_sha256 = "");

// The candidates a two_stage plan of `header` rescores: options.cand_k, or the header's where it is 0.
// Throws naming cand_k where the head is dense and it is nonzero, or where it exceeds draft_vocab.
int plan_cand_k(const HeadHeader& header, const PlanOptions& options);
// Throws naming first_ranks where it is on for a two_stage head (which drafts its best token only).
void check_first_ranks_option(const HeadHeader& header, const PlanOptions& options);

// The options in which `a` and `b` differ, by their YAML keys with both values ("max_steps 8 against 4;
// cand_k 0 against 32"); empty where they are equal. Names every field of PlanOptions.
std::string plan_options_differences(const PlanOptions& a, const PlanOptions& b);

// A node's name without its step prefix: "s3.wo" -> "wo"; an extend node's "extend.fc" -> "fc".
std::string_view node_base_name(const Node& node);

// Checks names of draft-pass nodes without their step prefix ("post_norm" for s1.post_norm, s2.post_norm,
// ..): the nodes a runtime leaves out of every draft pass when asked (OpenOptions::knock_out), so that what
// the rest of a pass costs inside the graph can be timed (tfe-bench --knock-out). Throws naming a name no
// draft node has (with the names there are), or a node no pass can run without: a pass's first node (it
// brings the call's tables: load_tables) and its last_step_only node (it writes the completion word the
// host waits for: store_outputs).
void check_knock_out(const Plan& plan, const std::vector<std::string>& names);

// The compute capability of a validated arch as one number: "sm_90" -> 90.
int sm_version(const PlanOptions& options);

// The most shared memory one CTA may use on `options.arch` (the CUDA guide's per-block limit with the
// opt-in the runtime makes): 227 KB on sm_90 / sm_10x / sm_110, 163 KB on sm_80 / sm_87, 99 KB on the
// others (sm_86, sm_89, sm_12x).
int64_t max_smem_per_block(const PlanOptions& options);

// ring_attention takes head_dim up to this (its per-lane registers grow with head_dim).
inline constexpr int64_t kMaxAttentionHeadDim = 512;
// The kernels that split a row's work over a thread-block cluster (ring_attention, topk: constant SPLIT)
// declare clusters of up to the portable size; clusters exist from sm_90 on, so below it SPLIT is 1.
inline constexpr int64_t kMaxClusterCtas = 8;
int64_t max_cluster_ctas(const PlanOptions& options);

// Checks a plan's internal consistency (what a loaded plan must satisfy before the runtime trusts it):
// header, options and tuning valid, cand_k within the head's, ring_rows, buffers inside their arena,
// aligned, sized by shape and dtype and not overlapping, the tables region, specs sorted and known,
// buckets matching options, each node's spec present, args covering the kernel's params in order with
// kinds that fit, every bound buffer present and offsets inside it, gemm operands in range, device_bytes.
// Throws naming what is wrong.
void validate(const Plan& plan);

}  // namespace tfe
