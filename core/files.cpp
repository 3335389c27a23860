#include "core/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.h"

namespace tfe::files {

namespace fs = std::filesystem;

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

std::string_view kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

Fd open_regular(const fs::path& path, std::string_view what, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) fail("{} {}: cannot open: {}", what, path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail("{} {}: cannot stat: {}", what, path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{} {}: is {}; give a regular file", what, path.string(), kind_of(st.st_mode));
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    fail("{} {}: fcntl: {}", what, path.string(), std::strerror(errno));
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular(const fs::path& path, std::string_view what, uint64_t max_bytes) {
  uint64_t size = 0;
  const Fd fd = open_regular(path, what, &size);
  if (size > max_bytes)
    fail("{} {}: {} bytes, more than the {} this reader accepts", what, path.string(), size, max_bytes);
  std::string out;
  out.resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      fail("{} {}: reading failed after {} of {} bytes: {}", what, path.string(), done, size, std::strerror(errno));
    if (n == 0) break;  // shrank while read: what is there is what the file now holds
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

namespace {

struct FileId {
  dev_t dev;
  ino_t ino;
};

std::optional<FileId> file_id(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// The input that `out` is, if any: `inputs` as given, or a file directly in an input directory.
std::optional<fs::path> same_file_as(const FileId& out, std::span<const fs::path> inputs) {
  auto same = [&](const fs::path& p) {
    const auto id = file_id(p);
    return id && id->dev == out.dev && id->ino == out.ino;
  };
  for (const fs::path& in : inputs) {
    if (in.empty()) continue;
    if (same(in)) return in;
    std::error_code ec;
    if (!fs::is_directory(in, ec)) continue;
    for (fs::directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
      if (same(it->path())) return it->path();
  }
  return std::nullopt;
}

}  // namespace

void check_output(const fs::path& path, std::string_view what, std::span<const fs::path> inputs) {
  if (path.empty()) fail("{}: names no file", what);
  if (!path.has_filename()) fail("{} {}: ends in '/', a directory; name a file to write", what, path.string());
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      fail("{} {}: is {}; name a regular file or a new name (it would be replaced)", what, path.string(),
           kind_of(st.st_mode));
    if (const auto input = same_file_as(FileId{st.st_dev, st.st_ino}, inputs))
      fail("{} {}: is the command's input {} (the same file); write to another name", what, path.string(),
           input->string());
    return;
  }
  if (errno != ENOENT && errno != ENOTDIR) fail("{} {}: cannot stat: {}", what, path.string(), std::strerror(errno));
  // A new name (or a dangling symlink, which is replaced): its directory must exist.
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0)
    fail("{} {}: directory {} does not exist: {}", what, path.string(), dir.string(), std::strerror(errno));
  if (!S_ISDIR(ds.st_mode)) fail("{} {}: {} is not a directory", what, path.string(), dir.string());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail("{} {}: cannot write into {}: {}", what, path.string(), dir.string(), std::strerror(errno));
}

AtomicWriter::AtomicWriter(const fs::path& path, std::string_view what) : path_(path), what_(what) {
  check_output(path, what);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  tmp_ = (dir / ("." + path.filename().string() + ".tmp-XXXXXX")).string();
  // mkostemp creates the file exclusively (O_EXCL): a name planted there, link or not, is never written.
  fd_ = Fd(::mkostemp(tmp_.data(), O_CLOEXEC));
  if (fd_.get() < 0)
    fail("{} {}: cannot create a temporary file in {}: {}", what, path.string(), dir.string(), std::strerror(errno));
  created_ = true;
}

AtomicWriter::~AtomicWriter() {
  if (created_ && !committed_) ::unlink(tmp_.c_str());
}

void AtomicWriter::write(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd_.get(), p + done, std::min<size_t>(n - done, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail("{} {}: writing failed after {} of {} bytes: {}", what_, path_.string(), done, n, std::strerror(errno));
    done += static_cast<size_t>(w);
  }
}

void AtomicWriter::commit() {
  // mkostemp makes 0600; what tfe writes is data that others read.
  if (::fchmod(fd_.get(), 0644) != 0) fail("{} {}: chmod: {}", what_, path_.string(), std::strerror(errno));
  if (::fsync(fd_.get()) != 0) fail("{} {}: fsync: {}", what_, path_.string(), std::strerror(errno));
  if (::close(fd_.release()) != 0) fail("{} {}: close: {}", what_, path_.string(), std::strerror(errno));
  // Checked again: a device or directory put at `path` since the writer began is refused, not replaced.
  check_output(path_, what_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("{} {}: cannot move the written file into place: {}", what_, path_.string(), std::strerror(errno));
  committed_ = true;
}

void write_atomic(const fs::path& path, std::span<const std::byte> bytes, std::string_view what) {
  AtomicWriter w(path, what);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

void write_atomic(const fs::path& path, std::string_view bytes, std::string_view what) {
  write_atomic(path, std::as_bytes(std::span(bytes.data(), bytes.size())), what);
}

FileLock::FileLock(const fs::path& path, std::string_view what)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644)) {
  if (fd_.get() < 0)
    fail("{} {}: cannot open the lock file: {}{}", what, path.string(), std::strerror(errno),
         errno == ELOOP ? " (it is a symlink; remove it)" : "");
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode))
    fail("{} {}: the lock file is not a regular file; remove it", what, path.string());
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    fail("{} {}: cannot lock: {}", what, path.string(), std::strerror(errno));
  }
}

}  // namespace tfe::files
