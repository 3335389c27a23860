#include "compiler/cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include <tfe/head_file.h>

namespace tfe {

namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> g_hits{0};
std::atomic<uint64_t> g_misses{0};

// Incremental sha256 whose fields are length-prefixed: field("ab").field("c") and field("a").field("bc")
// hash differently, so no two input sets collide by concatenation.
class FieldHasher {
 public:
  FieldHasher() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) fail("sha256: OpenSSL digest init failed");
  }
  FieldHasher& field(std::string_view bytes) {
    const uint64_t n = bytes.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    raw(std::string_view(reinterpret_cast<const char*>(len), sizeof len));
    raw(bytes);
    return *this;
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &n) != 1) fail("sha256: OpenSSL digest final failed");
    std::string s;
    for (unsigned int i = 0; i < n; ++i) s += fmt::format("{:02x}", md[i]);
    return s;
  }

 private:
  void raw(std::string_view bytes) {
    if (EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()) != 1) fail("sha256: OpenSSL digest update failed");
  }
  struct Free {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

std::string cubin_sha256(std::string_view cubin) {
  return sha256_hex(std::as_bytes(std::span(cubin.data(), cubin.size())));
}

// A cache entry's file, or nothing where there is none. Anything but a regular file there is refused.
std::optional<std::string> read_whole(const fs::path& p) {
  constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return std::nullopt;
  return files::read_regular(p, "kernel cache entry", kMaxEntryBytes);
}

// The entry for `key`, or nothing when it is absent or does not read back whole.
std::optional<CompiledKernel> read_entry(const fs::path& dir, const std::string& key, const CompileUnit& unit) {
  const auto meta_text = read_whole(dir / (key + ".json"));
  if (!meta_text) return std::nullopt;
  const auto meta = nlohmann::json::parse(*meta_text, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object()) return std::nullopt;
  try {
    if (meta.at("schema").get<int>() != kCacheSchemaVersion || meta.at("key").get<std::string>() != key ||
        meta.at("uri").get<std::string>() != unit.uri)
      return std::nullopt;
    auto cubin = read_whole(dir / (key + ".cubin"));
    if (!cubin || cubin->size() != meta.at("cubin_bytes").get<uint64_t>() ||
        cubin_sha256(*cubin) != meta.at("cubin_sha256").get<std::string>())
      return std::nullopt;
    CompiledKernel k;
    k.uri = unit.uri;
    k.lowered_name = meta.at("lowered_name").get<std::string>();
    k.cubin = std::move(*cubin);
    k.log = meta.value("log", "");
    // A recorded name the cubin does not define would fail only at load, on the GPU: a miss here.
    if (k.lowered_name.empty() || !cubin_defines_symbol(k.cubin, k.lowered_name)) return std::nullopt;
    return k;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field missing or of the wrong type: rewritten like any bad entry
  }
}

void write_entry(const fs::path& dir, const std::string& key, const std::string& arch, const CompiledKernel& k) {
  // The CUBIN first: the JSON names its sha256, so a reader that finds the new JSON with an old CUBIN (or
  // none) sees a mismatch and recompiles rather than loading the wrong image.
  files::write_atomic(dir / (key + ".cubin"), k.cubin, "kernel cache entry");
  const nlohmann::json meta = {
      {"schema", kCacheSchemaVersion},
      {"key", key},
      {"uri", k.uri},
      {"lowered_name", k.lowered_name},
      {"arch", arch},
      {"nvrtc", nvrtc_version().str()},
      {"cubin_bytes", k.cubin.size()},
      {"cubin_sha256", cubin_sha256(k.cubin)},
      {"log", k.log},
  };
  files::write_atomic(dir / (key + ".json"), meta.dump(2) + "\n", "kernel cache entry");
}

}  // namespace

fs::path default_cache_root() {
  if (const char* d = std::getenv("TFE_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "tfe";
  if (const char* d = std::getenv("HOME"); d && *d) return fs::path(d) / ".cache" / "tfe";
  fail("kernel cache: none of TFE_CACHE_DIR, XDG_CACHE_HOME, HOME is set; set TFE_CACHE_DIR to a writable directory");
}

std::string cache_key(const CompileUnit& unit, const CompileOptions& options) {
  FieldHasher h;
  h.field("tfe-kernel-cache").field(std::to_string(kCacheSchemaVersion)).field(nvrtc_version().str());
  h.field(options.arch);
  const auto opts = nvrtc_options(options);
  h.field(std::to_string(opts.size()));
  for (const auto& o : opts) h.field(o);
  h.field(unit.source).field(unit.name_expression);
  h.field(std::to_string(options.headers.size()));
  for (const auto& s : options.headers) h.field(s.name).field(s.text);
  return h.hex();
}

CacheCounters cache_counters() { return {g_hits.load(), g_misses.load()}; }

KernelCache::KernelCache(fs::path root, bool jit) : root_(std::move(root)), jit_(jit) {
  if (root_.empty()) fail("kernel cache: empty root directory");
}

KernelCache KernelCache::from_environment() {
  bool jit = true;
  if (const char* j = std::getenv("TFE_JIT"); j && *j) {
    const std::string_view v = j;
    if (v == "off")
      jit = false;
    else if (v != "on")
      fail("TFE_JIT is `{}`; expected `on` or `off`", v);
  }
  return KernelCache(default_cache_root(), jit);
}

fs::path KernelCache::dir(const std::string& arch) const {
  return root_ / fmt::format("v{}", kCacheSchemaVersion) / arch;
}

CachedKernel KernelCache::get(const CompileUnit& unit, const CompileOptions& options) const {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  CachedKernel r;
  r.key = cache_key(unit, options);
  const fs::path d = dir(options.arch);
  auto hit = [&](CompiledKernel k) {
    ++g_hits;
    r.kernel = std::move(k);
    r.hit = true;
    r.ms = elapsed_ms();
    return r;
  };
  if (auto k = read_entry(d, r.key, unit)) return hit(std::move(*k));
  if (!jit_)
    fail(
        "kernel cache: {} is not cached (key {} under {}) and TFE_JIT=off forbids compiling it; compile it with "
        "TFE_JIT=on or ship an artifact from `tfe-plan compile`",
        unit.uri, r.key, d.string());
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec)
    fail("kernel cache: cannot create {}: {}; set TFE_CACHE_DIR to a writable directory", d.string(), ec.message());
  const files::FileLock lock(d / (r.key + ".lock"), "kernel cache");
  // Another writer may have stored it while this one waited for the lock.
  if (auto k = read_entry(d, r.key, unit)) return hit(std::move(*k));
  ++g_misses;
  r.kernel = compile_unit(unit, options);
  write_entry(d, r.key, options.arch, r.kernel);
  r.ms = elapsed_ms();
  return r;
}

}  // namespace tfe
