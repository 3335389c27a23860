// Reading and writing files safely. Readers open only regular files, without blocking on a FIFO; writers
// go through a temporary created exclusively beside the target and renamed over it, so a reader sees the
// old file or the new one, never a part, and a failure leaves the target as it was. `what` names the
// file's role in messages ("head file", "config.json").
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace tfe::files {

// An open file descriptor, closed with the object.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Opens `path` read-only if it is a regular file (a FIFO, device, socket or directory is refused by name
// without blocking). `size`, when given, receives the file's size.
Fd open_regular(const std::filesystem::path& path, std::string_view what, uint64_t* size = nullptr);

// The whole of a regular file of at most `max_bytes` bytes.
std::string read_regular(const std::filesystem::path& path, std::string_view what, uint64_t max_bytes);

// Writes `bytes` to `path` atomically (see above), mode 0644, synced before the rename. A symlink at
// `path` is replaced, never followed.
void write_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes, std::string_view what);
void write_atomic(const std::filesystem::path& path, std::string_view bytes, std::string_view what);

// An exclusive advisory lock on `path`, held for the object's life. The lock file is created if missing;
// a symlink there is refused, never followed.
class FileLock {
 public:
  FileLock(const std::filesystem::path& path, std::string_view what);

 private:
  Fd fd_;
};

}  // namespace tfe::files
