// core/files.h: readers that refuse what is not a regular file without blocking, writes that never follow
// a planted name, locks that never create through a symlink.
#include <sys/stat.h>

#include <doctest/doctest.h>

#include "core/files.h"
#include "tests/test_util.h"

using namespace tfe;
using namespace tfe::test;
namespace fs = std::filesystem;

TEST_CASE("files: a FIFO, a directory or a missing file is refused by name, at once") {
  TempDir tmp;
  const fs::path fifo = tmp.path / "head.tfe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Without O_NONBLOCK this open would wait for a writer forever (ctest's timeout would catch it).
  CHECK_THROWS_WITH_AS(files::open_regular(fifo, "head file"), doctest::Contains("is a FIFO; give a regular file"),
                       Error);
  const std::string dir_message = "config.json " + tmp.path.string() + ": is a directory";
  CHECK_THROWS_WITH_AS(files::read_regular(tmp.path, "config.json", 1 << 20), doctest::Contains(dir_message.c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(files::read_regular(tmp.path / "missing", "config.json", 1 << 20),
                       doctest::Contains("cannot open: No such file"), Error);
}

TEST_CASE("files: read_regular returns the file and refuses one over its limit") {
  TempDir tmp;
  write_text(tmp.path / "a", "hello");
  CHECK(files::read_regular(tmp.path / "a", "x", 5) == "hello");
  CHECK_THROWS_WITH_AS(files::read_regular(tmp.path / "a", "x", 4),
                       doctest::Contains("5 bytes, more than the 4 this reader accepts"), Error);
}

TEST_CASE("files: write_atomic replaces a symlink at the target, never the file it points to") {
  TempDir tmp;
  write_text(tmp.path / "victim", "keep me");
  fs::create_symlink(tmp.path / "victim", tmp.path / "out.yaml");
  files::write_atomic(tmp.path / "out.yaml", std::string_view("new"), "plan");
  CHECK(read_text(tmp.path / "victim") == "keep me");
  CHECK_FALSE(fs::is_symlink(tmp.path / "out.yaml"));
  CHECK(read_text(tmp.path / "out.yaml") == "new");
  CHECK((fs::status(tmp.path / "out.yaml").permissions() & fs::perms::others_read) != fs::perms::none);
  // Nothing but the two files: the temporary is gone.
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path)) ++n;
  CHECK(n == 2);
}

TEST_CASE("files: a write that cannot finish leaves the target as it was and no temporary") {
  TempDir tmp;
  write_text(tmp.path / "out", "old");
  CHECK_THROWS_WITH_AS(files::write_atomic(tmp.path / "missing-dir" / "out", std::string_view("x"), "plan"),
                       doctest::Contains("cannot create a temporary file"), Error);
  // A target that is a directory: the rename fails after the write; the temporary goes.
  fs::create_directories(tmp.path / "dir" / "sub");
  CHECK_THROWS_WITH_AS(files::write_atomic(tmp.path / "dir", std::string_view("x"), "plan"),
                       doctest::Contains("cannot move the written file into place"), Error);
  CHECK(read_text(tmp.path / "out") == "old");
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path)) ++n;
  CHECK(n == 2);
}

TEST_CASE("files: a lock file that is a dangling symlink is refused, and its target is not created") {
  TempDir tmp;
  fs::create_symlink(tmp.path / "created-through-link", tmp.path / "k.lock");
  CHECK_THROWS_WITH_AS(files::FileLock(tmp.path / "k.lock", "kernel cache"), doctest::Contains("is a symlink"), Error);
  CHECK_FALSE(fs::exists(tmp.path / "created-through-link"));
  CHECK_NOTHROW(files::FileLock(tmp.path / "ok.lock", "kernel cache"));
}
