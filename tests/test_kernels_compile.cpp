// The real kernels (kernels/*.cuh) against the planner and their descriptions (kernels/<kernel>.h): every
// specialization any preset plans, with FP8 forms and without, compiles for sm_90 into an artifact that
// loads back and defines its lowered name; and every kernel's Params struct is its description's slots, in
// order, 8 bytes each, each of the described kind and direction.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compiler/artifact.h"
#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "core/error.h"
#include <tfe/head_file.h>
#include "plan/plan.h"
#include "head/presets.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace tfe;
using tfe::test::read_text;
using tfe::test::run_command;
using tfe::test::TempDir;

namespace {

// Every preset's plan under default options, once as the preset is (bf16 linears) and once with an FP8
// form for every linear it uses; a dense preset's FP8 plan with first_ranks too (ranked, load_tables RANKS).
std::vector<std::pair<std::string, Plan>> preset_plans() {
  std::vector<std::pair<std::string, Plan>> plans;
  for (const auto& name : preset_names()) {
    HeadHeader h = preset_header(name);
    h.fp8.clear();
    plans.emplace_back(name + " bf16", make_plan(h, PlanOptions{}));
    h.fp8 = linears_in_use(h);
    plans.emplace_back(name + " fp8", make_plan(h, PlanOptions{}));
    if (h.head_type == HeadType::dense)
      plans.emplace_back(name + " fp8 first_ranks", make_plan(h, PlanOptions{.first_ranks = true}));
  }
  return plans;
}

// A source that instantiates the declaration of each kernel (with a planned spec's constants; no body is
// compiled) and checks its parameter struct against the description: 8 bytes per slot, each field by name
// in the description's order, and of its kind: a pointer to const where the kernel only reads, to non-const
// where it writes, long long, F32Slot. A mismatch fails to compile with a log naming the kernel and the slot.
std::string params_probe_source(const std::vector<std::pair<KernelDef, KernelSpec>>& kernels) {
  std::string s;
  std::set<std::string> included;
  for (const auto& [def, spec] : kernels)
    if (included.insert(def.source).second) s += fmt::format("#include \"{}\"\n", def.source);
  s += R"(
namespace tfe_probe {
template <typename F> struct param_of;
template <typename P> struct param_of<void (*)(P)> { using type = P; };
template <typename T> struct slot_kind { static constexpr int value = 0; };
template <typename T> struct slot_kind<T*> { static constexpr int value = 2; };
template <typename T> struct slot_kind<const T*> { static constexpr int value = 1; };
template <> struct slot_kind<long long> { static constexpr int value = 3; };
template <> struct slot_kind<tfe::kernels::F32Slot> { static constexpr int value = 4; };
)";
  const auto kind_of = [](const KernelParam& p) {
    switch (p.kind) {
      case ParamKind::ptr:
        return p.writes ? std::pair{2, "a pointer to non-const (the kernel writes it)"}
                        : std::pair{1, "a pointer to const (the kernel only reads it)"};
      case ParamKind::i64:
        return std::pair{3, "long long"};
      case ParamKind::f32:
        return std::pair{4, "F32Slot"};
    }
    return std::pair{0, "?"};
  };
  for (const auto& [def, spec] : kernels) {
    const std::string cfg = "Cfg_" + def.name, params = "Params_" + def.name;
    std::string config = config_struct_source(spec.constants);
    config.replace(config.find("TfeConfig"), std::string_view("TfeConfig").size(), cfg);
    s += config;
    s += fmt::format("using {} = param_of<decltype(&{}<{}>)>::type;\n", params, def.function, cfg);
    s += fmt::format("static_assert(sizeof({}) == 8 * {}, \"{}: the Params struct is not {} slots of 8 bytes\");\n",
                     params, def.params.size(), def.name, def.params.size());
    // A structured binding takes the fields in declaration order (and refuses a struct with another
    // number of fields); binding i must be the field the description names for slot i. (NVRTC has no
    // constant offsetof; with the size above, order and count fix every offset.)
    std::vector<std::string> bindings;
    for (size_t i = 0; i < def.params.size(); ++i) bindings.push_back(fmt::format("s{}", i));
    for (size_t i = 0; i < def.params.size(); ++i) {
      const std::string fn = fmt::format("slot_{}_{}", def.name, i);
      s += fmt::format(
          "constexpr bool {}() {{ {} p{{}}; auto& [{}] = p; return (const void*)&s{} == (const void*)&p.{}; }}\n", fn,
          params, fmt::join(bindings, ", "), i, def.params[i].name);
      s += fmt::format("static_assert({}(), \"{}: field {} of the Params struct is not `{}`\");\n", fn, def.name, i,
                       def.params[i].name);
      const auto [kind, kind_text] = kind_of(def.params[i]);
      s += fmt::format(
          "static_assert(slot_kind<decltype({}::{})>::value == {}, \"{}: field `{}` of the Params struct "
          "is not {}\");\n",
          params, def.params[i].name, kind, def.name, def.params[i].name, kind_text);
    }
  }
  s += "}  // namespace tfe_probe\n";
  return s;
}

}  // namespace

TEST_CASE("kernels: every planned specialization of every preset compiles for sm_90 and loads back") {
  TempDir tmp;
  // One cache for every plan: a specialization two plans share is compiled once and then hits.
  const KernelCache cache(tmp.path / "cache", /*jit=*/true);
  const auto plans = preset_plans();
  std::set<std::string> unique;
  for (const auto& [name, plan] : plans)
    for (const auto& s : plan.specs) unique.insert(s.uri());

  const CacheCounters c0 = cache_counters();
  size_t total = 0, fp8_specs = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const auto& [name, plan] = plans[i];
    INFO(name);
    REQUIRE(plan.options.arch == "sm_90");
    const std::string out = (tmp.path / fmt::format("artifact-{}", i)).string();
    const CompileSummary s = compile_plan(plan, out, {}, cache);
    CHECK(s.specs == plan.specs.size());
    CHECK(s.hits + s.misses == s.specs);
    total += s.specs;

    const Artifact a = load_artifact(out);
    REQUIRE(a.kernels.size() == plan.specs.size());
    CHECK(a.plan == plan);
    for (size_t k = 0; k < a.kernels.size(); ++k) {
      const ArtifactKernel& ak = a.kernels[k];
      CHECK(ak.uri == plan.specs[k].uri());
      CHECK(cubin_defines_symbol(ak.cubin, ak.lowered_name));
      if (plan.specs[k].kernel == "gemv" && plan.specs[k].constant("WEIGHT") == kc::kWeightFP8) ++fp8_specs;
    }
  }
  // Each distinct specialization compiled exactly once; every repeat was a hit.
  CHECK(cache_counters().misses - c0.misses == unique.size());
  CHECK(cache_counters().hits - c0.hits == total - unique.size());
  CHECK(fp8_specs > 0);  // the fp8 variants did plan FP8 GEMVs
}

TEST_CASE("kernels: every Params struct is its description's 8-byte slots in order, of their kinds") {
  std::map<std::string, KernelSpec> spec_of_kernel;
  for (const auto& [name, plan] : preset_plans())
    for (const auto& s : plan.specs) spec_of_kernel.emplace(s.kernel, s);
  std::vector<std::pair<KernelDef, KernelSpec>> kernels;
  for (const auto& def : kernel_defs()) {
    INFO("registry kernel ", def.name, " is planned by no preset, so its instantiation is never compiled");
    REQUIRE(spec_of_kernel.count(def.name) == 1);
    kernels.emplace_back(def, spec_of_kernel.at(def.name));
  }
  CHECK_NOTHROW(check_compiles("params_probe", params_probe_source(kernels), CompileOptions{}));

  // The probe does catch a mismatch: a registry entry with a slot too many, or two slots swapped.
  auto [def, spec] = kernels.front();
  REQUIRE(def.params.size() >= 2);
  KernelDef extra = def;
  extra.params.push_back({"extra", ParamKind::i64});
  const std::string size_msg = fmt::format("{}: the Params struct is not {} slots", def.name, extra.params.size());
  CHECK_THROWS_WITH_AS(check_compiles("params_probe_extra", params_probe_source({{extra, spec}}), CompileOptions{}),
                       doctest::Contains(size_msg.c_str()), Error);
  KernelDef swapped = def;
  std::swap(swapped.params[0], swapped.params[1]);
  const std::string order_msg =
      fmt::format("{}: field 0 of the Params struct is not `{}`", def.name, def.params[1].name);
  CHECK_THROWS_WITH_AS(check_compiles("params_probe_swapped", params_probe_source({{swapped, spec}}), CompileOptions{}),
                       doctest::Contains(order_msg.c_str()), Error);
  // ... or a pointer it reads described as written, one it writes as read, a scalar of the other kind.
  const auto caught = [&](const char* label, const KernelDef& wrong, const std::string& what) {
    CAPTURE(label);
    CHECK_THROWS_WITH_AS(check_compiles(label, params_probe_source({{wrong, spec}}), CompileOptions{}),
                         doctest::Contains(what.c_str()), Error);
  };
  const auto flipped = [&](auto&& change) {
    KernelDef d = def;
    change(d);
    return d;
  };
  const auto at = [&](std::string_view name) {
    const auto it = std::find_if(def.params.begin(), def.params.end(), [&](const auto& p) { return p.name == name; });
    REQUIRE(it != def.params.end());
    return static_cast<size_t>(it - def.params.begin());
  };
  REQUIRE(def.name == "rmsnorm");
  caught("params_probe_read_written", flipped([&](KernelDef& d) { d.params[at("x")].writes = true; }),
         "rmsnorm: field `x` of the Params struct is not a pointer to non-const");
  caught("params_probe_written_read", flipped([&](KernelDef& d) { d.params[at("y")].writes = false; }),
         "rmsnorm: field `y` of the Params struct is not a pointer to const");
  caught("params_probe_scalar", flipped([&](KernelDef& d) { d.params[at("eps")].kind = ParamKind::i64; }),
         "rmsnorm: field `eps` of the Params struct is not long long");
}

TEST_CASE("kernels: every description has a launch, a reach for each pointer and only for pointers") {
  for (const auto& def : kernel_defs()) {
    CAPTURE(def.name);
    CHECK(def.launch);
    for (const auto& p : def.params) {
      CAPTURE(p.name);
      CHECK(static_cast<bool>(p.reach) == (p.kind == ParamKind::ptr));
      if (p.kind != ParamKind::ptr) CHECK_FALSE(p.writes);
      CHECK(param_writes(def.name, p.name) == p.writes);
    }
  }
  CHECK_FALSE(param_writes("rmsnorm", "no_such_param"));
  CHECK_THROWS_AS(param_writes("no_such_kernel", "x"), Error);
  const KernelSpec topk = kernel_desc::TopkConstants{.VOCAB = 300, .CAND_K = 16, .SPLIT = 1}.spec();
  CHECK_THROWS_WITH_AS(param_reach(topk, "rows", Reach{}), doctest::Contains("topk has no pointer parameter `rows`"),
                       Error);
  CHECK(param_alignment(kernel_desc::LoadTablesConstants{.RANKS = 0}.spec(), "slot_state") ==
        kc::kSlotStateColumns * 4);
}

TEST_CASE("kernels: a constants struct sets its kernel's constants by name, refuses one left unset, reads back") {
  using kernel_desc::TopkConstants;
  CHECK(TopkConstants::names() == kernel_def("topk").constants);
  CHECK(kernel_desc::KeepStateConstants::names().empty());
  const KernelSpec topk = TopkConstants{.VOCAB = 32000, .CAND_K = 64, .SPLIT = 8}.spec();
  CHECK(topk == make_spec("topk", {{"VOCAB", 32000}, {"CAND_K", 64}, {"SPLIT", 8}}));
  const auto back = TopkConstants::of(topk);
  CHECK(back.VOCAB == 32000);
  CHECK(back.CAND_K == 64);
  CHECK(back.SPLIT == 8);
  // A designation that leaves one out is a compile error (-Wmissing-field-initializers); one assigned by
  // member may still miss one.
  TopkConstants partial;
  partial.VOCAB = 32000;
  partial.SPLIT = 8;
  CHECK_THROWS_WITH_AS(partial.spec(), doctest::Contains("kernel spec topk: constant CAND_K is not set"), Error);
  CHECK_THROWS_WITH_AS(kernel_desc::RescoreConstants::of(topk), doctest::Contains("read as a spec of rescore"), Error);
}

// The launch shapes (kernels/<kernel>.h) read the same shape functions and constants as the kernels do
// (gemv_split / gemv_ring for GemvShape, attn_geometry for AttnShape, kTopkThreads, kRescoreWarps), but
// combine them into a grid, a block and dynamic shared memory on their own. A launch with less shared memory
// than the kernel uses corrupts its neighbours', so the two must agree for every shape, not only for the
// ones the GPU tests launch: a probe states each host value as a static_assert on the kernel's own
// constants, over a sweep of shapes, and NVRTC (no GPU) checks them.
namespace {

struct ShapeProbe {
  std::string source =
      "#include \"gemv.cuh\"\n#include \"ring_attention.cuh\"\n#include \"topk.cuh\"\n#include \"rescore.cuh\"\n"
      "namespace tfe_probe {\nusing namespace tfe::kernels;\n";
  int cases = 0;
  // gemv and gemv_cluster (CSPLIT CTAs a column tile, so its grid.x is the tiles' times CSPLIT).
  void gemv(const KernelSpec& spec, int64_t smem_offset = 0, int64_t grid_offset = 0) {
    const LaunchShape l = launch_shape(spec, 1);
    const std::string shape =
        fmt::format("GemvShape<{}, {}, {}, {}, {}, {}>", spec.constant("K"), spec.constant("N"),
                    spec.constant("WEIGHT"), spec.constant("EPILOGUE"), spec.constant("ROWS"), spec.constant("COLS"));
    const int64_t split = spec.kernel == "gemv_cluster" ? spec.constant("CSPLIT") : 1;
    source += fmt::format("static_assert(32 * {0}::WARPS == {1}, \"{2}: block {1}\");\n", shape, l.block, spec.uri());
    source += fmt::format("static_assert(ceil_div(ceil_div({0}, {1}), {2}::TILES) * {5} == {3}, \"{4}: grid {3}\");\n",
                          spec.constant("N"), spec.constant("COLS"), shape, l.grid[0] + grid_offset, spec.uri(), split);
    source += fmt::format("static_assert(({0}::DYNAMIC ? {0}::RING_BYTES : 0) == {1}, \"{2}: smem {1}\");\n", shape,
                          l.smem + smem_offset, spec.uri());
    ++cases;
  }
  // gemv_rope_kv's launch is its GEMV's (gemv_equivalent): the kernel's own shape must agree.
  void rope_gemv(const KernelSpec& spec, int64_t block_offset = 0) {
    const LaunchShape l = launch_shape(spec, 1);
    const std::string cfg = fmt::format("RopeCfg{}", cases);
    source += fmt::format("struct {} {{", cfg);
    for (const auto& [name, v] : spec.constants) source += fmt::format(" static constexpr long long {} = {};", name, v);
    source += " };\n";
    const std::string shape = fmt::format("GemvRopeKvShape<{}>::S", cfg);
    source += fmt::format("static_assert(32 * {0}::WARPS == {1}, \"{2}: block {1}\");\n", shape, l.block + block_offset,
                          spec.uri());
    source += fmt::format(
        "static_assert(ceil_div(ceil_div(GemvRopeKvShape<{0}>::N, {1}), {2}::TILES) == {3}, "
        "\"{4}: grid {3}\");\n",
        cfg, spec.constant("COLS"), shape, l.grid[0], spec.uri());
    source += fmt::format("static_assert(({0}::DYNAMIC ? {0}::RING_BYTES : 0) == {1}, \"{2}: smem {1}\");\n", shape,
                          l.smem, spec.uri());
    ++cases;
  }
  void attention(const KernelSpec& spec, int64_t smem_offset = 0) {
    const LaunchShape l = launch_shape(spec, 1);
    const std::string shape =
        fmt::format("AttnShape<{}, {}, {}, {}, {}>", spec.constant("HEADS"), spec.constant("KV_HEADS"),
                    spec.constant("HEAD_DIM"), spec.constant("WINDOW"), spec.constant("SPLIT"));
    source += fmt::format("static_assert({0}::THREADS == {1}, \"{2}: block {1}\");\n", shape, l.block, spec.uri());
    source += fmt::format("static_assert({0}::SMEM_FLOATS * 4 == {1}, \"{2}: smem {1}\");\n", shape,
                          l.smem + smem_offset, spec.uri());
    ++cases;
  }
  // topk and rescore size their block reductions and candidate warps by their own constants.
  void block(const KernelSpec& spec, const std::string& kernel_block, int64_t offset = 0) {
    const LaunchShape l = launch_shape(spec, 1);
    source += fmt::format("static_assert({} == {}, \"{}: block {}\");\n", kernel_block, l.block + offset, spec.uri(),
                          l.block + offset);
    ++cases;
  }
  std::string text() const { return source + "}  // namespace tfe_probe\n"; }
};

struct Heads {
  int64_t heads, kv_heads, head_dim;
};
KernelSpec attention_spec(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window, int64_t split) {
  return kernel_desc::RingAttentionConstants{
      .HEADS = heads, .KV_HEADS = kv_heads, .HEAD_DIM = head_dim, .WINDOW = window, .RING = window + 9, .SPLIT = split}
      .spec();
}
KernelSpec rope_gemv_spec(const Heads& h, int64_t k, int64_t weight, int64_t rows, int64_t cols) {
  return kernel_desc::GemvRopeKvConstants{.ROWS = rows,
                                          .K = k,
                                          .WEIGHT = weight,
                                          .COLS = cols,
                                          .HEADS = h.heads,
                                          .KV_HEADS = h.kv_heads,
                                          .HEAD_DIM = h.head_dim,
                                          .RING = 520,
                                          .TILED = 0}
      .spec();
}
KernelSpec gemv_spec(int64_t k, int64_t n, int64_t weight, int64_t epilogue, int64_t rows, int64_t cols) {
  return kernel_desc::GemvConstants{
      .ROWS = rows, .K = k, .N = n, .WEIGHT = weight, .EPILOGUE = epilogue, .COLS = cols, .TILED = 0}
      .spec();
}

}  // namespace

TEST_CASE(
    "kernels: the host's block size and shared memory of gemv and ring_attention, and the block of topk and "
    "rescore, are the kernels' own") {
  ShapeProbe probe;
  // ring_attention: group sizes 1..16, head_dim 6..256 (4-byte loads below a multiple of 8, several loads
  // a lane at 256), windows from one tile to many, every split.
  for (const Heads& h : {Heads{32, 8, 128}, Heads{16, 2, 256}, Heads{8, 8, 64}, Heads{4, 2, 16}, Heads{12, 4, 96},
                         Heads{4, 2, 6}, Heads{16, 1, 24}, Heads{96, 8, 128}, Heads{64, 8, 64}})
    for (int64_t window : {7, 15, 63, 128, 511})
      for (int64_t split = 1; split <= 8; ++split)
        probe.attention(attention_spec(h.heads, h.kv_heads, h.head_dim, window, split));
  // gemv: the presets' linears and tails, both weight kinds, every epilogue, the row tiles, both COLS.
  struct Linear {
    int64_t k, n;
  };
  for (const Linear& m :
       {Linear{12288, 4096}, Linear{8192, 6144}, Linear{4096, 14336}, Linear{14336, 4096}, Linear{4096, 32000},
        Linear{4096, 512}, Linear{512, 4096}, Linear{1024, 2048}, Linear{100, 40}, Linear{72, 3000}})
    for (int64_t weight : {kc::kWeightBF16, kc::kWeightFP8})
      for (int64_t epilogue :
           {kc::kEpilogueBF16, kc::kEpilogueF32, kc::kEpilogueResidual, kc::kEpilogueSwiGLU, kc::kEpilogueTop1})
        for (int64_t rows : {1, 2, 8, 9, 16})
          for (int64_t cols : {16, 32}) {
            if (cols == 32 && epilogue == kc::kEpilogueSwiGLU) continue;
            probe.gemv(gemv_spec(m.k, m.n, weight, epilogue, rows, cols));
          }
  // gemv_rope_kv: llama3's wqkv (K 8192, N 6144), a narrow one (tiny: N 128), head_dim 64 and 256.
  for (const auto& [h, k] : {std::pair{Heads{32, 8, 128}, int64_t{8192}}, std::pair{Heads{4, 2, 16}, int64_t{128}},
                             std::pair{Heads{8, 8, 64}, int64_t{1024}}, std::pair{Heads{16, 2, 256}, int64_t{4096}}})
    for (int64_t weight : {kc::kWeightBF16, kc::kWeightFP8})
      for (int64_t rows : {1, 2, 8, 9, 16})
        for (int64_t cols : {16, 32}) probe.rope_gemv(rope_gemv_spec(h, k, weight, rows, cols));
  // gemv_cluster: narrow outputs (lr_a's 512 columns, a 300-column tail) at each split 2 and 4 their K
  // allows (all but 4 at K 2048 in FP8: 32 steps over 16 warps).
  for (const Linear& m : {Linear{4096, 512}, Linear{2048, 300}})
    for (int64_t weight : {kc::kWeightBF16, kc::kWeightFP8})
      for (int64_t rows : {1, 9, 16})
        for (int64_t split : {2, 4}) {
          const KernelSpec spec = kernel_desc::GemvClusterConstants{.ROWS = rows,
                                                                    .K = m.k,
                                                                    .N = m.n,
                                                                    .WEIGHT = weight,
                                                                    .EPILOGUE = kc::kEpilogueBF16,
                                                                    .COLS = 16,
                                                                    .TILED = 0,
                                                                    .CSPLIT = split}
                                      .spec();
          if (split <= gemv_cluster_split_limit(spec)) probe.gemv(spec);
        }
  probe.block(kernel_desc::TopkConstants{.VOCAB = 32000, .CAND_K = 64, .SPLIT = 8}.spec(), "kTopkThreads");
  probe.block(kernel_desc::RescoreConstants{.HIDDEN = 4096, .CAND_K = 64, .WEIGHT = 0, .MAX_STEPS = 8}.spec(),
              "32 * kRescoreWarps");
  CHECK(probe.cases == 9 * 5 * 8 + 10 * 2 * 5 * 5 * 2 - 10 * 2 * 5 + 4 * 2 * 5 * 2 + (2 * 2 * 3 * 2 - 3) + 2);
  CHECK_NOTHROW(check_compiles("launch_shape_probe", probe.text(), CompileOptions{}));

  // The probe does catch a host value the kernel does not compute: each case states one value off by
  // `offset`, and its compile must fail naming that value.
  const auto caught = [](const std::string& name, const ShapeProbe& wrong, const std::string& what) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(check_compiles(name, wrong.text(), CompileOptions{}), doctest::Contains(what.c_str()), Error);
  };
  const KernelSpec topk = kernel_desc::TopkConstants{.VOCAB = 32000, .CAND_K = 64, .SPLIT = 8}.spec();
  ShapeProbe wrong_topk;
  wrong_topk.block(topk, "kTopkThreads", 32);
  caught("launch_shape_probe_topk", wrong_topk,
         fmt::format("{}: block {}", topk.uri(), launch_shape(topk, 1).block + 32));
  const KernelSpec rope = rope_gemv_spec(Heads{32, 8, 128}, 8192, kc::kWeightFP8, 16, 32);
  ShapeProbe wrong_rope;
  wrong_rope.rope_gemv(rope, 32);
  caught("launch_shape_probe_rope_gemv", wrong_rope,
         fmt::format("{}: block {}", rope.uri(), launch_shape(rope, 1).block + 32));
  const KernelSpec llama = attention_spec(32, 8, 128, 511, 4);
  ShapeProbe wrong_attention;
  wrong_attention.attention(llama, 16);
  caught("launch_shape_probe_attention", wrong_attention,
         fmt::format("{}: smem {}", llama.uri(), launch_shape(llama, 1).smem + 16));
  const KernelSpec swiglu = gemv_spec(4096, 14336, kc::kWeightBF16, kc::kEpilogueSwiGLU, 16, 16);
  ShapeProbe wrong_gemv;
  wrong_gemv.gemv(swiglu, 512);
  caught("launch_shape_probe_gemv", wrong_gemv,
         fmt::format("{}: smem {}", swiglu.uri(), launch_shape(swiglu, 1).smem + 512));
  // lr_b's short K: 8 warps over 4 column tiles a CTA, so the grid is a quarter of the tiles.
  const KernelSpec short_k = gemv_spec(512, 32000, kc::kWeightFP8, kc::kEpilogueBF16, 1, 16);
  CHECK(launch_shape(short_k, 1).grid[0] == 500);
  ShapeProbe wrong_grid;
  wrong_grid.gemv(short_k, 0, 1);
  caught("launch_shape_probe_gemv_grid", wrong_grid, fmt::format("{}: grid {}", short_k.uri(), 501));
}

TEST_CASE("tfe-plan compile: a head file to an artifact and a second run of all hits") {
  TempDir tmp;
  const std::string head = (tmp.path / "head.tfe").string(), out = (tmp.path / "out").string();
  const std::string env = fmt::format("TFE_CACHE_DIR={} TFE_JIT=on", (tmp.path / "cache").string());
  REQUIRE(run_command(fmt::format("{} random --preset tiny --seed 7 -o {}", TFE_PLAN_EXE, head)).first == 0);
  const std::string compile =
      fmt::format("{} {} compile {} --buckets 1,2 --max-steps 2 -o {}", env, TFE_PLAN_EXE, head, out);

  const auto [rc1, log1] = run_command(compile);
  INFO(log1);
  REQUIRE(rc1 == 0);
  const Artifact a = load_artifact(out);
  CHECK(a.plan.head_sha256 == HeadFile::open(head).header_sha256());
  CHECK(a.plan.options.buckets == std::vector<int>{1, 2});
  CHECK(a.plan.options.max_steps == 2);
  CHECK(log1.find(fmt::format("specs:   {}", a.kernels.size())) != std::string::npos);
  CHECK(log1.find(fmt::format("misses:  {}", a.kernels.size())) != std::string::npos);
  CHECK(log1.find(fmt::format("[{0}/{0}] ", a.kernels.size())) != std::string::npos);

  const auto [rc2, log2] = run_command(compile);
  INFO(log2);
  CHECK(rc2 == 0);
  CHECK(log2.find(fmt::format("hits:    {}", a.kernels.size())) != std::string::npos);
  CHECK(log2.find("misses:  0") != std::string::npos);

  // A cold cache under TFE_JIT=off refuses, naming the switch; a preset plans without a file.
  const auto [rc3, log3] =
      run_command(fmt::format("TFE_CACHE_DIR={} TFE_JIT=off {} compile --preset tiny --buckets 1 -o {}",
                              (tmp.path / "cold").string(), TFE_PLAN_EXE, out + "-cold"));
  CHECK(rc3 != 0);
  CHECK(log3.find("TFE_JIT=off") != std::string::npos);
  const auto [rc4, log4] = run_command(fmt::format("{} {} compile -o {}", env, TFE_PLAN_EXE, out + "-none"));
  CHECK(rc4 != 0);
  CHECK(log4.find("--preset") != std::string::npos);
  const auto [rc5, log5] =
      run_command(fmt::format("{} {} compile {} --preset tiny -o {}", env, TFE_PLAN_EXE, head, out));
  CHECK(rc5 != 0);
  CHECK(log5.find("excludes") != std::string::npos);
}
