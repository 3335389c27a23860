// The tap dump's rows and file (runtime/tap_dump.h) on the CPU: rows in, a safetensors file out, read back
// with the project's reader; the row limit and its accounting; the atomic write; the refusals.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <tfe/head_file.h>
#include <tfe/runtime.h>

#include "head/presets.h"
#include "runtime/tap_dump.h"
#include "test_util.h"

using namespace tfe;

namespace {

constexpr int kTaps = 2;
constexpr int64_t kHidden = 3;
constexpr int64_t kWidth = kTaps * kHidden;

// A request's rows, owning what its spans point into; every tap value distinct (row, column and a salt).
struct Rows {
  int slot;
  int64_t first_pos;
  std::vector<bf16_bits> taps;
  std::vector<int32_t> tokens;
  ExtendRequest request() const { return {slot, first_pos, static_cast<int64_t>(tokens.size()), taps, tokens}; }
};

Rows rows(int slot, int64_t first_pos, int64_t n, uint16_t salt) {
  Rows r{slot, first_pos, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < kWidth; ++c) r.taps.push_back(static_cast<bf16_bits>(salt * 256 + i * 16 + c));
    r.tokens.push_back(static_cast<int32_t>(salt * 1000 + first_pos + i));
  }
  return r;
}

std::vector<ExtendRequest> call(std::initializer_list<const Rows*> rs) {
  std::vector<ExtendRequest> v;
  for (const Rows* r : rs) v.push_back(r->request());
  return v;
}

TapDumpOptions options(const std::filesystem::path& path, int64_t max_rows = int64_t{1} << 16) {
  TapDumpOptions o;
  o.path = path.string();
  o.max_rows = max_rows;
  return o;
}

template <typename T>
std::vector<T> values(const SafetensorsFile& f, const char* name) {
  const TensorView* t = f.find(name);
  REQUIRE(t != nullptr);
  const auto s = t->as<T>();
  return {s.begin(), s.end()};
}

// What the process writes to stderr while `f` runs.
template <typename F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  char tmpl[] = "/tmp/tfe-stderr-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::string text = test::read_text(tmpl);
  ::unlink(tmpl);
  return text;
}

}  // namespace

TEST_CASE("tap dump: the rows of every call, in arrival order, read back with SafetensorsFile") {
  test::TempDir dir;
  const auto path = dir.path / "taps.safetensors";
  const Rows a = rows(3, 5, 2, 1), b = rows(1, 0, 1, 2), c = rows(3, 7, 3, 3);
  {
    TapDump dump(options(path), kTaps, kHidden, "abc123");
    dump.record(call({&a, &b}));
    dump.record(call({&c}));
    CHECK(dump.rows() == 6);
    CHECK(dump.calls() == 2);
    CHECK(dump.dropped() == 0);
    dump.write();
    const SafetensorsFile f = SafetensorsFile::open(path.string());
    const auto& md = f.metadata();
    CHECK(md.at("format") == "tfe.tap_dump");
    CHECK(md.at("format_version") == "1");
    CHECK(md.at("head_sha256") == "abc123");
    CHECK(md.at("taps") == "2");
    CHECK(md.at("target_hidden") == "3");
    CHECK(md.at("rows") == "6");
    CHECK(md.at("calls") == "2");
    CHECK(md.at("dropped_rows") == "0");
    CHECK(md.at("max_rows") == std::to_string(int64_t{1} << 16));
    const TensorView* taps = f.find("taps");
    REQUIRE(taps != nullptr);
    CHECK(taps->dtype == DType::BF16);
    CHECK(taps->shape == std::vector<int64_t>{6, kWidth});
    for (const char* name : {"tokens", "slots", "positions", "calls"}) {
      CAPTURE(name);
      REQUIRE(f.find(name) != nullptr);
      CHECK(f.find(name)->dtype == DType::I32);
      CHECK(f.find(name)->shape == std::vector<int64_t>{6});
    }
    std::vector<bf16_bits> want_taps;
    for (const Rows* r : {&a, &b, &c}) want_taps.insert(want_taps.end(), r->taps.begin(), r->taps.end());
    CHECK(values<bf16_bits>(f, "taps") == want_taps);
    CHECK(values<int32_t>(f, "tokens") == std::vector<int32_t>{1005, 1006, 2000, 3007, 3008, 3009});
    CHECK(values<int32_t>(f, "slots") == std::vector<int32_t>{3, 3, 1, 3, 3, 3});
    CHECK(values<int32_t>(f, "positions") == std::vector<int32_t>{5, 6, 0, 7, 8, 9});
    CHECK(values<int32_t>(f, "calls") == std::vector<int32_t>{0, 0, 0, 1, 1, 1});
    dump.record(call({&b}));
  }
  // Written again at close, with the call recorded since.
  const SafetensorsFile f = SafetensorsFile::open(path.string());
  CHECK(f.metadata().at("rows") == "7");
  CHECK(f.metadata().at("calls") == "3");
  CHECK(values<int32_t>(f, "calls").back() == 2);
  // Nothing but the file is left in the directory: each write went through a temporary renamed over it.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    CAPTURE(e.path().string());
    CHECK(e.path() == path);
    ++entries;
  }
  CHECK(entries == 1);
}

TEST_CASE("tap dump: no rows is a file of empty tensors, and no head sha256 no key") {
  test::TempDir dir;
  const auto path = dir.path / "empty.safetensors";
  { TapDump dump(options(path), kTaps, kHidden); }
  const SafetensorsFile f = SafetensorsFile::open(path.string());
  CHECK(f.metadata().at("rows") == "0");
  CHECK(f.metadata().count("head_sha256") == 0);
  CHECK(f.find("taps")->shape == std::vector<int64_t>{0, kWidth});
  CHECK(f.find("tokens")->bytes == 0);
}

TEST_CASE("tap dump: rows past max_rows are counted in dropped_rows, with one warning") {
  test::TempDir dir;
  const auto path = dir.path / "taps.safetensors";
  const Rows a = rows(0, 0, 2, 1), b = rows(1, 0, 3, 2), c = rows(0, 2, 2, 3);
  TapDump dump(options(path, 3), kTaps, kHidden);
  dump.record(call({&a}));
  CHECK(dump.room() == 1);
  const std::string first = stderr_of([&] { dump.record(call({&b})); });  // 1 kept, 2 dropped
  CHECK(first.find("max_rows = 3") != std::string::npos);
  CHECK(first.find(path.string()) != std::string::npos);
  // Later drops say nothing more; a caller's rows left out (device rows not copied) count as dropped.
  const std::string later = stderr_of([&] { dump.record(call({&c}), 4); });
  CHECK(later.empty());
  CHECK(dump.rows() == 3);
  CHECK(dump.dropped() == 2 + 2 + 4);
  CHECK(dump.calls() == 3);
  CHECK(dump.room() == 0);
  dump.write();
  const SafetensorsFile f = SafetensorsFile::open(path.string());
  CHECK(f.metadata().at("rows") == "3");
  CHECK(f.metadata().at("dropped_rows") == "8");
  CHECK(f.metadata().at("calls") == "3");
  CHECK(values<int32_t>(f, "slots") == std::vector<int32_t>{0, 0, 1});
  CHECK(values<int32_t>(f, "calls") == std::vector<int32_t>{0, 0, 1});
  std::vector<bf16_bits> want(a.taps);
  want.insert(want.end(), b.taps.begin(), b.taps.begin() + kWidth);
  CHECK(values<bf16_bits>(f, "taps") == want);
}

TEST_CASE("tap dump: refusals name the field and the value, and a refused call records nothing") {
  test::TempDir dir;
  const auto path = dir.path / "taps.safetensors";
  CHECK_THROWS_WITH_AS(TapDump(options(""), kTaps, kHidden), doctest::Contains("path is empty"), Error);
  CHECK_THROWS_WITH_AS(TapDump(options(path, 0), kTaps, kHidden), doctest::Contains("max_rows = 0 is outside 1.."),
                       Error);
  const auto missing = dir.path / "no" / "such.safetensors";
  CHECK_THROWS_WITH_AS(check_tap_dump_options(options(missing)),
                       doctest::Contains(((dir.path / "no").string() + " does not exist").c_str()), Error);
  CHECK_THROWS_WITH_AS(check_tap_dump_options(options(dir.path)), doctest::Contains("is a directory"), Error);
  CHECK_THROWS_WITH_AS(TapDump(options(path), 0, kHidden), doctest::Contains("taps = 0"), Error);
  if (::geteuid() != 0) {  // root writes anywhere
    const auto locked = dir.path / "locked";
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK_THROWS_WITH_AS(check_tap_dump_options(options(locked / "t.safetensors")),
                         doctest::Contains("cannot write into"), Error);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }

  TapDump dump(options(path), kTaps, kHidden);
  Rows good = rows(0, 0, 2, 1), short_taps = rows(1, 0, 2, 2), two = rows(2, 0, 2, 3);
  short_taps.taps.pop_back();
  CHECK_THROWS_WITH_AS(dump.record(call({&good, &short_taps})),
                       doctest::Contains("requests[1].taps holds 11 values; 2 rows of 2 x 3 need 12"), Error);
  // One row's taps with two tokens.
  const ExtendRequest bad_tokens{2, 0, 1, std::span(two.taps).first(kWidth), two.tokens};
  CHECK_THROWS_WITH_AS(dump.record(std::span(&bad_tokens, 1)),
                       doctest::Contains("requests[0].tokens holds 2 values; the request has 1 rows"), Error);
  Rows negative = rows(0, -1, 1, 4);
  CHECK_THROWS_WITH_AS(dump.record(call({&negative})), doctest::Contains("requests[0] positions -1..-1"), Error);
  CHECK_THROWS_WITH_AS(dump.record(call({&good}), -1), doctest::Contains("left_out = -1"), Error);
  CHECK(dump.rows() == 0);
  CHECK(dump.calls() == 0);
  dump.record(call({&good}));
  CHECK(dump.calls() == 1);
}

TEST_CASE("tap dump: a write that fails names the path and leaves the file as it was") {
  test::TempDir dir;
  const auto sub = dir.path / "sub";
  std::filesystem::create_directory(sub);
  const auto path = sub / "taps.safetensors";
  const Rows a = rows(0, 0, 2, 1);
  auto dump = std::make_unique<TapDump>(options(path), kTaps, kHidden);
  dump->record(call({&a}));
  dump->write();
  const auto before = test::read_text(path);
  // A directory where the file was: the rename over it fails, after the temporary was written in full.
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  CHECK_THROWS_WITH_AS(dump->write(), doctest::Contains(path.string().c_str()), Error);
  CHECK(std::filesystem::is_directory(path));
  std::filesystem::remove(path);
  test::write_text(path, before);
  // The directory gone: the destructor reports the failure on stderr instead of throwing.
  std::filesystem::rename(sub, dir.path / "moved");
  const std::string reported = stderr_of([&] { dump.reset(); });
  CHECK(reported.find("tfe: tap dump: writing " + path.string()) != std::string::npos);
  // Nothing but the earlier file in the moved directory: the failed write's temporary was removed.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path / "moved")) left.push_back(e.path().filename());
  CHECK(left == std::vector<std::string>{"taps.safetensors"});
}

// Refused before the head is planned or a device is looked for, with or without a GPU.
TEST_CASE("tap dump: Runtime::open refuses a file it could not write, and a malformed TFE_CHECK, first") {
  test::TempDir dir;
  const auto bytes = test::random_head_bytes(preset_header("tiny"), 3);
  const HeadFile file = HeadFile::from_bytes(bytes);
  OpenOptions o;
  o.tap_dump.path = (dir.path / "missing" / "taps.safetensors").string();
  CHECK_THROWS_WITH_AS(Runtime::open(file, o), doctest::Contains((dir.path / "missing").string().c_str()), Error);
  ::setenv("TFE_TAP_DUMP", (dir.path / "gone" / "t.safetensors").string().c_str(), 1);
  CHECK_THROWS_WITH_AS(Runtime::open(file, OpenOptions{}), doctest::Contains("gone does not exist"), Error);
  ::unsetenv("TFE_TAP_DUMP");
  o = OpenOptions{};
  o.tap_dump.max_rows = 0;
  o.tap_dump.path = (dir.path / "t.safetensors").string();
  CHECK_THROWS_WITH_AS(Runtime::open(file, o), doctest::Contains("max_rows = 0"), Error);
  ::setenv("TFE_CHECK", "yes", 1);
  CHECK_THROWS_WITH_AS(Runtime::open(file, OpenOptions{}), doctest::Contains("TFE_CHECK: `yes`"), Error);
  ::unsetenv("TFE_CHECK");
  CHECK_FALSE(std::filesystem::exists(dir.path / "t.safetensors"));
}
