// NVRTC compile and the kernel cache, on a small source set of the test's own (not kernels/*.cuh), so
// these tests hold whatever the real kernels are.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "compiler/cache.h"
#include "compiler/nvrtc.h"
#include "plan/error.h"

namespace fs = std::filesystem;
using namespace tfe;

namespace {

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tfe-compiler-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) FAIL("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

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
  return {"axpy", "axpy.cuh", "tfe::test::axpy", {"N", "SCALE"},
          {{"y", ParamKind::ptr}, {"x", ParamKind::ptr}, {"n", ParamKind::i64}}};
}

// Constants drawn fresh each run: any specialization must compile, not one remembered one.
KernelSpec random_spec() {
  static std::mt19937_64 rng(std::random_device{}());
  return KernelSpec{"axpy", {{"N", 32 * static_cast<int64_t>(1 + rng() % 8)}, {"SCALE", 2 + static_cast<int64_t>(rng() % 1000)}}};
}

CompileOptions test_options() {
  CompileOptions o;
  o.headers = test_sources();
  return o;
}

bool has_elf_magic(const std::string& cubin) { return cubin.size() > 4 && cubin.compare(0, 4, "\x7f" "ELF") == 0; }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
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
  CHECK_THROWS_WITH_AS(cubin_defines_symbol(std::string(96, 'x'),
                                            k.lowered_name),
                       doctest::Contains("no ELF magic"), Error);
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
  CHECK(read_file(entry.string() + ".json").find(unit.uri) != std::string::npos);

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

  std::string bytes = read_file(cubin);
  bytes[bytes.size() / 2] ^= 0x5a;
  std::ofstream(cubin, std::ios::binary | std::ios::trunc) << bytes;
  expect_recompile("flipped byte in the cubin");

  std::ofstream(json, std::ios::trunc) << "{\"schema\": 1, \"key\": ";
  expect_recompile("truncated json");

  std::ofstream(json, std::ios::trunc) << "{\"schema\": 1}";
  expect_recompile("json missing fields");

  fs::remove(cubin);
  expect_recompile("cubin missing");
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
