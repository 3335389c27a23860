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

// The rule every writer of a file follows (each command's -o, each Python writer), checked before any
// work: `path` names a regular file, which is replaced whole, or a new name in an existing directory. A
// directory, device, FIFO or socket is refused by kind (a symlink by what it points at; the link itself
// would be replaced), and so is any of `inputs`: the same file (device and inode) under any name. An input
// that is a directory stands for every file directly in it (a checkpoint's). `what` names the argument
// ("-o", "out").
void check_output(const std::filesystem::path& path, std::string_view what,
                  std::span<const std::filesystem::path> inputs = {});

// A file written under the rule above: created as a temporary beside `path` (exclusively, so a name planted
// there is never written), mode 0644, synced and renamed over `path` by commit(). Destroyed uncommitted,
// it removes the temporary and leaves `path` as it was.
class AtomicWriter {
 public:
  AtomicWriter(const std::filesystem::path& path, std::string_view what);
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter();
  void write(const void* data, size_t n);
  void commit();

 private:
  std::filesystem::path path_;
  std::string what_;
  std::string tmp_;
  Fd fd_;
  bool created_ = false;
  bool committed_ = false;
};

// Writes `bytes` to `path` through an AtomicWriter. A symlink at `path` is replaced, never followed.
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
