#include "plan/plan_yaml.h"

#include <limits>
#include <utility>

#include "core/error.h"
#include "head/header_yaml.h"
#include "core/yaml_read.h"

namespace tfe {

namespace {

// Bounds on list lengths: far above any real plan, low enough that a hostile document cannot make the
// loader allocate without limit.
constexpr size_t kMaxChoices = 1 << 12;
constexpr size_t kMaxBuffers = 1 << 14;
constexpr size_t kMaxSpecs = 1 << 14;
constexpr size_t kMaxNodes = 1 << 16;
constexpr size_t kMaxArgs = 64;
constexpr size_t kMaxRank = 8;
constexpr size_t kMaxFrom = 64;
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

std::string_view arg_kind_name(Arg::Kind k) {
  switch (k) {
    case Arg::Kind::buffer:
      return "buffer";
    case Arg::Kind::i64:
      return "i64";
    case Arg::Kind::f32:
      return "f32";
    case Arg::Kind::null:
      return "null";
    case Arg::Kind::rows:
      return "rows";
  }
  return "?";
}

std::string_view node_kind_name(Node::Kind k) { return k == Node::Kind::kernel ? "kernel" : "gemm"; }

// ---- dump ----

YAML::Node flow_seq() {
  YAML::Node n(YAML::NodeType::Sequence);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}
YAML::Node flow_map() {
  YAML::Node n(YAML::NodeType::Map);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}
template <typename T>
YAML::Node flow_list(const std::vector<T>& v) {
  YAML::Node n = flow_seq();
  for (const auto& x : v) n.push_back(x);
  return n;
}

YAML::Node buffer_yaml(const Buffer& b) {
  YAML::Node n = flow_map();
  n["name"] = b.name;
  n["role"] = std::string(buffer_role_name(b.role));
  n["dtype"] = std::string(dtype_name(b.dtype));
  n["shape"] = flow_list(b.shape);
  n["offset"] = b.offset;
  n["bytes"] = b.bytes;
  n["alignment"] = b.alignment;
  n["from"] = flow_list(b.from);
  if (b.layout != Layout::rows) n["layout"] = std::string(layout_name(b.layout));
  return n;
}

YAML::Node arena_yaml(const Arena& a) {
  YAML::Node n(YAML::NodeType::Map);
  n["bytes"] = a.bytes;
  YAML::Node bs(YAML::NodeType::Sequence);
  for (const auto& b : a.buffers) bs.push_back(buffer_yaml(b));
  n["buffers"] = bs;
  return n;
}

YAML::Node arg_yaml(const Arg& a) {
  YAML::Node n = flow_map();
  n["param"] = a.param;
  n["kind"] = std::string(arg_kind_name(a.kind));
  switch (a.kind) {
    case Arg::Kind::buffer:
      n["buffer"] = a.buffer;
      n["byte_offset"] = a.byte_offset;
      break;
    case Arg::Kind::i64:
      n["i64"] = a.i;
      break;
    case Arg::Kind::f32:
      n["f32"] = yaml::float_text(a.f);
      break;
    case Arg::Kind::null:
    case Arg::Kind::rows:
      break;
  }
  return n;
}

YAML::Node node_yaml(const Node& node) {
  YAML::Node n(YAML::NodeType::Map);
  n["name"] = node.name;
  n["step"] = node.step;
  n["last_step_only"] = node.last_step_only;
  n["kind"] = std::string(node_kind_name(node.kind));
  n["rows"] = std::string(node_rows_name(node.rows));
  if (node.kind == Node::Kind::kernel) {
    n["spec"] = node.spec;
    YAML::Node l = flow_map();
    l["grid"] = flow_list(std::vector<int64_t>(std::begin(node.launch.grid), std::end(node.launch.grid)));
    l["block"] = node.launch.block;
    l["smem"] = node.launch.smem;
    l["rows_axis"] = node.launch.rows_axis;
    l["rows_per_block"] = node.launch.rows_per_block;
    l["dependent"] = node.dependent;
    n["launch"] = l;
    YAML::Node args(YAML::NodeType::Sequence);
    for (const auto& a : node.args) args.push_back(arg_yaml(a));
    n["args"] = args;
  } else {
    YAML::Node g = flow_map();
    g["w"] = node.gemm.w;
    g["w_offset"] = node.gemm.w_offset;
    g["x"] = node.gemm.x;
    g["y"] = node.gemm.y;
    g["n"] = node.gemm.n;
    g["k"] = node.gemm.k;
    n["gemm"] = g;
  }
  return n;
}

YAML::Node nodes_yaml(const std::vector<Node>& nodes) {
  YAML::Node n(YAML::NodeType::Sequence);
  for (const auto& x : nodes) n.push_back(node_yaml(x));
  return n;
}

// The tuning fields that differ from their defaults; an empty map where none does.
YAML::Node tuning_yaml(const Tuning& t) {
  // Compiles only while Tuning has exactly these six fields: a field added to it stops the build here, where
  // it must be named, below and in load_tuning.
  [[maybe_unused]] const auto& [a, b, c, d, e, f] = t;
  const Tuning d0;
  YAML::Node n(YAML::NodeType::Map);
  const auto field = [&](const char* key, const auto& value, const auto& default_value) {
    if (value != default_value) n[key] = value;
  };
  field("dependent_streams", t.dependent_streams, d0.dependent_streams);
  field("dependent_streams_fp8", t.dependent_streams_fp8, d0.dependent_streams_fp8);
  field("dependent_safe_nodes", t.dependent_safe_nodes, d0.dependent_safe_nodes);
  field("rope_in_wqkv", t.rope_in_wqkv, d0.rope_in_wqkv);
  field("gemv_cluster", t.gemv_cluster, d0.gemv_cluster);
  field("tiled_weights", t.tiled_weights, d0.tiled_weights);
  return n;
}

// ---- load ----

// The tuning map: each field optional, a missing one its default.
Tuning load_tuning(const yaml::Field& f) {
  yaml::Map m(f);
  Tuning t;
  if (m.has("dependent_streams")) t.dependent_streams = m.at("dependent_streams").i32(0, 16);
  if (m.has("dependent_streams_fp8")) t.dependent_streams_fp8 = m.at("dependent_streams_fp8").i32(0, 16);
  if (m.has("dependent_safe_nodes")) t.dependent_safe_nodes = m.at("dependent_safe_nodes").boolean();
  if (m.has("rope_in_wqkv")) t.rope_in_wqkv = m.at("rope_in_wqkv").boolean();
  if (m.has("gemv_cluster")) t.gemv_cluster = m.at("gemv_cluster").boolean();
  if (m.has("tiled_weights")) t.tiled_weights = m.at("tiled_weights").boolean();
  m.done();
  return t;
}

template <typename E>
E enum_from(const yaml::Field& f, std::initializer_list<std::pair<const char*, E>> names) {
  const std::string s = f.str();
  std::string known;
  for (const auto& [name, value] : names) {
    if (s == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  f.fail(fmt::format("`{}` is not one of {}", s, known));
}

std::vector<int64_t> i64_list(const yaml::Field& f, size_t max, int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (const auto& x : f.seq(max)) v.push_back(x.i64(lo, hi));
  return v;
}

Buffer load_buffer(const yaml::Field& f) {
  yaml::Map m(f);
  Buffer b;
  b.name = m.at("name").str();
  b.role =
      enum_from(m.at("role"), {std::pair{"weight", BufferRole::weight}, std::pair{"state", BufferRole::state},
                               std::pair{"table", BufferRole::table}, std::pair{"activation", BufferRole::activation},
                               std::pair{"output", BufferRole::output}, std::pair{"input", BufferRole::input},
                               std::pair{"host", BufferRole::host}});
  {
    const auto d = m.at("dtype");
    const auto t = dtype_from_name(d.str());
    if (!t || !plan_dtype(*t)) d.fail(fmt::format("dtype `{}` is not one of BF16, F32, I32, F8_E4M3, I64", d.str()));
    b.dtype = *t;
  }
  b.shape = i64_list(m.at("shape"), kMaxRank, 1, kI64Max);
  b.offset = m.at("offset").i64(0, kI64Max);
  b.bytes = m.at("bytes").i64(0, kI64Max);
  b.alignment = m.at("alignment").i64(1, 4096);
  for (const auto& x : m.at("from").seq(kMaxFrom)) b.from.push_back(x.str());
  if (m.has("layout"))
    b.layout = enum_from(m.at("layout"), {std::pair{"rows", Layout::rows}, std::pair{"tiled", Layout::tiled}});
  m.done();
  return b;
}

Arena load_arena(yaml::Map& m) {
  Arena a;
  a.bytes = m.at("bytes").i64(0, kI64Max);
  for (const auto& b : m.at("buffers").seq(kMaxBuffers)) a.buffers.push_back(load_buffer(b));
  return a;
}

Arg load_arg(const yaml::Field& f) {
  yaml::Map m(f);
  Arg a;
  a.param = m.at("param").str();
  a.kind = enum_from(m.at("kind"), {std::pair{"buffer", Arg::Kind::buffer}, std::pair{"i64", Arg::Kind::i64},
                                    std::pair{"f32", Arg::Kind::f32}, std::pair{"null", Arg::Kind::null},
                                    std::pair{"rows", Arg::Kind::rows}});
  switch (a.kind) {
    case Arg::Kind::buffer:
      a.buffer = m.at("buffer").str();
      a.byte_offset = m.at("byte_offset").i64(0, kI64Max);
      break;
    case Arg::Kind::i64:
      a.i = m.at("i64").i64();
      break;
    case Arg::Kind::f32:
      a.f = m.at("f32").f32();
      break;
    case Arg::Kind::null:
    case Arg::Kind::rows:
      break;
  }
  m.done();
  return a;
}

Node load_node(const yaml::Field& f) {
  yaml::Map m(f);
  Node n;
  n.name = m.at("name").str();
  n.step = m.at("step").i32(0, 16);
  n.last_step_only = m.at("last_step_only").boolean();
  n.kind = enum_from(m.at("kind"), {std::pair{"kernel", Node::Kind::kernel}, std::pair{"gemm", Node::Kind::gemm}});
  n.rows =
      enum_from(m.at("rows"), {std::pair{"fixed", Node::Rows::fixed}, std::pair{"chunk_rows", Node::Rows::chunk_rows},
                               std::pair{"chunk_slots", Node::Rows::chunk_slots}});
  if (n.kind == Node::Kind::kernel) {
    n.spec = m.at("spec").str();
    yaml::Map l(m.at("launch"));
    const auto grid = l.at("grid");
    const auto g = i64_list(grid, 3, 1, kI64Max);
    if (g.size() != 3) grid.fail(fmt::format("has {} dimensions; a grid has 3", g.size()));
    std::copy(g.begin(), g.end(), n.launch.grid);
    n.launch.block = l.at("block").i64(1, 1024);
    n.launch.smem = l.at("smem").i64(0, kI64Max);
    n.launch.rows_axis = l.at("rows_axis").i32(-1, 2);
    n.launch.rows_per_block = l.at("rows_per_block").i64(1, kI64Max);
    n.dependent = l.at("dependent").boolean();
    l.done();
    for (const auto& a : m.at("args").seq(kMaxArgs)) n.args.push_back(load_arg(a));
  } else {
    yaml::Map g(m.at("gemm"));
    n.gemm.w = g.at("w").str();
    n.gemm.w_offset = g.at("w_offset").i64(0, kI64Max);
    n.gemm.x = g.at("x").str();
    n.gemm.y = g.at("y").str();
    n.gemm.n = g.at("n").i64(1, kI64Max);
    n.gemm.k = g.at("k").i64(1, kI64Max);
    g.done();
  }
  m.done();
  return n;
}

std::vector<Node> load_nodes(const yaml::Field& f) {
  std::vector<Node> out;
  for (const auto& n : f.seq(kMaxNodes)) out.push_back(load_node(n));
  return out;
}

}  // namespace

std::string dump_plan_yaml(const Plan& p) {
  YAML::Node root(YAML::NodeType::Map);
  root["schema_version"] = p.schema_version;
  YAML::Node head(YAML::NodeType::Map);
  head["sha256"] = p.head_sha256;
  head["header"] = header_to_yaml(p.header);
  root["head"] = head;
  YAML::Node o(YAML::NodeType::Map);
  o["buckets"] = flow_list(p.options.buckets);
  o["max_steps"] = p.options.max_steps;
  o["fp8"] = std::string(fp8_mode_name(p.options.fp8));
  o["arch"] = p.options.arch;
  o["max_slots"] = p.options.max_slots;
  o["extend_rows"] = p.options.extend_rows;
  o["attention_split"] = std::string(attention_split_name(p.options.attention_split));
  o["cand_k"] = p.options.cand_k;
  o["first_ranks"] = p.options.first_ranks;
  root["options"] = o;
  if (YAML::Node t = tuning_yaml(p.tuning); t.size() > 0) root["tuning"] = t;
  root["ring_rows"] = p.ring_rows;
  root["fp8"] = p.fp8;
  root["device_bytes"] = p.device_bytes;
  root["cublaslt_workspace"] = p.cublaslt_workspace;
  YAML::Node choices(YAML::NodeType::Sequence);
  for (const auto& c : p.choices) {
    YAML::Node n = flow_map();
    n["subject"] = c.subject;
    n["decision"] = c.decision;
    n["reason"] = c.reason;
    choices.push_back(n);
  }
  root["choices"] = choices;
  root["weights"] = arena_yaml(p.weights);
  YAML::Node arena = arena_yaml(p.arena);
  YAML::Node tables = flow_map();
  tables["offset"] = p.tables_offset;
  tables["bytes"] = p.tables_bytes;
  arena["tables"] = tables;
  root["arena"] = arena;
  root["host"] = arena_yaml(p.host);
  YAML::Node specs(YAML::NodeType::Sequence);
  for (const auto& s : p.specs) {
    YAML::Node n = flow_map();
    n["uri"] = s.uri();
    n["kernel"] = s.kernel;
    YAML::Node c = flow_map();
    for (const auto& [k, v] : s.constants) c[k] = v;
    n["constants"] = c;
    specs.push_back(n);
  }
  root["specs"] = specs;
  YAML::Node buckets(YAML::NodeType::Sequence);
  for (const auto& b : p.buckets) {
    YAML::Node n(YAML::NodeType::Map);
    n["streams"] = b.streams;
    n["nodes"] = nodes_yaml(b.nodes);
    buckets.push_back(n);
  }
  root["buckets"] = buckets;
  root["extend"] = nodes_yaml(p.extend);
  YAML::Emitter e;
  e << root;
  if (!e.good()) fail("dump_plan_yaml: the YAML emitter failed: {}", e.GetLastError());
  return std::string(e.c_str()) + "\n";
}

Plan load_plan_yaml(std::string_view text) {
  yaml::Context ctx{"plan YAML"};
  yaml::Map root(yaml::parse(ctx, text));
  Plan p;
  {
    // First, so that a plan of another schema is refused for its version and not for its fields.
    const auto v = root.at("schema_version");
    p.schema_version = v.i32(std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
    if (p.schema_version != kPlanSchemaVersion)
      v.fail(
          fmt::format("schema_version {} is not supported; this build reads schema_version {} (re-plan with "
                      "`tfe-plan dump`)",
                      p.schema_version, kPlanSchemaVersion));
  }
  {
    yaml::Map head(root.at("head"));
    p.head_sha256 = head.at("sha256").str();
    p.header = header_from_yaml(head.at("header"));
    head.done();
  }
  {
    yaml::Map o(root.at("options"));
    p.options.buckets.clear();
    for (const auto& b : o.at("buckets").seq(16)) p.options.buckets.push_back(b.i32(1, 16));
    p.options.max_steps = o.at("max_steps").i32(1, 16);
    {
      const auto f = o.at("fp8");
      p.options.fp8 = enum_from(f, {std::pair{"auto", Fp8Mode::automatic}, std::pair{"off", Fp8Mode::off},
                                    std::pair{"require", Fp8Mode::require}});
    }
    p.options.arch = o.at("arch").str();
    p.options.max_slots = o.at("max_slots").i32(1, 4096);
    p.options.extend_rows = o.at("extend_rows").i32(16, 8192);
    p.options.attention_split = enum_from(
        o.at("attention_split"),
        {std::pair{"per_bucket", AttentionSplit::per_bucket}, std::pair{"same_drafts", AttentionSplit::same_drafts}});
    p.options.cand_k = o.at("cand_k").i32(0, kMaxCandK);
    p.options.first_ranks = o.at("first_ranks").boolean();
    o.done();
    try {
      validate(p.options);
    } catch (const Error& e) {
      o.self().fail(e.what());
    }
  }
  if (root.has("tuning")) p.tuning = load_tuning(root.at("tuning"));
  p.ring_rows = root.at("ring_rows").i32(1, std::numeric_limits<int>::max());
  p.fp8 = root.at("fp8").boolean();
  p.device_bytes = root.at("device_bytes").i64(0, kI64Max);
  p.cublaslt_workspace = root.at("cublaslt_workspace").i64(0, kI64Max);
  for (const auto& c : root.at("choices").seq(kMaxChoices)) {
    yaml::Map m(c);
    Choice ch;
    ch.subject = m.at("subject").str();
    ch.decision = m.at("decision").str();
    ch.reason = m.at("reason").str();
    m.done();
    p.choices.push_back(std::move(ch));
  }
  {
    yaml::Map w(root.at("weights"));
    p.weights = load_arena(w);
    w.done();
  }
  {
    yaml::Map a(root.at("arena"));
    p.arena = load_arena(a);
    yaml::Map t(a.at("tables"));
    p.tables_offset = t.at("offset").i64(0, kI64Max);
    p.tables_bytes = t.at("bytes").i64(0, kI64Max);
    t.done();
    a.done();
  }
  {
    yaml::Map h(root.at("host"));
    p.host = load_arena(h);
    h.done();
  }
  for (const auto& sf : root.at("specs").seq(kMaxSpecs)) {
    yaml::Map m(sf);
    const auto uri = m.at("uri");
    const std::string kernel = m.at("kernel").str();
    std::vector<std::pair<std::string, int64_t>> constants;
    const auto cf = m.at("constants");
    yaml::Map c(cf);
    try {
      for (const auto& name : kernel_def(kernel).constants) constants.emplace_back(name, c.at(name).i64());
      c.done();
      KernelSpec s = make_spec(kernel, std::move(constants));
      if (s.uri() != uri.str())
        uri.fail(fmt::format("uri `{}` does not match kernel and constants (`{}`)", uri.str(), s.uri()));
      p.specs.push_back(std::move(s));
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(ctx.doc)) throw;
      sf.fail(e.what());
    }
    m.done();
  }
  {
    const auto bf = root.at("buckets");
    for (const auto& b : bf.seq(16)) {
      yaml::Map m(b);
      Bucket bucket;
      bucket.streams = m.at("streams").i32(1, 16);
      bucket.nodes = load_nodes(m.at("nodes"));
      m.done();
      p.buckets.push_back(std::move(bucket));
    }
  }
  p.extend = load_nodes(root.at("extend"));
  root.done();
  try {
    validate(p);
  } catch (const Error& e) {
    tfe::fail("{}: {}", ctx.doc, e.what());
  }
  return p;
}

}  // namespace tfe
