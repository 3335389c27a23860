#include "compiler/artifact.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include <tfe/head_file.h>
#include "plan/plan_yaml.h"

namespace tfe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kPlanFile = "plan.yaml";
constexpr const char* kKernelsDir = "kernels";

std::string sha256_of(std::string_view bytes) {
  return sha256_hex(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

// Largest file of an artifact that is read (a cubin, plan.yaml, manifest.json).
constexpr uint64_t kMaxArtifactFileBytes = uint64_t{1} << 30;

std::string read_file(const fs::path& p) { return files::read_regular(p, "artifact file", kMaxArtifactFileBytes); }

// A file the manifest names: relative and inside the artifact, whatever the manifest says.
fs::path member(const fs::path& dir, const fs::path& manifest, const std::string& file) {
  const fs::path rel = fs::path(file).lexically_normal();
  if (file.empty() || rel.is_absolute() || *rel.begin() == "..")
    fail("artifact: {} names file `{}`, which is not inside the artifact", manifest.string(), file);
  return dir / rel;
}

// What `compile -o` may replace, found before any work: an empty directory, or one holding a tfe artifact
// whose manifest parses and names every file in it (relative paths, the directories above them). The
// directory's identity is kept so that the one moved aside at the end is known to be this one.
struct Replaceable {
  dev_t dev = 0;
  ino_t ino = 0;
  std::set<std::string> files;  // relative to the directory, manifest.json included
  std::set<std::string> dirs;   // the directories above those files
};

// The files an artifact's manifest names (manifest.json, plan.yaml, the CUBINs), relative to `dir`.
std::set<std::string> manifest_files(const fs::path& dir) {
  const fs::path manifest_path = dir / kManifest;
  const auto m = nlohmann::json::parse(read_file(manifest_path), nullptr, /*allow_exceptions=*/false);
  std::set<std::string> out = {kManifest};
  auto add = [&](const nlohmann::json& entry) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string())
      fail("artifact: {} is not a tfe artifact's manifest (an entry without a `file`); give an empty or new directory",
           manifest_path.string());
    out.insert(member(dir, manifest_path, entry["file"].get<std::string>()).lexically_relative(dir).generic_string());
  };
  if (!m.is_object() || !m.contains("artifact_schema") || !m.contains("plan") || !m.contains("kernels") ||
      !m["kernels"].is_array())
    fail("artifact: {} does not parse as a tfe artifact's manifest; give an empty or new directory",
         manifest_path.string());
  add(m["plan"]);
  for (const auto& k : m["kernels"]) add(k);
  return out;
}

// The output of `compile` must be a directory this command owns: missing, empty, or an earlier artifact.
// Anything else is refused before any work, so that nothing the command does not own is replaced.
std::optional<Replaceable> check_output_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) {
    // Missing directories above it are made; the nearest one that exists must be a writable directory.
    fs::path existing = parent;
    while (!fs::exists(fs::symlink_status(existing, ec)) && existing.has_parent_path() &&
           existing.parent_path() != existing)
      existing = existing.parent_path();
    if (!fs::is_directory(existing, ec))
      fail("artifact: cannot create {}: {} is not a directory", dir.string(), existing.string());
    if (::access(existing.c_str(), W_OK | X_OK) != 0)
      fail("artifact: cannot create {}: {} is not writable", dir.string(), existing.string());
    return std::nullopt;
  }
  if (fs::is_symlink(st))
    fail("artifact: {} is a symlink; give the directory it points to ({})", dir.string(),
         fs::read_symlink(dir, ec).string());
  if (!fs::is_directory(st)) fail("artifact: {} exists and is not a directory", dir.string());
  struct stat ds {};
  if (::lstat(dir.c_str(), &ds) != 0) fail("artifact: cannot stat {}: {}", dir.string(), std::strerror(errno));
  Replaceable r{ds.st_dev, ds.st_ino, {}, {}};
  if (!fs::is_empty(dir, ec)) {
    if (!fs::exists(fs::symlink_status(dir / kManifest, ec)))
      fail("artifact: {} is not empty and holds no {}; give an empty or new directory", dir.string(), kManifest);
    r.files = manifest_files(dir);
    for (const std::string& f : r.files)
      for (fs::path up = fs::path(f).parent_path(); !up.empty(); up = up.parent_path())
        r.dirs.insert(up.generic_string());
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const std::string rel = it->path().lexically_relative(dir).generic_string();
      const fs::file_status s = it->symlink_status(ec);
      const bool named = fs::is_directory(s) ? r.dirs.count(rel) > 0 : fs::is_regular_file(s) && r.files.count(rel) > 0;
      if (!named)
        fail("artifact: {} holds `{}`, which its {} does not name; give an empty or new directory", dir.string(), rel,
             kManifest);
    }
    if (ec) fail("artifact: cannot list {}: {}", dir.string(), ec.message());
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    fail("artifact: cannot replace {}: its parent {} is not writable", dir.string(), parent.string());
  return r;
}

// Removes what a replaced artifact held, by name: the files its manifest named, then the directories
// above them, then itself. Anything else found there by then stays (rmdir fails on it).
void remove_owned(const fs::path& dir, const Replaceable& r) {
  for (const std::string& f : r.files) ::unlink((dir / f).c_str());
  for (auto it = r.dirs.rbegin(); it != r.dirs.rend(); ++it) ::rmdir((dir / *it).c_str());
  ::rmdir(dir.c_str());
}

// A new artifact is written into a directory beside the target and renamed into place, so that a failure
// at any point leaves the old artifact loadable. The directory is removed unless it was moved into place.
class StagingDir {
 public:
  explicit StagingDir(const fs::path& target) {
    const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string tmpl = (parent / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
    if (!::mkdtemp(tmpl.data()))
      fail("artifact: cannot create a directory beside {}: {}", target.string(), std::strerror(errno));
    path_ = tmpl;
    std::error_code ec;
    fs::create_directory(path_ / kKernelsDir, ec);
    if (ec) fail("artifact: cannot create {}: {}", (path_ / kKernelsDir).string(), ec.message());
    // mkdtemp makes 0700; an artifact is read by whoever serves.
    fs::permissions(path_,
                    fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                        fs::perms::others_exec,
                    ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

  // Puts the staged artifact at `target`, each step a rename that refuses to replace what it did not
  // check: to a missing target, a rename that fails if anything appeared there (RENAME_NOREPLACE); over
  // `old`, an exchange (RENAME_EXCHANGE) after which the directory now here must be `old` itself (same
  // inode, still holding only what its manifest names), else the exchange is undone and nothing is lost.
  void swap_into(const fs::path& target, const std::optional<Replaceable>& old) {
    if (!old) {
      if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
        path_.clear();
        return;
      }
      if (errno == EEXIST || errno == ENOTEMPTY)
        fail(
            "artifact: {} was created by something else while this compile ran; it was left as it is (run again "
            "to replace it, if it is an artifact)",
            target.string());
      // A file system without RENAME_NOREPLACE: a plain rename, which replaces at most an empty directory.
      if ((errno != EINVAL && errno != ENOSYS) || ::rename(path_.c_str(), target.c_str()) != 0)
        fail("artifact: cannot move the new artifact into place as {}: {}", target.string(), std::strerror(errno));
      path_.clear();
      return;
    }
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS)
        fail("artifact: cannot swap the new artifact into {}: {}", target.string(), std::strerror(errno));
      swap_by_renames(target, *old);
      return;
    }
    // The directory that was at `target` is now at path_.
    if (!still_owned(path_, *old)) {
      const int undo = ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE);
      fail("artifact: {} changed while this compile ran (it is not the artifact checked before); {}", target.string(),
           undo == 0 ? "it was left as it is" : fmt::format("it is now at {}", path_.string()));
    }
    remove_owned(path_, *old);
    path_.clear();
  }

 private:
  static bool still_owned(const fs::path& dir, const Replaceable& old) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || st.st_dev != old.dev || st.st_ino != old.ino) return false;
    try {
      const std::optional<Replaceable> now = check_output_dir(dir);
      return now && now->files == old.files;
    } catch (const Error&) {
      return false;
    }
  }

  // Without the exchange: the old artifact steps aside to a name of ours, is checked there, and comes back
  // on any failure.
  void swap_by_renames(const fs::path& target, const Replaceable& old) {
    const fs::path aside = fs::path(path_.string() + ".old");
    if (::rename(target.c_str(), aside.c_str()) != 0)
      fail("artifact: cannot move the old artifact {} aside: {}", target.string(), std::strerror(errno));
    if (!still_owned(aside, old)) {
      ::rename(aside.c_str(), target.c_str());
      fail("artifact: {} changed while this compile ran (it is not the artifact checked before); it was left as it is",
           target.string());
    }
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      const int err = errno;
      ::rename(aside.c_str(), target.c_str());
      fail("artifact: cannot move the new artifact into place as {}: {}", target.string(), std::strerror(err));
    }
    path_.clear();
    remove_owned(aside, old);
  }

  fs::path path_;
};

fs::path cubin_path(const fs::path& dir, std::string_view uri) {
  return dir / kKernelsDir / fmt::format("{}.cubin", uri);
}

// Compiles `units` on a pool of threads; results in `units` order. Stops handing out work after the
// first error and rethrows it once every worker has returned.
std::vector<CachedKernel> compile_all(const std::vector<CompileUnit>& units, const KernelCache& cache,
                                      const CompileOptions& options, const ProgressFn& progress) {
  std::vector<CachedKernel> out(units.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;  // guards `error`, `done` and the progress callback
  size_t done = 0;
  auto work = [&] {
    while (!failed) {
      const size_t i = next++;
      if (i >= units.size()) return;
      try {
        out[i] = cache.get(units[i], options);
        const std::lock_guard lock(mu);
        ++done;
        if (progress) progress({done, units.size(), units[i].uri, out[i].hit, out[i].ms});
      } catch (...) {
        const std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, std::max<size_t>(units.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace

const ArtifactKernel& Artifact::kernel(std::string_view uri) const {
  for (const auto& k : kernels)
    if (k.uri == uri) return k;
  fail("artifact: no kernel `{}` (the plan names {} specializations)", uri, kernels.size());
}

fs::path artifact_output_dir(const std::string& out_dir) {
  if (out_dir.empty()) fail("artifact: the output directory is empty; name a directory");
  if (out_dir.find('\0') != std::string::npos) fail("artifact: the output directory holds a NUL byte");
  // "deploy/" and "deploy" are one directory; the rename steps need it without the trailing separator.
  fs::path dir = fs::path(out_dir).lexically_normal();
  while (!dir.has_filename() && dir.has_relative_path()) dir = dir.parent_path();
  const std::string name = dir.filename().string();
  if (name.empty() || name == "." || name == "..")
    fail("artifact: {} names no directory that can be replaced; name one inside it (e.g. {}/deploy)", out_dir, out_dir);
  return dir;
}

void check_artifact_output(const std::string& out_dir) { (void)check_output_dir(artifact_output_dir(out_dir)); }

std::string format_progress(const CompileProgress& p) {
  return fmt::format("[{}/{}] {}... ({}, {:.0f} ms)", p.done, p.total, p.uri, p.hit ? "hit" : "miss", p.ms);
}

CompileSummary compile_plan(const Plan& plan, const std::string& out_dir, const ProgressFn& progress,
                            const KernelCache& cache, const CompileOptions& base_options) {
  const auto t0 = std::chrono::steady_clock::now();
  CompileOptions options = base_options;
  options.arch = plan.options.arch;
  nvrtc_options(options);  // refuses a bad arch before any work
  const fs::path dir = artifact_output_dir(out_dir);
  const std::optional<Replaceable> old = check_output_dir(dir);

  std::vector<CompileUnit> units;
  for (const auto& s : plan.specs) units.push_back(make_compile_unit(s));
  const std::vector<CachedKernel> compiled = compile_all(units, cache, options, progress);

  if (dir.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(dir.parent_path(), ec);
    if (ec) fail("artifact: cannot create {}: {}", dir.parent_path().string(), ec.message());
  }
  StagingDir staging(dir);
  const std::string plan_yaml = dump_plan_yaml(plan);
  files::write_atomic(staging.path() / kPlanFile, plan_yaml, "artifact file");

  CompileSummary summary;
  summary.specs = plan.specs.size();
  summary.out_dir = out_dir;
  nlohmann::json kernels = nlohmann::json::array();
  for (size_t i = 0; i < plan.specs.size(); ++i) {
    const CachedKernel& c = compiled[i];
    (c.hit ? summary.hits : summary.misses) += 1;
    const fs::path p = cubin_path(staging.path(), c.kernel.uri);
    files::write_atomic(p, c.kernel.cubin, "artifact file");
    kernels.push_back({{"uri", c.kernel.uri},
                       {"kernel", plan.specs[i].kernel},
                       {"lowered_name", c.kernel.lowered_name},
                       {"file", fs::relative(p, staging.path()).string()},
                       {"sha256", sha256_of(c.kernel.cubin)},
                       {"bytes", c.kernel.cubin.size()}});
  }
  const nlohmann::json manifest = {
      {"artifact_schema", kArtifactSchemaVersion},
      {"plan_schema", plan.schema_version},
      {"arch", options.arch},
      {"nvrtc_version", nvrtc_version().str()},
      {"cuda_toolkit", cuda_toolkit_version()},
      {"head_sha256", plan.head_sha256},
      {"plan", {{"file", kPlanFile}, {"sha256", sha256_of(plan_yaml)}, {"bytes", plan_yaml.size()}}},
      {"kernels", kernels},
  };
  files::write_atomic(staging.path() / kManifest, manifest.dump(2) + "\n", "artifact file");
  staging.swap_into(dir, old);
  summary.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

CompileSummary compile_plan(const Plan& plan, const std::string& out_dir, const ProgressFn& progress) {
  return compile_plan(plan, out_dir, progress, KernelCache::from_environment());
}

Artifact load_artifact(const std::string& dir_str) {
  const fs::path dir = dir_str;
  const fs::path manifest_path = dir / kManifest;
  if (!fs::exists(manifest_path))
    fail("artifact {}: no {} (not an artifact, or its compile did not finish)", dir.string(), kManifest);
  const auto m = nlohmann::json::parse(read_file(manifest_path), nullptr, /*allow_exceptions=*/false);
  if (!m.is_object()) fail("artifact: {} is not a JSON object", manifest_path.string());

  Artifact a;
  try {
    const int schema = m.at("artifact_schema").get<int>();
    if (schema != kArtifactSchemaVersion)
      fail("artifact: {} has artifact_schema {}, this build reads {}; recompile with `tfe-plan compile`",
           manifest_path.string(), schema, kArtifactSchemaVersion);
    a.arch = m.at("arch").get<std::string>();
    a.nvrtc_version = m.at("nvrtc_version").get<std::string>();

    const auto& pm = m.at("plan");
    const fs::path plan_path = member(dir, manifest_path, pm.at("file").get<std::string>());
    const std::string plan_yaml = read_file(plan_path);
    const std::string plan_sha = sha256_of(plan_yaml);
    if (plan_sha != pm.at("sha256").get<std::string>())
      fail("artifact: {} has sha256 {}, the manifest records {}", plan_path.string(), plan_sha,
           pm.at("sha256").get<std::string>());
    a.plan = load_plan_yaml(plan_yaml);
    const std::string head_sha = m.at("head_sha256").get<std::string>();
    if (a.plan.head_sha256 != head_sha)
      fail("artifact: {} is for head {}, the manifest records head {}", plan_path.string(), a.plan.head_sha256,
           head_sha);
    if (a.plan.options.arch != a.arch)
      fail("artifact: {} plans for {}, the manifest's CUBINs are for {}", plan_path.string(), a.plan.options.arch,
           a.arch);

    const auto& ks = m.at("kernels");
    if (!ks.is_array()) fail("artifact: {}: `kernels` is not an array", manifest_path.string());
    if (ks.size() != a.plan.specs.size())
      fail("artifact: {} lists {} kernels, the plan names {} specializations", manifest_path.string(), ks.size(),
           a.plan.specs.size());
    for (size_t i = 0; i < ks.size(); ++i) {
      const auto& k = ks[i];
      ArtifactKernel ak;
      ak.uri = k.at("uri").get<std::string>();
      ak.kernel = k.at("kernel").get<std::string>();
      ak.lowered_name = k.at("lowered_name").get<std::string>();
      ak.sha256 = k.at("sha256").get<std::string>();
      const auto& spec = a.plan.specs[i];
      if (ak.uri != spec.uri() || ak.kernel != spec.kernel)
        fail("artifact: {} kernel {} is `{}`, the plan's specialization {} is `{}`", manifest_path.string(), i, ak.uri,
             i, spec.uri());
      const fs::path p = member(dir, manifest_path, k.at("file").get<std::string>());
      ak.cubin = read_file(p);
      const uint64_t bytes = k.at("bytes").get<uint64_t>();
      if (ak.cubin.size() != bytes)
        fail("artifact: {} has {} bytes, the manifest records {}", p.string(), ak.cubin.size(), bytes);
      if (const std::string sha = sha256_of(ak.cubin); sha != ak.sha256)
        fail("artifact: {} has sha256 {}, the manifest records {}", p.string(), sha, ak.sha256);
      if (!cubin_defines_symbol(ak.cubin, ak.lowered_name))
        fail("artifact: {} does not define {} (the lowered name of {})", p.string(), ak.lowered_name, ak.uri);
      a.kernels.push_back(std::move(ak));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("artifact: {}: {}", manifest_path.string(), e.what());
  }
  return a;
}

}  // namespace tfe
