#include "core/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

void write_atomic(const fs::path& path, std::span<const std::byte> bytes, std::string_view what) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string tmp = (dir / ("." + path.filename().string() + ".tmp-XXXXXX")).string();
  // mkostemp creates the file exclusively (O_EXCL): a name planted there, link or not, is never written.
  Fd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (fd.get() < 0)
    fail("{} {}: cannot create a temporary file in {}: {}", what, path.string(), dir.string(), std::strerror(errno));
  bool committed = false;
  struct Cleanup {
    const std::string& tmp;
    const bool& committed;
    ~Cleanup() {
      if (!committed) ::unlink(tmp.c_str());
    }
  } cleanup{tmp, committed};
  const auto* p = reinterpret_cast<const char*>(bytes.data());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), p + done, std::min<size_t>(bytes.size() - done, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail("{} {}: writing failed after {} of {} bytes: {}", what, path.string(), done, bytes.size(),
           std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  // mkostemp makes 0600; what tfe writes is data that others read.
  if (::fchmod(fd.get(), 0644) != 0) fail("{} {}: chmod: {}", what, path.string(), std::strerror(errno));
  if (::fsync(fd.get()) != 0) fail("{} {}: fsync: {}", what, path.string(), std::strerror(errno));
  if (::close(fd.release()) != 0) fail("{} {}: close: {}", what, path.string(), std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail("{} {}: cannot move the written file into place: {}", what, path.string(), std::strerror(errno));
  committed = true;
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
