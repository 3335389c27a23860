// core/files.h: readers that refuse what is not a regular file without blocking, writes that never follow
// a planted name, locks that never create through a symlink.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

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
                       doctest::Contains("missing-dir does not exist"), Error);
  fs::create_directories(tmp.path / "dir" / "sub");
  CHECK_THROWS_WITH_AS(files::write_atomic(tmp.path / "dir", std::string_view("x"), "plan"),
                       doctest::Contains("is a directory; name a regular file or a new name"), Error);
  // A directory put at the target while the writer ran: refused at the commit, the temporary goes.
  {
    files::AtomicWriter w(tmp.path / "late", "plan");
    w.write("x", 1);
    fs::create_directories(tmp.path / "late" / "sub");
    CHECK_THROWS_WITH_AS(w.commit(), doctest::Contains("is a directory"), Error);
  }
  CHECK(fs::is_directory(tmp.path / "late" / "sub"));
  CHECK(read_text(tmp.path / "out") == "old");
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path)) ++n;
  CHECK(n == 3);
}

TEST_CASE("files: the output rule takes a regular file or a new name, and refuses every other kind") {
  TempDir tmp;
  const std::string_view x = "x";
  // A regular file is replaced; a new name is created.
  write_text(tmp.path / "old", "old");
  files::write_atomic(tmp.path / "old", x, "-o");
  CHECK(read_text(tmp.path / "old") == "x");
  files::write_atomic(tmp.path / "new", x, "-o");
  CHECK(read_text(tmp.path / "new") == "x");
  // A character device, named directly or through a symlink: refused before any temporary is made.
  CHECK_THROWS_WITH_AS(files::check_output("/dev/null", "-o"),
                       doctest::Contains("-o /dev/null: is a character device; name a regular file"), Error);
  fs::create_symlink("/dev/null", tmp.path / "null-link");
  CHECK_THROWS_WITH_AS(files::write_atomic(tmp.path / "null-link", x, "-o"), doctest::Contains("a character device"),
                       Error);
  CHECK(fs::is_symlink(tmp.path / "null-link"));
  // A FIFO is refused by kind (and would not have been replaced), a name ending in '/' or under a file too.
  REQUIRE(::mkfifo((tmp.path / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(files::write_atomic(tmp.path / "fifo", x, "out"), doctest::Contains("is a FIFO"), Error);
  CHECK(fs::is_fifo(tmp.path / "fifo"));
  const files::Fd sock(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = (tmp.path / "sock").string();
  REQUIRE(sock_path.size() < sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  REQUIRE(::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  CHECK_THROWS_WITH_AS(files::write_atomic(sock_path, x, "out"), doctest::Contains("is a socket"), Error);
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path.string() + "/", "-o"), doctest::Contains("ends in '/'"), Error);
  CHECK_THROWS_WITH_AS(files::check_output("", "-o"), doctest::Contains("-o: names no file"), Error);
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path / "old" / "under", "-o"), doctest::Contains("not a directory"),
                       Error);
  // A dangling symlink is a new name: the link is replaced, nothing is created where it points.
  fs::create_symlink(tmp.path / "nowhere", tmp.path / "dangling");
  files::write_atomic(tmp.path / "dangling", x, "-o");
  CHECK_FALSE(fs::is_symlink(tmp.path / "dangling"));
  CHECK_FALSE(fs::exists(tmp.path / "nowhere"));
}

TEST_CASE("files: the output rule refuses the command's own input under any name") {
  TempDir tmp;
  write_text(tmp.path / "h.tfe", "head");
  fs::create_directories(tmp.path / "ckpt");
  write_text(tmp.path / "ckpt" / "model.safetensors", "weights");
  const std::vector<fs::path> inputs = {tmp.path / "h.tfe", tmp.path / "ckpt"};
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path / "h.tfe", "-o", inputs),
                       doctest::Contains("is the command's input"), Error);
  // A hard link and a symlink are the same file.
  fs::create_hard_link(tmp.path / "h.tfe", tmp.path / "hard.tfe");
  fs::create_symlink(tmp.path / "h.tfe", tmp.path / "soft.tfe");
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path / "hard.tfe", "-o", inputs), doctest::Contains("(the same file)"),
                       Error);
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path / "soft.tfe", "-o", inputs), doctest::Contains("(the same file)"),
                       Error);
  // A file directly in an input directory.
  const std::string message = "is the command's input " + (tmp.path / "ckpt" / "model.safetensors").string();
  CHECK_THROWS_WITH_AS(files::check_output(tmp.path / "ckpt" / "model.safetensors", "-o", inputs),
                       doctest::Contains(message.c_str()), Error);
  CHECK(read_text(tmp.path / "h.tfe") == "head");
  CHECK(read_text(tmp.path / "ckpt" / "model.safetensors") == "weights");
  // Another file, or a new name in the input directory, is fine.
  write_text(tmp.path / "other", "o");
  CHECK_NOTHROW(files::check_output(tmp.path / "other", "-o", inputs));
  CHECK_NOTHROW(files::check_output(tmp.path / "ckpt" / "head.tfe", "-o", inputs));
}

TEST_CASE("files: a lock file that is a dangling symlink is refused, and its target is not created") {
  TempDir tmp;
  fs::create_symlink(tmp.path / "created-through-link", tmp.path / "k.lock");
  CHECK_THROWS_WITH_AS(files::FileLock(tmp.path / "k.lock", "kernel cache"), doctest::Contains("is a symlink"), Error);
  CHECK_FALSE(fs::exists(tmp.path / "created-through-link"));
  CHECK_NOTHROW(files::FileLock(tmp.path / "ok.lock", "kernel cache"));
}
