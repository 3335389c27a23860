// The on-disk kernel cache: content-addressed CUBINs, so a specialization is compiled once per machine.
//
// Layout: <root>/v<kCacheSchemaVersion>/<arch>/<key>.cubin and <key>.json ({uri, lowered_name, key,
// cubin sha256 and bytes}). The key is a sha256 over every input of the compile: the cache schema, the
// NVRTC version, the arch, the options, the generated source, the name expression and every header's name
// and text, each field length-prefixed so no two input sets hash the same bytes.
//
// Writes go to a temporary file in the same directory and are renamed into place, under an advisory lock
// per key (flock on <key>.lock, an empty file left in place: removing it would race with a waiter) so that
// two writers, threads or processes, do not compile the same unit twice. An entry
// that does not read back whole (truncated CUBIN, bad JSON, sha256 mismatch) is a miss and is rewritten.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "compiler/nvrtc.h"

namespace tfe {

// Bump when the entry layout or the key's fields change: old entries are then never read.
inline constexpr int kCacheSchemaVersion = 1;

// $TFE_CACHE_DIR, else $XDG_CACHE_HOME/tfe, else $HOME/.cache/tfe. Throws when none is set.
std::filesystem::path default_cache_root();

// Hex sha256 over every input of compile_unit(unit, options).
std::string cache_key(const CompileUnit& unit, const CompileOptions& options);

// Process-wide lookups since start (or the last reset), over every KernelCache.
struct CacheCounters {
  uint64_t hits = 0;
  uint64_t misses = 0;
};
CacheCounters cache_counters();

struct CachedKernel {
  CompiledKernel kernel;
  std::string key;
  bool hit = false;
  double ms = 0;  // wall time of the lookup, the compile included on a miss
};

class KernelCache {
 public:
  // `jit` false: a miss is an error instead of a compile (deployments that must not compile).
  KernelCache(std::filesystem::path root, bool jit);
  // default_cache_root(), and jit unless $TFE_JIT is "off".
  static KernelCache from_environment();

  const std::filesystem::path& root() const { return root_; }
  bool jit() const { return jit_; }
  // The directory holding the entries for `arch`.
  std::filesystem::path dir(const std::string& arch) const;

  // The unit's CUBIN from the cache, compiling and storing it on a miss. Thread-safe.
  CachedKernel get(const CompileUnit& unit, const CompileOptions& options) const;

 private:
  std::filesystem::path root_;
  bool jit_;
};

}  // namespace tfe
