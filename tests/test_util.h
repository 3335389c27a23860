// Helpers shared by the CPU tests: a complete random head in memory and temporary files.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include <tfe/head_file.h>
#include <tfe/header.h>
#include "core/numeric.h"

namespace tfe::test {

// Marks the running test case skipped (an optional tool is missing) and prints why; the caller returns
// right after and checks nothing. A run whose cases all skipped exits 77, which ctest reports as
// "Skipped" rather than "Passed" (tests/main.cpp).
void skip(const std::string& why);

// Runs a shell command; its exit status (-1 when it did not exit normally, or could not start) and what it
// printed, stdout and stderr together.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed: " + cmd};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The bytes of `n` values of type T.
template <typename T>
std::vector<std::byte> to_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Random contents for one tensor of a head. Linears ~ N(0, 1/K) (K = fan-in), norm weights 1 + N(0, 0.05^2),
// embed ~ N(0, 1), d2t a sorted random choice of draft_vocab distinct target ids, FP8 forms random finite
// e4m3 codes with positive scales. No value is zero, so that a byte lost or misplaced shows.
inline std::vector<std::byte> random_tensor(const HeadHeader& h, const TensorSpec& spec, std::mt19937_64& rng) {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  if (spec.name == "d2t") {
    std::vector<int32_t> ids(static_cast<size_t>(h.vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<size_t>(n));
    std::sort(ids.begin(), ids.end());
    for (int32_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] -= i;
    return to_bytes(ids);
  }
  switch (spec.dtype) {
    case DType::BF16: {
      const bool norm = spec.shape.size() == 1;
      const double std = spec.name == "embed" ? 1.0 : norm ? 0.05 : 1.0 / std::sqrt(double(spec.shape[1]));
      std::normal_distribution<float> dist(norm ? 1.0f : 0.0f, static_cast<float>(std));
      std::vector<bf16_bits> v(static_cast<size_t>(n));
      for (auto& x : v) {
        do x = float_to_bf16(dist(rng));
        while ((x & 0x7fff) == 0);
      }
      return to_bytes(v);
    }
    case DType::F8_E4M3: {
      std::uniform_int_distribution<int> code(1, 0x7e);  // finite, non-zero magnitudes
      std::vector<uint8_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = static_cast<uint8_t>(code(rng) | (rng() & 1 ? 0x80 : 0));
      return to_bytes(v);
    }
    case DType::F32: {
      std::uniform_real_distribution<float> dist(1e-4f, 1e-2f);
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = dist(rng);
      return to_bytes(v);
    }
    default:
      fail("random_tensor: no random fill for {} tensor `{}`", dtype_name(spec.dtype), spec.name);
  }
}

// A complete, valid .tfe image of a random head with this header (FP8 forms included when header.fp8
// lists them). Tensors are laid out by element size, largest first, so that every tensor is aligned to its
// element whatever the dims (as the safetensors package lays out its files).
inline std::vector<std::byte> random_head_bytes(const HeadHeader& h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto specs = expected_tensors(h);
  std::stable_sort(specs.begin(), specs.end(),
                   [](const TensorSpec& a, const TensorSpec& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  HeadWriter w(h);
  for (const auto& spec : specs) w.add(spec.name, spec.dtype, spec.shape, random_tensor(h, spec, rng));
  return w.serialize();
}

// A directory private to this test process, created on first use and removed at exit.
inline const std::filesystem::path& temp_dir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("tfe_tests_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;  // never throw at exit
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// The bytes of the file at `path` (empty where it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Writes `text` to `path`, replacing what was there.
inline void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) fail("write_text: cannot write {}", path.string());
}

// A fresh directory of its own under the system temp dir, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tfe-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) fail("TempDir: mkdtemp failed for {}", tmpl);
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor
    std::filesystem::remove_all(path, ec);
  }
};

// Replaces the file at `path` with `bytes`.
inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) fail("write_file: cannot write {}", path.string());
}

// Writes `bytes` to temp_dir()/name and returns the path.
inline std::string write_temp_file(std::span<const std::byte> bytes, const std::string& name) {
  const auto path = temp_dir() / name;
  write_file(path, bytes);
  return path.string();
}

}  // namespace tfe::test
