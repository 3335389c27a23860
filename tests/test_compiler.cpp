// NVRTC compile and the kernel cache, on a small source set of the test's own (not kernels/*.cuh), so
// these tests hold whatever the real kernels are.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "compiler/artifact.h"
#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "core/error.h"
#include "head/presets.h"
#include <tfe/deploy.h>
#include <tfe/head_file.h>
#include "test_util.h"

namespace fs = std::filesystem;
using namespace tfe;
using tfe::test::random_head_bytes;
using tfe::test::read_text;
using tfe::test::run_command;
using tfe::test::TempDir;
using tfe::test::write_file;
using tfe::test::write_text;

namespace {

// Sets (or unsets, for nullopt) an environment variable for the object's life.
struct EnvVar {
  std::string name;
  std::optional<std::string> saved;
  EnvVar(std::string n, std::optional<std::string> value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) saved = v;
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ~EnvVar() {
    if (saved)
      ::setenv(name.c_str(), saved->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// Two sources that include each other by file name, like kernels/*.cuh.
std::vector<EmbeddedSource> test_sources() {
  return {
      {"tcommon.cuh", R"(#pragma once
namespace tfe::test {
__device__ inline float twice(float v) { return v + v; }
}
)"},
      {"axpy.cuh", R"(#pragma once
#include "tcommon.cuh"
namespace tfe::test {
struct AxpyParams {
  float* y;
  const float* x;
  long long n;
};
template <typename Cfg>
__global__ void axpy(const AxpyParams p) {
  const long long i = blockIdx.x * (long long)Cfg::N + threadIdx.x;
  if (i < p.n) p.y[i] = p.y[i] * (float)Cfg::SCALE + twice(p.x[i]);
}
}  // namespace tfe::test
)"},
  };
}

KernelDef test_def() {
  return {"axpy",
          "axpy.cuh",
          "tfe::test::axpy",
          {"N", "SCALE"},
          {{"y", ParamKind::ptr}, {"x", ParamKind::ptr}, {"n", ParamKind::i64}}};
}

// Constants drawn fresh each run: any specialization must compile, not one remembered one.
KernelSpec random_spec() {
  static std::mt19937_64 rng(std::random_device{}());
  return KernelSpec{
      "axpy", {{"N", 32 * static_cast<int64_t>(1 + rng() % 8)}, {"SCALE", 2 + static_cast<int64_t>(rng() % 1000)}}};
}

CompileOptions test_options() {
  CompileOptions o;
  o.headers = test_sources();
  return o;
}

bool has_elf_magic(const std::string& cubin) {
  return cubin.size() > 4 && cubin.compare(0, 4,
                                           "\x7f"
                                           "ELF") == 0;
}

}  // namespace

TEST_CASE("compiler: a specialization compiles to a CUBIN defining its lowered name") {
  const KernelSpec spec = random_spec();
  const CompileUnit unit = make_compile_unit(spec, test_def());
  CHECK(unit.name_expression == "tfe::test::axpy<TfeConfig>");
  CHECK(unit.source.find("#include \"axpy.cuh\"") != std::string::npos);
  CHECK(unit.source.find(fmt::format("static constexpr long long N = {}LL;", spec.constant("N"))) != std::string::npos);

  const CompiledKernel k = compile_unit(unit, test_options());
  CHECK(k.uri == spec.uri());
  REQUIRE(has_elf_magic(k.cubin));
  CHECK(k.lowered_name.find("axpy") != std::string::npos);
  CHECK(cubin_defines_symbol(k.cubin, k.lowered_name));
  CHECK_FALSE(cubin_defines_symbol(k.cubin, k.lowered_name + "x"));
  CHECK_THROWS_WITH_AS(cubin_defines_symbol(std::string(96, 'x'), k.lowered_name), doctest::Contains("no ELF magic"),
                       Error);
  CHECK_THROWS_AS(cubin_defines_symbol(k.cubin.substr(0, k.cubin.size() / 3), k.lowered_name), Error);
}

TEST_CASE("compiler: the options are the contract's (real arch, no fast math, CUDA include)") {
  CompileOptions o = test_options();
  o.cuda_include = "/opt/cuda-x/include";
  const auto opts = nvrtc_options(o);
  CHECK(std::find(opts.begin(), opts.end(), "--gpu-architecture=sm_90") != opts.end());
  CHECK(std::find(opts.begin(), opts.end(), "-I/opt/cuda-x/include") != opts.end());
  CHECK(std::find(opts.begin(), opts.end(), "-lineinfo") != opts.end());
  for (const auto& s : opts) CHECK(s.find("fast") == std::string::npos);
  o.arch = "compute_90";
  CHECK_THROWS_WITH_AS(nvrtc_options(o), doctest::Contains("compute_90"), Error);
  o.arch = "sm_";
  CHECK_THROWS_AS(nvrtc_options(o), Error);

  EnvVar inc("TFE_CUDA_INCLUDE", "/elsewhere/include");
  CHECK(cuda_include_dir() == "/elsewhere/include");
  CHECK(CompileOptions{}.cuda_include == "/elsewhere/include");
}

TEST_CASE("compiler: the CUDA include directory reaches NVRTC (cuda_bf16.h)") {
  CompileOptions o = test_options();
  o.headers.push_back({"bf16.cuh", R"(#pragma once
#include <cuda_bf16.h>
namespace tfe::test {
template <typename Cfg>
__global__ void cast(const __nv_bfloat16* x, float* y) { y[threadIdx.x] = __bfloat162float(x[threadIdx.x]) * Cfg::K; }
}
)"});
  const KernelDef def{"cast", "bf16.cuh", "tfe::test::cast", {"K"}, {}};
  const CompiledKernel k = compile_unit(make_compile_unit(KernelSpec{"cast", {{"K", 3}}}, def), o);
  CHECK(has_elf_magic(k.cubin));

  o.cuda_include = "/nonexistent/cuda/include";
  CHECK_THROWS_WITH_AS(compile_unit(make_compile_unit(KernelSpec{"cast", {{"K", 3}}}, def), o),
                       doctest::Contains("cuda_bf16.h"), Error);
}

TEST_CASE("compiler: a compile error carries the NVRTC log, the options, the uri and the constants") {
  CompileOptions o = test_options();
  o.headers.push_back({"broken.cuh", R"(#pragma once
namespace tfe::test {
template <typename Cfg>
__global__ void broken(float* y) { y[0] = undeclared_symbol_xyz * Cfg::N; }
}
)"});
  const KernelDef def{"broken", "broken.cuh", "tfe::test::broken", {"N"}, {}};
  const KernelSpec spec{"broken", {{"N", 77}}};
  try {
    compile_unit(make_compile_unit(spec, def), o);
    FAIL("compile_unit accepted a broken source");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("undeclared_symbol_xyz") != std::string::npos);  // the log line
    CHECK(msg.find("broken.cuh") != std::string::npos);
    CHECK(msg.find("--gpu-architecture=sm_90") != std::string::npos);
    CHECK(msg.find("-std=c++17") != std::string::npos);
    CHECK(msg.find(spec.uri()) != std::string::npos);
    CHECK(msg.find("N=77") != std::string::npos);
  }
  // A spec whose constants do not match the definition is refused before NVRTC runs.
  CHECK_THROWS_WITH_AS(make_compile_unit(KernelSpec{"broken", {{"M", 1}}}, def), doctest::Contains("`M`"), Error);
}

TEST_CASE("cache: a miss compiles and stores, the next lookup hits with the same bytes") {
  TempDir dir;
  const KernelCache cache(dir.path, /*jit=*/true);
  const CompileUnit unit = make_compile_unit(random_spec(), test_def());
  const CompileOptions o = test_options();

  const CacheCounters c0 = cache_counters();
  const CachedKernel first = cache.get(unit, o);
  CHECK_FALSE(first.hit);
  CHECK(cache_counters().misses == c0.misses + 1);
  CHECK(cache_counters().hits == c0.hits);
  CHECK(first.key == cache_key(unit, o));
  CHECK(first.key.size() == 64);
  const fs::path entry = dir.path / fmt::format("v{}", kCacheSchemaVersion) / "sm_90" / first.key;
  CHECK(fs::file_size(entry.string() + ".cubin") == first.kernel.cubin.size());
  CHECK(read_text(entry.string() + ".json").find(unit.uri) != std::string::npos);

  const CachedKernel second = cache.get(unit, o);
  CHECK(second.hit);
  CHECK(cache_counters().hits == c0.hits + 1);
  CHECK(cache_counters().misses == c0.misses + 1);
  CHECK(second.kernel.cubin == first.kernel.cubin);
  CHECK(second.kernel.lowered_name == first.kernel.lowered_name);
  CHECK(second.kernel.uri == unit.uri);
}

TEST_CASE("cache: the key changes with every input") {
  const KernelSpec spec = random_spec();
  const CompileUnit unit = make_compile_unit(spec, test_def());
  const CompileOptions o = test_options();
  const std::string base = cache_key(unit, o);
  CHECK(cache_key(make_compile_unit(spec, test_def()), test_options()) == base);

  KernelSpec other = spec;
  other.constants[1].second += 1;
  CHECK(cache_key(make_compile_unit(other, test_def()), o) != base);

  CompileOptions arch = o;
  arch.arch = "sm_89";
  CHECK(cache_key(unit, arch) != base);

  CompileOptions lines = o;
  lines.line_info = false;
  CHECK(cache_key(unit, lines) != base);

  CompileOptions inc = o;
  inc.cuda_include += "/";
  CHECK(cache_key(unit, inc) != base);

  CompileOptions text = o;
  text.headers[0].text += " ";
  CHECK(cache_key(unit, text) != base);

  CompileOptions renamed = o;
  renamed.headers[0].name = "tcommon2.cuh";
  CHECK(cache_key(unit, renamed) != base);

  CompileOptions extra = o;
  extra.headers.push_back({"unused.cuh", ""});
  CHECK(cache_key(unit, extra) != base);

  CompileUnit expr = unit;
  expr.name_expression = "tfe::test::axpy<TfeConfig >";
  CHECK(cache_key(expr, o) != base);

  // Fields are length-prefixed: moving bytes from one field to the next changes the key.
  CompileOptions split_a = o, split_b = o;
  split_a.headers = {{"ab", "c"}};
  split_b.headers = {{"a", "bc"}};
  CHECK(cache_key(unit, split_a) != cache_key(unit, split_b));
}

TEST_CASE("cache: TFE_JIT=off turns a miss into an error naming the uri and the key") {
  TempDir dir;
  EnvVar root("TFE_CACHE_DIR", dir.path.string());
  const CompileUnit unit = make_compile_unit(random_spec(), test_def());
  const CompileOptions o = test_options();
  {
    EnvVar jit("TFE_JIT", "off");
    const KernelCache cache = KernelCache::from_environment();
    CHECK_FALSE(cache.jit());
    CHECK(cache.root() == dir.path);
    const CacheCounters c0 = cache_counters();
    try {
      cache.get(unit, o);
      FAIL("a miss compiled under TFE_JIT=off");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(unit.uri) != std::string::npos);
      CHECK(msg.find(cache_key(unit, o)) != std::string::npos);
      CHECK(msg.find("TFE_JIT=off") != std::string::npos);
    }
    CHECK(cache_counters().misses == c0.misses);
    CHECK_FALSE(fs::exists(cache.dir("sm_90") / (cache_key(unit, o) + ".cubin")));
  }
  KernelCache(dir.path, true).get(unit, o);
  {
    EnvVar jit("TFE_JIT", "off");
    CHECK(KernelCache::from_environment().get(unit, o).hit);  // cached entries still load
  }
  EnvVar bad("TFE_JIT", "maybe");
  CHECK_THROWS_WITH_AS(KernelCache::from_environment(), doctest::Contains("maybe"), Error);
}

TEST_CASE("cache: a corrupt entry is a miss and is rewritten") {
  TempDir dir;
  const KernelCache cache(dir.path, true);
  const CompileUnit unit = make_compile_unit(random_spec(), test_def());
  const CompileOptions o = test_options();
  const CachedKernel good = cache.get(unit, o);
  const fs::path cubin = cache.dir("sm_90") / (good.key + ".cubin");
  const fs::path json = cache.dir("sm_90") / (good.key + ".json");

  auto expect_recompile = [&](const char* what) {
    INFO(what);
    const CacheCounters c0 = cache_counters();
    const CachedKernel again = cache.get(unit, o);
    CHECK_FALSE(again.hit);
    CHECK(cache_counters().misses == c0.misses + 1);
    CHECK(again.kernel.cubin == good.kernel.cubin);
    CHECK(cache.get(unit, o).hit);  // rewritten whole
  };

  fs::resize_file(cubin, fs::file_size(cubin) / 2);
  expect_recompile("truncated cubin");

  std::string bytes = read_text(cubin);
  bytes[bytes.size() / 2] ^= 0x5a;
  std::ofstream(cubin, std::ios::binary | std::ios::trunc) << bytes;
  expect_recompile("flipped byte in the cubin");

  std::ofstream(json, std::ios::trunc) << "{\"schema\": 1, \"key\": ";
  expect_recompile("truncated json");

  std::ofstream(json, std::ios::trunc) << "{\"schema\": 1}";
  expect_recompile("json missing fields");

  fs::remove(cubin);
  expect_recompile("cubin missing");

  // A recorded kernel name that the cubin does not define (it would fail only at load, on the GPU).
  std::string meta = read_text(json);
  const std::string name = good.kernel.lowered_name;
  REQUIRE(meta.find(name) != std::string::npos);
  meta.replace(meta.find(name), name.size(), name + "_other");
  std::ofstream(json, std::ios::trunc) << meta;
  expect_recompile("a lowered name the cubin does not define");
}

TEST_CASE("cache: concurrent lookups of one unit compile it once") {
  TempDir dir;
  const KernelCache cache(dir.path, true);
  const CompileUnit unit = make_compile_unit(random_spec(), test_def());
  const CompileOptions o = test_options();
  const CacheCounters c0 = cache_counters();
  std::vector<CachedKernel> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = cache.get(unit, o); });
  for (auto& t : threads) t.join();
  CHECK(cache_counters().misses == c0.misses + 1);
  CHECK(cache_counters().hits == c0.hits + 3);
  for (const auto& g : got) CHECK(g.kernel.cubin == got[0].kernel.cubin);
}

TEST_CASE("cache: the root comes from TFE_CACHE_DIR, then XDG_CACHE_HOME, then HOME") {
  EnvVar a("TFE_CACHE_DIR", "/tmp/tfe-a"), b("XDG_CACHE_HOME", "/tmp/xdg-b"), c("HOME", "/tmp/home-c");
  CHECK(default_cache_root() == fs::path("/tmp/tfe-a"));
  {
    EnvVar unset_a("TFE_CACHE_DIR", std::nullopt);
    CHECK(default_cache_root() == fs::path("/tmp/xdg-b/tfe"));
    EnvVar unset_b("XDG_CACHE_HOME", std::nullopt);
    CHECK(default_cache_root() == fs::path("/tmp/home-c/.cache/tfe"));
    EnvVar unset_c("HOME", std::nullopt);
    CHECK_THROWS_WITH_AS(default_cache_root(), doctest::Contains("TFE_CACHE_DIR"), Error);
  }
  const KernelCache cache = KernelCache::from_environment();
  CHECK(cache.dir("sm_90") == fs::path("/tmp/tfe-a") / fmt::format("v{}", kCacheSchemaVersion) / "sm_90");
}

TEST_CASE("compiler: the NVRTC version is the toolkit's") {
  const NvrtcVersion v = nvrtc_version();
  CHECK(v.major >= 12);
  CHECK(v.str() == fmt::format("{}.{}", v.major, v.minor));
  CHECK(cuda_toolkit_version().rfind(std::to_string(v.major) + ".", 0) == 0);
}

// ---- the deploy artifact --------------------------------------------------------------------------------
// A real plan (the tiny preset, one bucket) compiled against stub kernels: one empty template per registry
// kernel with a Params struct of the registry's slots, so these tests hold whatever kernels/*.cuh are and
// take a second.

namespace {

std::vector<EmbeddedSource> stub_kernel_sources() {
  std::map<std::string, std::string> by_file;
  for (const auto& def : kernel_defs()) {
    const std::string fn = def.function.substr(def.function.rfind("::") + 2);
    std::vector<std::string> slots;
    for (const auto& p : def.params) slots.push_back(fmt::format("long long {};", p.name));
    by_file[def.source] += fmt::format(
        "namespace tfe::kernels {{\nstruct {0}_params {{ {1} }};\ntemplate <typename Cfg>\n"
        "__global__ void {0}(const {0}_params p) {{}}\n}}\n",
        fn, fmt::join(slots, " "));
  }
  std::vector<EmbeddedSource> out;
  for (auto& [name, text] : by_file) out.push_back({name, "#pragma once\n" + text});
  return out;
}

Plan tiny_plan() {
  PlanOptions o;
  o.buckets = {1};
  o.max_steps = 2;
  return make_plan(preset_header("tiny"), o, {}, std::string(64, 'a'));
}

CompileOptions stub_options() {
  CompileOptions o;
  o.headers = stub_kernel_sources();
  return o;
}

// Copies a compiled artifact so that each check tampers with its own.
fs::path copy_of(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

void expect_refused(const fs::path& dir, const std::string& needle) {
  INFO("artifact ", dir.string(), ", expected an error containing: ", needle);
  try {
    load_artifact(dir.string());
    FAIL("load_artifact accepted a damaged artifact");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("artifact: compile_plan writes plan, CUBINs and manifest that load_artifact reads back verified") {
  TempDir tmp;
  const KernelCache cache(tmp.path / "cache", true);
  const Plan plan = tiny_plan();
  REQUIRE(plan.specs.size() >= 3);
  const fs::path out = tmp.path / "artifact";

  std::vector<CompileProgress> seen;
  const CompileSummary s = compile_plan(
      plan, out.string(), [&](const CompileProgress& p) { seen.push_back(p); }, cache, stub_options());
  CHECK(s.specs == plan.specs.size());
  CHECK(s.misses == plan.specs.size());
  CHECK(s.hits == 0);
  CHECK(s.out_dir == out.string());
  REQUIRE(seen.size() == plan.specs.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].done == i + 1);
    CHECK(seen[i].total == plan.specs.size());
    CHECK_FALSE(seen[i].hit);
  }
  CHECK(format_progress({12, 87, "gemv__rows_16", false, 143.4}) == "[12/87] gemv__rows_16... (miss, 143 ms)");
  CHECK(format_progress({3, 4, "x", true, 0.2}) == "[3/4] x... (hit, 0 ms)");

  const Artifact a = load_artifact(out.string());
  CHECK(a.plan == plan);
  CHECK(a.arch == "sm_90");
  CHECK(a.nvrtc_version == nvrtc_version().str());
  REQUIRE(a.kernels.size() == plan.specs.size());
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    CHECK(a.kernels[i].uri == plan.specs[i].uri());
    CHECK(a.kernels[i].kernel == plan.specs[i].kernel);
    CHECK(has_elf_magic(a.kernels[i].cubin));
    CHECK(cubin_defines_symbol(a.kernels[i].cubin, a.kernels[i].lowered_name));
    CHECK(fs::exists(out / "kernels" / (plan.specs[i].uri() + ".cubin")));
  }
  CHECK(&a.kernel(plan.specs.back().uri()) == &a.kernels.back());
  CHECK_THROWS_WITH_AS(a.kernel("no_such_kernel"), doctest::Contains("no_such_kernel"), Error);

  // A second compile is all hits and writes the same artifact.
  const std::string manifest = read_text(out / "manifest.json");
  const CompileSummary again = compile_plan(plan, out.string(), {}, cache, stub_options());
  CHECK(again.hits == plan.specs.size());
  CHECK(again.misses == 0);
  CHECK(read_text(out / "manifest.json") == manifest);

  // A plan with fewer specializations written over it leaves no stale CUBIN behind.
  PlanOptions fewer = plan.options;
  fewer.max_steps = 1;
  Plan small = make_plan(plan.header, fewer, plan.tuning, plan.head_sha256);
  small.specs.resize(1);  // not a loadable plan, but enough to exercise the clean-up
  small.buckets.clear();
  small.extend.clear();
  compile_plan(small, out.string(), {}, cache, stub_options());
  size_t cubins = 0;
  for (const auto& e : fs::directory_iterator(out / "kernels")) cubins += e.path().extension() == ".cubin";
  CHECK(cubins == 1);
}

TEST_CASE("artifact: load_artifact refuses a damaged or foreign artifact, naming the file") {
  // Compiled once for every subcase (doctest reruns this body per subcase); each subcase damages a copy.
  static const TempDir shared;
  static const Plan plan = tiny_plan();
  static const fs::path good = [] {
    const fs::path dir = shared.path / "good";
    compile_plan(plan, dir.string(), {}, KernelCache(shared.path / "cache", true), stub_options());
    return dir;
  }();
  TempDir tmp;
  REQUIRE_NOTHROW(load_artifact(good.string()));
  const std::string uri = plan.specs[1].uri();
  int n = 0;
  auto fresh = [&] { return copy_of(good, tmp.path / fmt::format("copy{}", n++)); };
  auto rewrite_manifest = [](const fs::path& dir, const std::string& from, const std::string& to) {
    std::string m = read_text(dir / "manifest.json");
    const auto at = m.find(from);
    REQUIRE(at != std::string::npos);
    m.replace(at, from.size(), to);
    std::ofstream(dir / "manifest.json", std::ios::trunc) << m;
  };

  SUBCASE("a CUBIN with a flipped byte") {
    const fs::path d = fresh();
    const fs::path cubin = d / "kernels" / (uri + ".cubin");
    std::string b = read_text(cubin);
    b[b.size() / 2] ^= 0x01;
    std::ofstream(cubin, std::ios::binary | std::ios::trunc) << b;
    expect_refused(d, cubin.string());
    expect_refused(d, "sha256");
  }
  SUBCASE("a truncated CUBIN") {
    const fs::path d = fresh();
    const fs::path cubin = d / "kernels" / (uri + ".cubin");
    fs::resize_file(cubin, fs::file_size(cubin) - 1);
    expect_refused(d, cubin.string());
  }
  SUBCASE("a missing CUBIN") {
    const fs::path d = fresh();
    fs::remove(d / "kernels" / (uri + ".cubin"));
    expect_refused(d, uri + ".cubin");
  }
  SUBCASE("an edited plan.yaml") {
    const fs::path d = fresh();
    std::ofstream(d / "plan.yaml", std::ios::app) << "# edited\n";
    expect_refused(d, (d / "plan.yaml").string());
  }
  SUBCASE("no manifest (an interrupted compile)") {
    const fs::path d = fresh();
    fs::remove(d / "manifest.json");
    expect_refused(d, "manifest.json");
  }
  SUBCASE("a manifest that is not JSON") {
    const fs::path d = fresh();
    std::ofstream(d / "manifest.json", std::ios::trunc) << "{\"artifact_schema\": ";
    expect_refused(d, "manifest.json");
  }
  SUBCASE("another artifact schema") {
    const fs::path d = fresh();
    rewrite_manifest(d, fmt::format("\"artifact_schema\": {}", kArtifactSchemaVersion), "\"artifact_schema\": 99");
    expect_refused(d, "artifact_schema 99");
  }
  SUBCASE("another head") {
    const fs::path d = fresh();
    rewrite_manifest(d, std::string(64, 'a'), std::string(64, 'b'));
    expect_refused(d, std::string(64, 'b'));
  }
  SUBCASE("a lowered name the CUBIN does not define") {
    const fs::path d = fresh();
    const std::string lowered = load_artifact(good.string()).kernel(uri).lowered_name;
    rewrite_manifest(d, lowered, lowered + "_");
    expect_refused(d, "does not define");
  }
  SUBCASE("a file outside the artifact") {
    const fs::path d = fresh();
    rewrite_manifest(d, "\"file\": \"plan.yaml\"", "\"file\": \"../good/plan.yaml\"");
    expect_refused(d, "not inside the artifact");
  }
  SUBCASE("a kernel entry missing") {
    const fs::path d = fresh();
    auto m = nlohmann::json::parse(read_text(d / "manifest.json"));
    m["kernels"].erase(m["kernels"].begin());
    std::ofstream(d / "manifest.json", std::ios::trunc) << m.dump();
    expect_refused(d, "specializations");
  }
}

TEST_CASE("artifact: compile_plan under TFE_JIT=off with a cold cache names the first missing kernel") {
  TempDir tmp;
  const KernelCache cache(tmp.path / "cache", /*jit=*/false);
  const Plan plan = tiny_plan();
  CHECK_THROWS_WITH_AS(compile_plan(plan, (tmp.path / "out").string(), {}, cache, stub_options()),
                       doctest::Contains("TFE_JIT=off"), Error);
  CHECK_FALSE(fs::exists(tmp.path / "out" / "manifest.json"));
}

// A recompile that fails (here: a cache miss under TFE_JIT=off) leaves the earlier artifact loadable as it
// was, and no staging directory behind.
TEST_CASE("artifact: a failed recompile leaves the old artifact loadable and nothing else behind") {
  TempDir tmp;
  const fs::path out = tmp.path / "out";
  const Plan plan = tiny_plan();
  compile_plan(plan, out.string(), {}, KernelCache(tmp.path / "cache", true), stub_options());
  const std::string manifest = read_text(out / "manifest.json");
  PlanOptions other = plan.options;
  other.max_steps = 1;
  const Plan changed = make_plan(plan.header, other, {}, plan.head_sha256);
  CHECK_THROWS_WITH_AS(compile_plan(changed, out.string(), {}, KernelCache(tmp.path / "cold", false), stub_options()),
                       doctest::Contains("TFE_JIT=off"), Error);
  CHECK(read_text(out / "manifest.json") == manifest);
  CHECK_NOTHROW(load_artifact(out.string()));
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename().string().find(".out.") != 0);
}

// compile -o owns only an artifact: a directory with anything else, a file, or a symlink is refused
// before any work and left untouched; an earlier artifact's kernels/ that is a symlink is replaced as a
// link, and the directory it pointed to keeps its files.
TEST_CASE("artifact: compile_plan refuses an output it does not own and never writes through a symlink") {
  TempDir tmp;
  const KernelCache cache(tmp.path / "cache", true);
  const Plan plan = tiny_plan();

  const fs::path foreign = tmp.path / "foreign";
  fs::create_directories(foreign);
  write_text(foreign / "notes.txt", "keep me");
  CHECK_THROWS_WITH_AS(compile_plan(plan, foreign.string(), {}, cache, stub_options()),
                       doctest::Contains("is not empty and holds no manifest.json"), Error);
  CHECK(read_text(foreign / "notes.txt") == "keep me");
  // A file named manifest.json does not make a directory an artifact: it must parse as one and name
  // every file there.
  write_text(foreign / "manifest.json", "{\"a\": 1}");
  CHECK_THROWS_WITH_AS(compile_plan(plan, foreign.string(), {}, cache, stub_options()),
                       doctest::Contains("does not parse as a tfe artifact's manifest"), Error);
  const fs::path real = tmp.path / "real";
  compile_plan(plan, real.string(), {}, cache, stub_options());
  write_text(real / "notes.txt", "keep me");
  CHECK_THROWS_WITH_AS(compile_plan(plan, real.string(), {}, cache, stub_options()),
                       doctest::Contains("holds `notes.txt`, which its manifest.json does not name"), Error);
  fs::remove(real / "notes.txt");
  write_text(real / "kernels" / "extra.cubin", "keep me");
  CHECK_THROWS_WITH_AS(compile_plan(plan, real.string(), {}, cache, stub_options()),
                       doctest::Contains("extra.cubin`, which its manifest.json does not name"), Error);
  CHECK(read_text(real / "kernels" / "extra.cubin") == "keep me");
  CHECK(read_text(foreign / "notes.txt") == "keep me");

  const fs::path file = tmp.path / "file";
  write_text(file, "x");
  CHECK_THROWS_WITH_AS(compile_plan(plan, file.string(), {}, cache, stub_options()),
                       doctest::Contains("exists and is not a directory"), Error);

  const fs::path link = tmp.path / "link";
  fs::create_directory_symlink(foreign, link);
  CHECK_THROWS_WITH_AS(compile_plan(plan, link.string(), {}, cache, stub_options()), doctest::Contains("is a symlink"),
                       Error);

  // An earlier artifact whose kernels/ is a symlink is not one this command owns: refused, the link and
  // what it points at left as they are.
  const fs::path out = tmp.path / "out";
  compile_plan(plan, out.string(), {}, cache, stub_options());
  const fs::path elsewhere = tmp.path / "elsewhere";
  fs::create_directories(elsewhere);
  write_text(elsewhere / "other.cubin", "not ours");
  fs::rename(out / "kernels", tmp.path / "kernels-moved");
  fs::create_directory_symlink(elsewhere, out / "kernels");
  CHECK_THROWS_WITH_AS(compile_plan(plan, out.string(), {}, cache, stub_options()),
                       doctest::Contains("holds `kernels`"), Error);
  CHECK(read_text(elsewhere / "other.cubin") == "not ours");
  CHECK(fs::is_symlink(out / "kernels"));
}

TEST_CASE("artifact: an output folder with a trailing slash, new or existing, is the folder") {
  TempDir tmp;
  const KernelCache cache(tmp.path / "cache", true);
  const Plan plan = tiny_plan();
  const std::string out = (tmp.path / "deploy").string() + "/";
  compile_plan(plan, out, {}, cache, stub_options());
  CHECK_NOTHROW(load_artifact(out));
  compile_plan(plan, out + "/", {}, cache, stub_options());  // over the artifact there
  CHECK_NOTHROW(load_artifact(out));
  fs::create_directories(tmp.path / "empty");
  compile_plan(plan, (tmp.path / "empty").string() + "/", {}, cache, stub_options());
  CHECK_NOTHROW(load_artifact((tmp.path / "empty").string()));
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename().string().find(".deploy.") != 0);
  for (const char* bad : {"", ".", "./", "..", "/"})
    CHECK_THROWS_WITH_AS(check_artifact_output(bad), doctest::Contains("name"), Error);
}

// The check before the compile and the rename after it are not one step: what appears at the output in
// between (here, from the progress callback) is never replaced or deleted.
TEST_CASE("artifact: a directory created or changed at the output while the compile runs is left as it is") {
  TempDir tmp;
  const KernelCache cache(tmp.path / "cache", true);
  const Plan plan = tiny_plan();
  const fs::path out = tmp.path / "out";
  auto create = [&](const CompileProgress& p) {
    if (p.done != 1) return;
    fs::create_directories(out);
    write_text(out / "notes.txt", "keep me");
  };
  CHECK_THROWS_WITH_AS(compile_plan(plan, out.string(), create, cache, stub_options()),
                       doctest::Contains("was created by something else while this compile ran"), Error);
  CHECK(read_text(out / "notes.txt") == "keep me");
  fs::remove_all(out);

  // An empty directory made meanwhile is refused too (the rename never replaces).
  auto create_empty = [&](const CompileProgress& p) {
    if (p.done == 1) fs::create_directories(out);
  };
  CHECK_THROWS_WITH_AS(compile_plan(plan, out.string(), create_empty, cache, stub_options()),
                       doctest::Contains("was created by something else"), Error);
  fs::remove_all(out);

  // An artifact there that gains a file of someone else's, or is swapped for another directory.
  compile_plan(plan, out.string(), {}, cache, stub_options());
  auto add = [&](const CompileProgress& p) {
    if (p.done == 1) write_text(out / "notes.txt", "keep me");
  };
  CHECK_THROWS_WITH_AS(compile_plan(plan, out.string(), add, cache, stub_options()),
                       doctest::Contains("changed while this compile ran"), Error);
  CHECK(read_text(out / "notes.txt") == "keep me");
  CHECK(fs::exists(out / "manifest.json"));
  fs::remove(out / "notes.txt");
  auto swap = [&](const CompileProgress& p) {
    if (p.done != 1) return;
    fs::rename(out, tmp.path / "moved");
    fs::create_directories(out);
    write_text(out / "notes.txt", "keep me");
  };
  CHECK_THROWS_WITH_AS(compile_plan(plan, out.string(), swap, cache, stub_options()),
                       doctest::Contains("changed while this compile ran"), Error);
  CHECK(read_text(out / "notes.txt") == "keep me");
  CHECK_NOTHROW(load_artifact((tmp.path / "moved").string()));
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename().string().find(".out.") != 0);
}

TEST_CASE("artifact: tfe-plan inspect DIR verifies an artifact on the CPU, and the head it was compiled for") {
  TempDir tmp;
  const HeadHeader h = preset_header("tiny");
  const fs::path head = tmp.path / "h.tfe", other = tmp.path / "other.tfe";
  write_file(head, random_head_bytes(h, 1));
  HeadHeader renamed = h;
  renamed.name = "other";
  write_file(other, random_head_bytes(renamed, 2));
  PlanOptions o;
  o.buckets = {1};
  o.max_steps = 2;
  const Plan plan = make_plan(h, o, {}, HeadFile::open(head.string()).header_sha256());
  const fs::path out = tmp.path / "deploy";
  compile_plan(plan, out.string(), {}, KernelCache(tmp.path / "cache", true), stub_options());

  const ArtifactInfo info = verify_artifact(out.string() + "/", head.string());
  CHECK(info.kernels == plan.specs.size());
  CHECK(info.head_sha256 == plan.head_sha256);
  const auto [rc, text] =
      run_command(fmt::format("{} inspect {}/ --head {}", TFE_PLAN_EXE, out.string(), head.string()));
  CAPTURE(text);
  CHECK(rc == 0);
  CHECK(text.find(fmt::format("verified: manifest, plan.yaml and {} CUBINs match their sha256; compiled for",
                              plan.specs.size())) != std::string::npos);

  const auto [rc2, text2] =
      run_command(fmt::format("{} inspect {} --head {}", TFE_PLAN_EXE, out.string(), other.string()));
  CAPTURE(text2);
  CHECK(rc2 == 1);
  CHECK(text2.find("compiled for the head with sha256 " + plan.head_sha256) != std::string::npos);

  // One flipped byte of a CUBIN: named with both sha256s.
  const fs::path cubin = out / "kernels" / (plan.specs[0].uri() + ".cubin");
  std::string bytes = read_text(cubin);
  bytes[bytes.size() / 2] ^= 1;
  write_text(cubin, bytes);
  const auto [rc3, text3] = run_command(fmt::format("{} inspect {}", TFE_PLAN_EXE, out.string()));
  CAPTURE(text3);
  CHECK(rc3 == 1);
  CHECK(text3.find(cubin.string() + " has sha256") != std::string::npos);
  CHECK_THROWS_WITH_AS(verify_artifact(out.string()), doctest::Contains("the manifest records"), Error);
}
