#include "plan/plan.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <fmt/ranges.h>

#include "core/extend_check.h"
#include "core/error.h"
#include "head/numerics.h"
#include "kernels/weight_layout.h"

namespace tfe {

std::string_view fp8_mode_name(Fp8Mode m) {
  switch (m) {
    case Fp8Mode::automatic:
      return "auto";
    case Fp8Mode::off:
      return "off";
    case Fp8Mode::require:
      return "require";
  }
  return "?";
}

Fp8Mode fp8_mode_from_name(std::string_view s) {
  if (s == "auto") return Fp8Mode::automatic;
  if (s == "off") return Fp8Mode::off;
  if (s == "require") return Fp8Mode::require;
  fail("fp8 mode `{}` is not one of auto, off, require", s);
}

std::string_view attention_split_name(AttentionSplit s) {
  return s == AttentionSplit::per_bucket ? "per_bucket" : "same_drafts";
}

AttentionSplit attention_split_from_name(std::string_view s) {
  if (s == "per_bucket") return AttentionSplit::per_bucket;
  if (s == "same_drafts") return AttentionSplit::same_drafts;
  fail("attention split `{}` is not one of per_bucket, same_drafts", s);
}

std::string_view layout_name(Layout l) {
  switch (l) {
    case Layout::rows:
      return "rows";
    case Layout::tiled:
      return "tiled";
  }
  return "?";
}

std::string_view node_rows_name(Node::Rows r) {
  switch (r) {
    case Node::Rows::fixed:
      return "fixed";
    case Node::Rows::chunk_rows:
      return "chunk_rows";
    case Node::Rows::chunk_slots:
      return "chunk_slots";
  }
  return "?";
}

const Buffer* Arena::find(std::string_view name) const {
  for (const auto& b : buffers)
    if (b.name == name) return &b;
  return nullptr;
}

const Buffer& Arena::at(std::string_view name) const {
  if (const Buffer* b = find(name)) return *b;
  fail("arena: no buffer named `{}`", name);
}

const KernelSpec& Plan::spec(std::string_view uri) const {
  for (const auto& s : specs)
    if (s.uri() == uri) return s;
  fail("plan: no kernel spec `{}`", uri);
}

std::string_view node_base_name(const Node& node) {
  const std::string_view name = node.name;
  const size_t dot = name.find('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

void check_knock_out(const Plan& plan, const std::vector<std::string>& names) {
  // What a pass cannot run without, by the plan's own marks: its first node brings the call's tables, and
  // its last_step_only node writes the outputs and the word the host waits for.
  std::set<std::string, std::less<>> known, needed;
  for (const Bucket& b : plan.buckets)
    for (const Node& n : b.nodes) {
      known.emplace(node_base_name(n));
      if (&n == &b.nodes.front() || n.last_step_only) needed.emplace(node_base_name(n));
    }
  for (const std::string& name : names) {
    if (needed.contains(name))
      fail(
          "knock_out: `{}` cannot be left out: every draft pass needs it (a pass's first node, which brings the "
          "call's tables, or its final node, which writes the word the host waits for)",
          name);
    if (!known.contains(name))
      fail("knock_out: no draft node is named `{}` (the draft nodes: {})", name, fmt::join(known, ", "));
  }
}

std::string plan_options_differences(const PlanOptions& a, const PlanOptions& b) {
  // Compiles only while PlanOptions has exactly these nine fields: a field added to it stops the build
  // here, where it must be named below, instead of reading as "no difference".
  [[maybe_unused]] const auto& [buckets, max_steps, fp8, arch, max_slots, extend_rows, attention_split, cand_k,
                                first_ranks] = a;
  std::vector<std::string> out;
  const auto field = [&](std::string_view key, const auto& x, const auto& y) {
    if (x != y) out.push_back(fmt::format("{} {} against {}", key, x, y));
  };
  field("buckets", fmt::format("{}", fmt::join(a.buckets, ",")), fmt::format("{}", fmt::join(b.buckets, ",")));
  field("max_steps", a.max_steps, b.max_steps);
  field("fp8", fp8_mode_name(a.fp8), fp8_mode_name(b.fp8));
  field("arch", a.arch, b.arch);
  field("max_slots", a.max_slots, b.max_slots);
  field("extend_rows", a.extend_rows, b.extend_rows);
  field("attention_split", attention_split_name(a.attention_split), attention_split_name(b.attention_split));
  field("cand_k", a.cand_k, b.cand_k);
  field("first_ranks", a.first_ranks, b.first_ranks);
  return fmt::format("{}", fmt::join(out, "; "));
}

int sm_version(const PlanOptions& o) { return std::stoi(o.arch.substr(3)); }

int64_t max_cluster_ctas(const PlanOptions& o) { return sm_version(o) >= 90 ? kMaxClusterCtas : 1; }

int64_t max_smem_per_block(const PlanOptions& o) {
  const int sm = sm_version(o);
  if (sm == 90 || (sm >= 100 && sm < 120)) return 227 * 1024;
  if (sm == 80 || sm == 87) return 163 * 1024;
  return 99 * 1024;
}

void validate(const PlanOptions& o) {
  if (o.buckets.empty()) fail("plan options: buckets is empty; give at least one streams bucket in 1..16");
  for (size_t i = 0; i < o.buckets.size(); ++i) {
    if (o.buckets[i] < 1 || o.buckets[i] > 16) fail("plan options: buckets[{}] = {} is outside 1..16", i, o.buckets[i]);
    if (i > 0 && o.buckets[i] <= o.buckets[i - 1])
      fail("plan options: buckets must be ascending and unique; buckets[{}] = {} follows {}", i, o.buckets[i],
           o.buckets[i - 1]);
  }
  if (o.max_steps < 1 || o.max_steps > 16) fail("plan options: max_steps = {} is outside 1..16", o.max_steps);
  if (o.max_slots < 1 || o.max_slots > 4096) fail("plan options: max_slots = {} is outside 1..4096", o.max_slots);
  if (o.buckets.back() > o.max_slots)
    fail("plan options: bucket {} exceeds max_slots = {} (a pass drafts one row per distinct slot)", o.buckets.back(),
         o.max_slots);
  if (o.extend_rows < 16 || o.extend_rows > 8192)
    fail("plan options: extend_rows = {} is outside 16..8192", o.extend_rows);
  if (o.cand_k < 0 || o.cand_k > kMaxCandK)
    fail("plan options: cand_k = {} is outside 0..{} (0: the head's)", o.cand_k, kMaxCandK);
  static const std::regex arch_re("sm_[1-9][0-9]{1,3}");
  if (!std::regex_match(o.arch, arch_re))
    fail("plan options: arch `{}` is not of the form sm_<digits> (e.g. sm_90)", o.arch);
  // The GEMV's bf16 mma.sync m16n8k16 needs Ampere or later.
  if (sm_version(o) < 80) fail("plan options: arch {} is below sm_80, the oldest the kernels support", o.arch);
}

void check_first_ranks_option(const HeadHeader& h, const PlanOptions& o) {
  if (o.first_ranks && h.head_type != HeadType::dense)
    fail(
        "plan options: first_ranks is on, but a two_stage head drafts its best token only (its candidates are "
        "rescored); plan it with first_ranks off");
}

int plan_cand_k(const HeadHeader& h, const PlanOptions& o) {
  try {
    return rescored_candidates(h, o.cand_k);
  } catch (const Error& e) {
    fail("plan options: {}", e.what());
  }
}

}  // namespace tfe

namespace tfe {

namespace {

constexpr int64_t kMaxPlanBytes = int64_t{1} << 50;
constexpr int64_t kMaxSpecConstant = int64_t{1} << 24;

int64_t buffer_bytes(const Buffer& b) {
  if (b.shape.empty() || b.shape.size() > 8)
    fail("plan: buffer `{}` has rank {}; 1..8 are allowed", b.name, b.shape.size());
  int64_t p = dtype_size(b.dtype);
  for (int64_t d : b.shape) {
    if (d < 1) fail("plan: buffer `{}` has a dimension {} < 1", b.name, d);
    if (p > kMaxPlanBytes / d) fail("plan: buffer `{}` exceeds {} bytes", b.name, kMaxPlanBytes);
    p *= d;
  }
  return p;
}

// The plan's three arenas. Each holds its own roles: the weights arena weights only, the host arena host
// buffers only, the arena the rest.
enum class ArenaKind : uint8_t { weights, device, host };

bool role_lives_in(BufferRole r, ArenaKind kind) {
  switch (kind) {
    case ArenaKind::weights:
      return r == BufferRole::weight;
    case ArenaKind::host:
      return r == BufferRole::host;
    case ArenaKind::device:
      return r != BufferRole::weight && r != BufferRole::host;
  }
  return false;
}

void check_arena(const Arena& a, ArenaKind kind) {
  const bool weights = kind == ArenaKind::weights;
  const std::string_view which = weights ? "weights arena" : kind == ArenaKind::host ? "host arena" : "arena";
  if (a.bytes < 0 || a.bytes > kMaxPlanBytes)
    fail("plan: {} bytes = {} is outside 0..{}", which, a.bytes, kMaxPlanBytes);
  std::vector<const Buffer*> by_offset;
  for (const auto& b : a.buffers) {
    if (b.name.empty()) fail("plan: {} holds a buffer without a name", which);
    if (!role_lives_in(b.role, kind))
      fail("plan: buffer `{}` of role {} cannot live in the {}", b.name, buffer_role_name(b.role), which);
    if (!plan_dtype(b.dtype)) fail("plan: buffer `{}` has dtype {}, not a device dtype", b.name, dtype_name(b.dtype));
    const int64_t want = buffer_bytes(b);
    if (b.bytes != want) fail("plan: buffer `{}` has bytes = {}, its shape and dtype make {}", b.name, b.bytes, want);
    if (b.alignment < 1 || b.alignment > 4096 || (b.alignment & (b.alignment - 1)) != 0)
      fail("plan: buffer `{}` has alignment {}, not a power of two in 1..4096", b.name, b.alignment);
    if (b.offset < 0 || b.offset % b.alignment != 0)
      fail("plan: buffer `{}` has offset {}, not a non-negative multiple of its alignment {}", b.name, b.offset,
           b.alignment);
    if (b.offset > a.bytes - b.bytes)
      fail("plan: buffer `{}` ends at {}, past the {}'s {} bytes", b.name, b.offset + b.bytes, which, a.bytes);
    if (weights && b.from.empty()) fail("plan: weight `{}` names no source tensor (`from`)", b.name);
    if (!weights && !b.from.empty()) fail("plan: buffer `{}` is not a weight but names sources", b.name);
    if (b.layout == Layout::tiled) {
      const bool matrix = weights && b.shape.size() == 2 && (b.dtype == DType::BF16 || b.dtype == DType::F8_E4M3);
      if (!matrix) fail("plan: buffer `{}` is tiled, which only a bf16 or FP8 weight matrix [rows, K] may be", b.name);
      if (!tileable(b.shape[0], b.bytes / b.shape[0]))
        fail("plan: tiled weight `{}`: {} rows of {} bytes are not whole tiles of {} rows and {}-byte K steps", b.name,
             b.shape[0], b.bytes / b.shape[0], kTileRows, kTileStepBytes);
    }
    by_offset.push_back(&b);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* x, auto* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
      fail("plan: buffers `{}` and `{}` overlap in the {}", by_offset[i - 1]->name, by_offset[i]->name, which);
}

// The ids a copy_rows index table holds, by the table's name: the runtime fills these tables, and checks the
// ids it writes against these domains.
int64_t index_domain(const Plan& p, const Node& n, std::string_view param, std::string_view table) {
  if (table == "slot" || table == "row_slot" || table == "last_slot") return p.options.max_slots + 1;
  if (table == "last_row") return p.options.extend_rows;
  fail(
      "plan: node {} indexes rows through `{}` = `{}`, which is neither a slot table (slot, row_slot, last_slot) "
      "nor a chunk-row table (last_row)",
      n.name, param, table);
}

// `rows`: the rows the node is launched for (its bucket's streams; for extend nodes the most a chunk takes).
void check_node(const Plan& plan, const Node& n, int64_t rows, const std::map<std::string, const Buffer*>& buffers,
                const std::map<std::string, const KernelSpec*>& specs) {
  auto buffer = [&](const std::string& name, std::string_view what) -> const Buffer& {
    const auto it = buffers.find(name);
    if (it == buffers.end()) fail("plan: node {}: {} names buffer `{}`, which no arena holds", n.name, what, name);
    return *it->second;
  };
  if (n.kind == Node::Kind::gemm) {
    if (n.rows == Node::Rows::fixed) fail("plan: gemm node {} must run on chunk rows", n.name);
    const Gemm& g = n.gemm;
    if (g.n < 1 || g.k < 1) fail("plan: gemm node {}: n = {}, k = {} must be >= 1", n.name, g.n, g.k);
    const Buffer& w = buffer(g.w, "gemm w");
    const Buffer& x = buffer(g.x, "gemm x");
    const Buffer& y = buffer(g.y, "gemm y");
    for (const Buffer* b : {&w, &x, &y})
      if (b->dtype != DType::BF16)
        fail("plan: gemm node {}: `{}` is {}, cuBLASLt runs bf16", n.name, b->name, dtype_name(b->dtype));
    if (w.role != BufferRole::weight) fail("plan: gemm node {}: w `{}` is not a weight", n.name, w.name);
    if (g.w_offset < 0 || g.w_offset % 2 != 0 || g.n > (w.bytes - g.w_offset) / (2 * g.k))
      fail("plan: gemm node {}: {} x {} bf16 at w_offset {} run past `{}` ({} bytes)", n.name, g.n, g.k, g.w_offset,
           w.name, w.bytes);
    if (x.shape.back() != g.k)
      fail("plan: gemm node {}: x `{}` rows are {} wide, k = {}", n.name, x.name, x.shape.back(), g.k);
    if (y.shape.back() != g.n)
      fail("plan: gemm node {}: y `{}` rows are {} wide, n = {}", n.name, y.name, y.shape.back(), g.n);
    // A chunk runs up to `rows` rows through both.
    for (const Buffer* b : {&x, &y})
      if (b->bytes / (2 * b->shape.back()) < rows)
        fail("plan: gemm node {}: `{}` holds {} rows, a chunk takes up to {}", n.name, b->name,
             b->bytes / (2 * b->shape.back()), rows);
    if (y.role == BufferRole::weight) fail("plan: gemm node {} writes weight `{}`", n.name, y.name);
    for (const Buffer* b : {&x, &y})
      if ((kArenaRoles & role_bit(b->role)) == 0)
        fail("plan: gemm node {}: `{}` is a {} buffer; cuBLASLt's x and y are in the device arena ({})", n.name,
             b->name, buffer_role_name(b->role), buffer_roles_name(kArenaRoles));
    if (w.layout != Layout::rows)
      fail("plan: gemm node {}: w `{}` is {}; cuBLASLt reads a row-major matrix", n.name, w.name,
           layout_name(w.layout));
    return;
  }
  const auto found = specs.find(n.spec);
  if (found == specs.end()) fail("plan: node {} names spec `{}`, which the plan's specs lack", n.name, n.spec);
  const KernelSpec& spec = *found->second;
  const KernelDef& def = kernel_def(spec.kernel);
  if (n.args.size() != def.params.size())
    fail("plan: node {} has {} args, kernel {} takes {}", n.name, n.args.size(), spec.kernel, def.params.size());
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    const KernelParam& prm = def.params[i];
    if (a.param != prm.name)
      fail("plan: node {} arg {} binds `{}`, kernel {} expects `{}` there", n.name, i, a.param, spec.kernel, prm.name);
    const bool fits = prm.kind == ParamKind::ptr   ? (a.kind == Arg::Kind::buffer || a.kind == Arg::Kind::null)
                      : prm.kind == ParamKind::i64 ? (a.kind == Arg::Kind::i64 || a.kind == Arg::Kind::rows)
                                                   : a.kind == Arg::Kind::f32;
    if (!fits)
      fail("plan: node {} arg `{}`: a {} parameter cannot take this kind of argument", n.name, a.param,
           param_kind_name(prm.kind));
    if (a.kind == Arg::Kind::rows && n.rows == Node::Rows::fixed)
      fail("plan: node {} arg `{}` takes the launch's rows but the node runs on fixed rows", n.name, a.param);
    if (a.kind != Arg::Kind::buffer) continue;
    const Buffer& b = buffer(a.buffer, fmt::format("arg `{}`", a.param));
    if (a.byte_offset < 0 || a.byte_offset >= b.bytes)
      fail("plan: node {} arg `{}`: byte_offset {} is outside `{}` ({} bytes)", n.name, a.param, a.byte_offset, b.name,
           b.bytes);
    if (param_writes(spec.kernel, a.param) && b.role == BufferRole::weight)
      fail("plan: node {} writes weight `{}` through `{}`", n.name, b.name, a.param);
    // What the kernel reads or writes through the parameter is what the buffer holds.
    const DType dtype = param_dtype(spec, a.param);
    if (b.dtype != dtype)
      fail("plan: node {} arg `{}`: buffer `{}` is {}, but kernel {} takes {} there", n.name, a.param, b.name,
           dtype_name(b.dtype), spec.kernel, dtype_name(dtype));
    const BufferRoles roles = param_roles(spec, a.param);
    if ((roles & role_bit(b.role)) == 0)
      fail("plan: node {} arg `{}`: buffer `{}` has role {}, but kernel {} takes {} there", n.name, a.param, b.name,
           buffer_role_name(b.role), spec.kernel, buffer_roles_name(roles));
    // A GEMV reads its w in the layout its TILED constant says, from a whole tile on; nothing else reads a
    // tiled matrix.
    const bool gemv_w = spec.kernel.starts_with("gemv") && a.param == "w";
    const bool tiled = b.layout == Layout::tiled;
    if (gemv_w && (spec.constant("TILED") != 0) != tiled)
      fail("plan: node {} arg `w`: spec {} has TILED = {}, but `{}` is {}", n.name, spec.uri(), spec.constant("TILED"),
           b.name, layout_name(b.layout));
    if (tiled && !gemv_w)
      fail("plan: node {} arg `{}`: `{}` is tiled, which only a gemv's `w` reads", n.name, a.param, b.name);
    if (tiled && a.byte_offset % (kTileRows * (b.bytes / b.shape[0])) != 0)  // rows >= 16: check_arena
      fail("plan: node {} arg `w`: byte_offset {} of tiled `{}` is not at a tile ({} rows of {} bytes)", n.name,
           a.byte_offset, b.name, kTileRows, b.bytes / b.shape[0]);
  }
  if (n.launch.rows_axis < -1 || n.launch.rows_axis > 2 || n.launch.rows_per_block < 1 || n.launch.block < 1 ||
      n.launch.smem < 0)
    fail("plan: node {} has an invalid launch shape", n.name);
  for (int64_t g : n.launch.grid)
    if (g < 1) fail("plan: node {} has a grid dimension {} < 1", n.name, g);
  if (n.dependent && n.step < 1)
    fail("plan: node {} is marked dependent, but only the kernels of a draft pass launch that way", n.name);
  if (n.rows != Node::Rows::fixed && n.launch.rows_axis < 0)
    fail("plan: node {} runs on rows set at launch but its launch has no rows axis", n.name);

  if (n.launch.smem > max_smem_per_block(plan.options))
    fail("plan: node {}: {} bytes of dynamic shared memory a CTA; {} allows at most {}", n.name, n.launch.smem,
         plan.options.arch, max_smem_per_block(plan.options));
  // The launch is the kernel's own mapping for these rows: a larger grid would run CTAs past the rows
  // and columns that the buffers below are sized for.
  LaunchShape want = launch_shape(spec, rows);
  if (!(n.launch == want))
    fail(
        "plan: node {}: launch grid [{}, {}, {}], block {}, smem {} is not kernel {}'s for {} rows (grid [{}, {}, {}], "
        "block {}, smem {})",
        n.name, n.launch.grid[0], n.launch.grid[1], n.launch.grid[2], n.launch.block, n.launch.smem, spec.kernel, rows,
        want.grid[0], want.grid[1], want.grid[2], want.block, want.smem);
  auto arg = [&](std::string_view param) -> const Arg& {
    for (const Arg& a : n.args)
      if (a.param == param) return a;
    fail("plan: node {} has no argument `{}`", n.name, param);
  };
  // Scalars that address memory: the row count, a step's output column, positions, row strides.
  for (const Arg& a : n.args) {
    if (a.kind != Arg::Kind::i64) continue;
    const int64_t v = a.i;
    if (a.param == "rows" && v != rows)
      fail("plan: node {} arg `rows` = {}, but the node is launched for {} rows", n.name, v, rows);
    if (a.param == "step" && (v != n.step || v < 1 || v > spec.constant("MAX_STEPS")))
      fail("plan: node {} arg `step` = {}: it must be the node's step {}, within 1..MAX_STEPS = {}", n.name, v, n.step,
           spec.constant("MAX_STEPS"));
    // The runtime reads out_token / out_conf as [streams, max_steps]: the kernel must write that layout.
    if (a.param == "step" && spec.constant("MAX_STEPS") != plan.options.max_steps)
      fail("plan: node {}: spec {} has MAX_STEPS = {}, but the plan's max_steps is {}", n.name, spec.uri(),
           spec.constant("MAX_STEPS"), plan.options.max_steps);
    if (a.param == "pos_offset" && (v < 0 || v >= plan.options.max_steps))
      fail("plan: node {} arg `pos_offset` = {} is outside 0..{} (max_steps - 1)", n.name, v,
           plan.options.max_steps - 1);
    if ((a.param == "x_stride" || a.param == "y_stride") && (v < spec.constant("WIDTH") || v > (int64_t{1} << 40)))
      fail("plan: node {} arg `{}` = {} is outside {}..2^40 (WIDTH at least)", n.name, a.param, v,
           spec.constant("WIDTH"));
  }
  // Every pointer argument holds what the kernel may touch through it.
  Reach reach;
  reach.rows = rows;
  reach.slots = plan.options.max_slots + 1;
  reach.vocab = plan.header.vocab;
  reach.draft_vocab = plan.header.draft_vocab;
  reach.i64 = [&](std::string_view param) { return arg(param).i; };
  reach.index_rows = [&](std::string_view param) -> int64_t {
    const Arg& a = arg(param);
    return a.kind == Arg::Kind::null ? 0 : index_domain(plan, n, param, a.buffer);
  };
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    if (def.params[i].kind != ParamKind::ptr) continue;
    const int64_t need = param_reach(spec, a.param, reach);
    if (need <= 0) continue;
    if (a.kind == Arg::Kind::null)
      fail("plan: node {} arg `{}` is null, but kernel {} reaches {} bytes through it", n.name, a.param, spec.kernel,
           need);
    const Buffer& b = buffer(a.buffer, fmt::format("arg `{}`", a.param));
    if (need > b.bytes - a.byte_offset)
      fail("plan: node {} arg `{}`: kernel {} reaches {} bytes from byte_offset {} of `{}`, which holds {} bytes",
           n.name, a.param, spec.kernel, need, a.byte_offset, b.name, b.bytes);
    const int64_t align = param_alignment(spec, a.param);
    if ((b.offset + a.byte_offset) % align != 0)
      fail(
          "plan: node {} arg `{}`: kernel {} loads it in {}-byte units, but `{}` offset {} + byte_offset {} is "
          "not a multiple of {}",
          n.name, a.param, spec.kernel, align, b.name, b.offset, a.byte_offset, align);
  }
}

// The runtime's side of a draft pass (runtime/runtime.cpp): before a blocking pass it writes the bucket's
// slot ids into `host_tables`; once `host_done` is set it reads `host_token` and `host_conf`. (An enqueued
// pass is the same nodes with load_tables reading `draft_slots` and no store_outputs.) So the pass begins
// with the load_tables that reads those ids, and every step ends with the store_outputs that only a pass
// ending there runs: one that ran inside a longer pass would set host_done before its outputs were final,
// and one that wrote elsewhere would leave the host reading the last call's outputs. (Both kernels' rows
// are the bucket's streams: check_node checks every node's `rows`.)
void check_draft_pass(const Bucket& b, int max_steps, int max_slots, bool first_ranks, int max_rank,
                      const std::map<std::string, const KernelSpec*>& specs) {
  auto kernel = [&](const Node& n) -> const std::string& { return specs.at(n.spec)->kernel; };
  auto expect_binding = [&](const Node& n, std::string_view param, std::string_view buffer) {
    for (const Arg& a : n.args)
      if (a.param == param && a.kind == Arg::Kind::buffer && a.buffer == buffer && a.byte_offset == 0) return;
    fail("plan: bucket {} node {}: `{}` must bind host buffer `{}` at byte_offset 0, which the runtime {}", b.streams,
         n.name, param, buffer, param == "ids" || param == "ranks" ? "writes before the launch" : "reads after it");
  };
  const Node& first = b.nodes.front();
  if (kernel(first) != "load_tables")
    fail(
        "plan: bucket {}: the pass begins with node {} (kernel {}); it must begin with load_tables, which reads the "
        "tables the runtime wrote",
        b.streams, first.name, kernel(first));
  expect_binding(first, "ids", "host_tables");
  if (specs.at(first.spec)->constant("RANKS") != (first_ranks ? 1 : 0))
    fail("plan: bucket {} node {}: spec {} has RANKS = {}, but the plan's first_ranks is {}", b.streams, first.name,
         first.spec, specs.at(first.spec)->constant("RANKS"), first_ranks);
  for (const Arg& a : first.args)
    if (a.param == "max_rank" && a.i != (first_ranks ? max_rank : 0))
      fail(
          "plan: bucket {} node {}: `max_rank` = {}, but the plan's first ranks are 0..{}; a larger rank would "
          "reach past what ranked keeps",
          b.streams, first.name, a.i, first_ranks ? max_rank : 0);
  if (first_ranks) {
    expect_binding(first, "ranks", "host_ranks");
  } else {
    for (const Arg& a : first.args)
      if ((a.param == "ranks" || a.param == "rank") && a.kind != Arg::Kind::null)
        fail("plan: bucket {} node {}: `{}` is bound, but the plan's first_ranks is off (no ranks are written)",
             b.streams, first.name, a.param);
  }
  for (const Arg& a : first.args)
    if (a.param == "max_slots" && a.i != max_slots)
      fail(
          "plan: bucket {} node {}: `max_slots` = {}, the plan's max_slots is {}; a slot id past it would draft from "
          "another slot's state",
          b.streams, first.name, a.i, max_slots);
  for (size_t i = 0; i < b.nodes.size(); ++i) {
    const Node& n = b.nodes[i];
    const bool store = kernel(n) == "store_outputs";
    if (store != n.last_step_only)
      fail(
          "plan: bucket {} node {}: {}; a step's outputs reach the host only through the store_outputs that ends "
          "the pass",
          b.streams, n.name,
          store ? "store_outputs is not last_step_only"
                : "only store_outputs may be "
                  "last_step_only");
    if (store)
      for (const char* param : {"host_token", "host_conf", "host_done"}) expect_binding(n, param, param);
    const bool ends_step = i + 1 == b.nodes.size() || b.nodes[i + 1].step != n.step;
    if (ends_step != store)
      fail("plan: bucket {} node {}: {} step {}; each step ends with its store_outputs and has only that one",
           b.streams, n.name, store ? "store_outputs does not end" : "a node other than store_outputs ends", n.step);
  }
  // check_node and the bucket loop keep steps in 1..max_steps, non-decreasing, ending at max_steps; a step
  // with no node at all would leave its pass without a store_outputs.
  std::set<int> steps;
  for (const Node& n : b.nodes) steps.insert(n.step);
  if (static_cast<int>(steps.size()) != max_steps)
    fail("plan: bucket {}: {} of the {} steps have nodes; a pass of every length must end with its store_outputs",
         b.streams, steps.size(), max_steps);
}

// The runtime's side of an extend chunk: rows from device memory start at the chunk's first node
// (gather_taps fills the tables host rows upload), which host rows skip; every chunk ends with keep_state,
// which the next draft pass reads.
void check_extend_pass(const std::vector<Node>& nodes, const std::map<std::string, const KernelSpec*>& specs) {
  auto kernel = [&](const Node& n) -> std::string_view {
    return n.kind == Node::Kind::kernel ? std::string_view(specs.at(n.spec)->kernel) : std::string_view("gemm");
  };
  if (nodes.empty() || kernel(nodes.front()) != "gather_taps")
    fail("plan: the extend pass must begin with gather_taps, which the runtime runs only for rows in device memory");
  if (kernel(nodes.back()) != "keep_state")
    fail("plan: the extend pass must end with keep_state, which keeps each slot's state for the next draft pass");
  for (size_t i = 1; i + 1 < nodes.size(); ++i)
    if (kernel(nodes[i]) == "gather_taps" || kernel(nodes[i]) == "keep_state")
      fail("plan: extend node {} ({}) may only {} the pass", nodes[i].name, kernel(nodes[i]),
           kernel(nodes[i]) == "gather_taps" ? "begin" : "end");
}

// The buffers the runtime reads and writes itself, outside any kernel: each where and of the role it
// expects, and of the size it reads or writes (an artifact's plan is checked here before it is opened).
const Buffer& runtime_buffer(const Plan& p, std::string_view name, BufferRole role) {
  const bool in_host = role == BufferRole::host;
  const Buffer* b = in_host ? p.host.find(name) : p.arena.find(name);
  if (!b)
    fail("plan: the {} has no buffer `{}`; the runtime needs it as a {} buffer", in_host ? "host arena" : "arena", name,
         buffer_role_name(role));
  if (b->role != role)
    fail("plan: buffer `{}` has role {}, the runtime expects {}", name, buffer_role_name(b->role),
         buffer_role_name(role));
  return *b;
}

void check_runtime_buffers(const Plan& p) {
  const auto table = [&](std::string_view name) -> const Buffer& { return runtime_buffer(p, name, BufferRole::table); };
  // An extend chunk uploads [row_slot .. taps] in one copy.
  const Buffer& row_slot = table("row_slot");
  const Buffer& taps = table("taps");
  for (const char* name : {"row_pos", "row_tok", "row_taps_src", "row_tok_src", "last_row", "last_slot", "last_first"})
    if (const Buffer& t = table(name); !(row_slot.offset <= t.offset && t.offset < taps.offset))
      fail("plan: table `{}` is not between row_slot and taps; an extend chunk uploads [row_slot .. taps] in one copy",
           t.name);
  const int64_t largest = p.options.buckets.back();
  const Buffer& slot_state = runtime_buffer(p, "slot_state", BufferRole::state);
  if (slot_state.bytes != int64_t{p.options.max_slots + 1} * kc::kSlotStateColumns * 4)
    fail("plan: `slot_state` holds {} bytes; the slots' state is {} x {} int32", slot_state.bytes,
         p.options.max_slots + 1, kc::kSlotStateColumns);
  const Buffer& draft_slots = runtime_buffer(p, "draft_slots", BufferRole::input);
  if (draft_slots.bytes < largest * 4)
    fail("plan: `draft_slots` holds {} bytes; an enqueued draft takes {} slot ids", draft_slots.bytes, largest);
  for (const char* name : {"out_token", "out_conf"}) (void)runtime_buffer(p, name, BufferRole::output);
  for (const char* name : {"ring_k", "ring_v"}) (void)runtime_buffer(p, name, BufferRole::state);
  // The host reads a draft's outputs as [streams, max_steps] of the largest bucket.
  const int64_t out_entries = largest * p.options.max_steps;
  for (const char* name : {"host_token", "host_conf"})
    if (const Buffer& b = runtime_buffer(p, name, BufferRole::host); b.bytes != out_entries * 4)
      fail("plan: host buffer `{}` holds {} bytes; the draft's outputs are {} x {} 4-byte values", b.name, b.bytes,
           largest, p.options.max_steps);
  if (const Buffer& done = runtime_buffer(p, "host_done", BufferRole::host); done.bytes != 4)
    fail("plan: host buffer `host_done` holds {} bytes; the pass's completion word is one int32", done.bytes);
  if (const Buffer& tables = runtime_buffer(p, "host_tables", BufferRole::host); tables.bytes < largest * 4)
    fail("plan: host buffer `host_tables` holds {} bytes; a draft takes {} slot ids", tables.bytes, largest);
  if (p.options.first_ranks) {
    if (const Buffer& b = runtime_buffer(p, "draft_ranks", BufferRole::input); b.bytes < largest * 4)
      fail("plan: `draft_ranks` holds {} bytes; an enqueued draft takes {} ranks", b.bytes, largest);
    if (const Buffer& b = runtime_buffer(p, "host_ranks", BufferRole::host); b.bytes < largest * 4)
      fail("plan: host buffer `host_ranks` holds {} bytes; a draft takes {} ranks", b.bytes, largest);
  }
  if (const Buffer& error = runtime_buffer(p, "host_error", BufferRole::host); error.bytes != 8)
    fail("plan: host buffer `host_error` holds {} bytes; the error record is one int64", error.bytes);
}

}  // namespace

void validate(const Plan& p) {
  if (p.schema_version != kPlanSchemaVersion)
    fail("plan: schema_version {} is not supported (this build reads {})", p.schema_version, kPlanSchemaVersion);
  validate(p.header);
  validate(p.options);
  validate(p.tuning);
  (void)plan_cand_k(p.header, p.options);
  check_first_ranks_option(p.header, p.options);
  const int min_ring = p.header.window + 1 + p.options.max_steps;
  if (p.ring_rows < min_ring || p.ring_rows > 1 << 20)
    fail("plan: ring_rows = {} is outside {}..{} (window + 1 + max_steps at least)", p.ring_rows, min_ring, 1 << 20);
  check_arena(p.weights, ArenaKind::weights);
  check_arena(p.arena, ArenaKind::device);
  check_arena(p.host, ArenaKind::host);
  std::map<std::string, const Buffer*> buffers;
  for (const Arena* a : {&p.weights, &p.arena, &p.host})
    for (const auto& b : a->buffers)
      if (!buffers.emplace(b.name, &b).second) fail("plan: buffer name `{}` is used twice", b.name);
  if (p.tables_offset < 0 || p.tables_bytes < 0 || p.tables_offset > p.arena.bytes - p.tables_bytes)
    fail("plan: tables region [{}, +{}) is outside the arena ({} bytes)", p.tables_offset, p.tables_bytes,
         p.arena.bytes);
  for (const auto& b : p.arena.buffers)
    if (b.role == BufferRole::table &&
        (b.offset < p.tables_offset || b.offset + b.bytes > p.tables_offset + p.tables_bytes))
      fail("plan: table `{}` lies outside the tables region", b.name);
  bool any_fp8 = false;
  for (const auto& b : p.weights.buffers) any_fp8 = any_fp8 || b.dtype == DType::F8_E4M3;
  if (p.fp8 != any_fp8) fail("plan: fp8 = {} but the weights {} FP8 forms", p.fp8, any_fp8 ? "hold" : "hold no");
  std::map<std::string, const KernelSpec*> uris;
  for (size_t i = 0; i < p.specs.size(); ++i) {
    const KernelSpec& s = p.specs[i];
    make_spec(s.kernel, s.constants);  // throws for an unknown kernel or wrong constants
    // Sizes and counts are at least 1 (some divide), switches at least 0; none is near int64's range, so
    // the launch shapes and reaches computed from them below stay exact.
    for (const auto& [name, v] : s.constants) {
      const bool flag = name == "WEIGHT" || name == "EPILOGUE" || name == "QK_NORM" || name == "WRITE_Q" ||
                        name == "TILED" || name == "RANKS";
      const int64_t lo = flag ? 0 : 1;
      const int64_t hi = name == "EPILOGUE" ? kc::kEpilogueTop1 : flag ? 1 : kMaxSpecConstant;
      if (v < lo || v > hi) fail("plan: spec {}: {} = {} is outside {}..{}", s.uri(), name, v, lo, hi);
    }
    // A kernel limit, not a header one: a head may have any head_dim, a plan only one ring_attention takes.
    if (s.kernel == "ring_attention" && s.constant("HEAD_DIM") > kMaxAttentionHeadDim)
      fail("plan: spec {}: HEAD_DIM = {} is above {}, the most ring_attention takes", s.uri(), s.constant("HEAD_DIM"),
           kMaxAttentionHeadDim);
    // The cluster kernels declare their constant SPLIT (gemv_cluster: CSPLIT) CTAs a cluster: a larger
    // cluster does not compile (or, below sm_90, no cluster does), so a loaded plan asking for one is
    // refused here, not by NVRTC.
    const char* cluster = s.kernel == "ring_attention" || s.kernel == "topk" ? "SPLIT"
                          : s.kernel == "gemv_cluster"                       ? "CSPLIT"
                                                                             : nullptr;
    if (cluster && s.constant(cluster) > max_cluster_ctas(p.options))
      fail("plan: spec {}: {} = {} is above {}, the most CTAs a cluster takes on {}", s.uri(), cluster,
           s.constant(cluster), max_cluster_ctas(p.options), p.options.arch);
    if (s.kernel == "gemv_cluster") {
      // Its cluster joins whole column tiles of a narrow output, every warp with a K step of its own.
      const int64_t split = s.constant("CSPLIT"), limit = gemv_cluster_split_limit(s);
      if (split > limit)
        fail(
            "plan: spec {}: CSPLIT = {} is above {}, the most this shape's K splits into (a narrow output, every "
            "warp of the cluster at least one K step)",
            s.uri(), split, limit);
    }
    // The runtime reads the outputs as [streams, max_steps]: every kernel that writes them (top1, rescore,
    // store_outputs) must use that layout.
    const auto& names = kernel_def(s.kernel).constants;
    if (std::find(names.begin(), names.end(), "MAX_STEPS") != names.end() &&
        s.constant("MAX_STEPS") != p.options.max_steps)
      fail("plan: spec {} has MAX_STEPS = {}, but the plan's max_steps is {}", s.uri(), s.constant("MAX_STEPS"),
           p.options.max_steps);
    // A tiled gemv reads whole 16-row tiles of 64-byte K steps (kernels/gemv.cuh asserts it at compile time).
    if (s.kernel.starts_with("gemv") && s.constant("TILED") == 1) {
      const KernelSpec g = gemv_equivalent(s);
      const int64_t row_bytes = g.constant("K") * (g.constant("WEIGHT") == kc::kWeightFP8 ? 1 : 2);
      if (g.constant("N") % kTileRows != 0 || row_bytes % kTileStepBytes != 0)
        fail(
            "plan: spec {}: TILED = 1 needs N a multiple of {} and rows of whole {}-byte K steps (N = {}, {} bytes "
            "a row)",
            s.uri(), kTileRows, kTileStepBytes, g.constant("N"), row_bytes);
    }
    if (s.kernel == "gemv_rope_kv" && s.constant("HEAD_DIM") % 16 != 0)
      fail(
          "plan: spec {}: HEAD_DIM = {} is not a multiple of 16, which gemv_rope_kv's tiles of rotate-half pairs "
          "need",
          s.uri(), s.constant("HEAD_DIM"));
    if (s.kernel == "topk") {
      const auto topk = kernel_desc::TopkConstants::of(s);
      if (topk.CAND_K > topk.VOCAB)
        fail("plan: spec {}: CAND_K = {} is above VOCAB = {}", s.uri(), int64_t{topk.CAND_K}, int64_t{topk.VOCAB});
    }
    const std::string uri = s.uri();
    if (i > 0 && !(p.specs[i - 1].uri() < uri))
      fail("plan: specs must be sorted by uri and unique; `{}` follows `{}`", uri, p.specs[i - 1].uri());
    uris.emplace(uri, &s);
  }
  if (p.buckets.size() != p.options.buckets.size())
    fail("plan: {} buckets, but options list {}", p.buckets.size(), p.options.buckets.size());
  std::set<std::string> used;
  bool any_gemm = false;
  for (size_t i = 0; i < p.buckets.size(); ++i) {
    const Bucket& b = p.buckets[i];
    if (b.streams != p.options.buckets[i])
      fail("plan: buckets[{}] has streams = {}, options list {}", i, b.streams, p.options.buckets[i]);
    int last = 1;
    for (const auto& n : b.nodes) {
      if (n.step < 1 || n.step > p.options.max_steps)
        fail("plan: bucket {} node {} has step {}, outside 1..{}", b.streams, n.name, n.step, p.options.max_steps);
      if (n.step < last)
        fail("plan: bucket {} node {} of step {} follows a node of step {}; steps must not decrease", b.streams, n.name,
             n.step, last);
      last = n.step;
      if (n.kind != Node::Kind::kernel || n.rows != Node::Rows::fixed)
        fail("plan: bucket {} node {} must be a kernel on fixed rows", b.streams, n.name);
      check_node(p, n, b.streams, buffers, uris);
      used.insert(n.spec);
    }
    if (b.nodes.empty() || b.nodes.back().step != p.options.max_steps)
      fail("plan: bucket {} does not run all {} steps", b.streams, p.options.max_steps);
    check_draft_pass(b, p.options.max_steps, p.options.max_slots, p.options.first_ranks, max_first_rank(p.header),
                     uris);
  }
  for (const auto& n : p.extend) {
    if (n.step != 0) fail("plan: extend node {} has step {}; extend nodes have step 0", n.name, n.step);
    if (n.last_step_only) fail("plan: extend node {} is last_step_only; only draft nodes may be", n.name);
    if (n.rows == Node::Rows::fixed) fail("plan: extend node {} must run on rows set at launch", n.name);
    check_node(p, n, n.rows == Node::Rows::chunk_slots ? int64_t{p.options.max_slots} : int64_t{p.options.extend_rows},
               buffers, uris);
    if (n.kind == Node::Kind::kernel) used.insert(n.spec);
    any_gemm = any_gemm || n.kind == Node::Kind::gemm;
  }
  check_extend_pass(p.extend, uris);  // after check_node: every node's spec is known
  for (const auto& [u, spec] : uris)
    if (!used.count(u)) fail("plan: spec `{}` is named by no node", u);
  if (p.cublaslt_workspace < 0 || p.cublaslt_workspace > (int64_t{1} << 32) || (any_gemm && p.cublaslt_workspace == 0))
    fail("plan: cublaslt_workspace = {} is outside {}..{}", p.cublaslt_workspace, any_gemm ? 1 : 0, int64_t{1} << 32);
  if (p.device_bytes != p.weights.bytes + p.arena.bytes + p.cublaslt_workspace)
    fail("plan: device_bytes = {}, but weights + arena + cuBLASLt workspace = {}", p.device_bytes,
         p.weights.bytes + p.arena.bytes + p.cublaslt_workspace);
  check_runtime_buffers(p);
}

}  // namespace tfe
