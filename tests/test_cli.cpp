// tfe-plan as a user meets it: one spelling of the output flag, --version, and refusals that come before
// any work (an output directory that cannot be written, an arch the kernels do not run on).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/nvrtc.h"
#include "head/presets.h"
#include "test_util.h"

namespace fs = std::filesystem;
using tfe::test::run_command;
using tfe::test::TempDir;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("tfe-plan: every subcommand that writes a file takes -o,--output") {
  for (const char* sub : {"random", "convert", "reference", "dump", "compile"}) {
    CAPTURE(sub);
    const auto [rc, out] = run_command(fmt::format("{} {} --help", TFE_PLAN_EXE, sub));
    CAPTURE(out);
    CHECK(rc == 0);
    CHECK(has(out, "-o,--output"));
  }
  TempDir tmp;
  const std::string plan = (tmp.path / "plan.yaml").string();
  const auto [rc, out] = run_command(fmt::format("{} dump --preset tiny --buckets 1 --output {}", TFE_PLAN_EXE, plan));
  CAPTURE(out);
  CHECK(rc == 0);
  CHECK(fs::file_size(plan) > 0);
}

TEST_CASE("tfe-plan: -o naming a device, a FIFO, a directory or the command's own input is refused, untouched") {
  TempDir tmp;
  const std::string head = (tmp.path / "h.tfe").string();
  const auto [rc0, out0] = run_command(fmt::format("{} random --preset tiny -o {}", TFE_PLAN_EXE, head));
  CAPTURE(out0);
  REQUIRE(rc0 == 0);
  const std::string head_bytes = tfe::test::read_text(head);
  const fs::path fifo = tmp.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string config = (tmp.path / "header.yaml").string();
  tfe::test::write_text(config, "not read");
  const std::string reference = fmt::format("reference {} --streams 1 --rows 2 --steps 1 --seed 1", head);
  struct Case {
    std::string command, output, message;
  };
  const std::vector<Case> cases = {
      {fmt::format("dump {}", head), head, "is the command's input"},
      {fmt::format("dump {}", head), "/dev/null", "is a character device"},
      {fmt::format("dump {}", head), fifo.string(), "is a FIFO"},
      {fmt::format("dump {}", head), tmp.path.string(), "is a directory"},
      {reference, head, "is the command's input"},
      {reference, "/dev/null", "is a character device"},
      {fmt::format("random --config {}", config), config, "is the command's input"},
      {"random --preset tiny", "/dev/null", "is a character device"},
      {"random --preset tiny", fifo.string(), "is a FIFO"},
      {"random --preset tiny", tmp.path.string() + "/", "ends in '/'"},
  };
  for (const Case& c : cases) {
    const auto [rc, out] = run_command(fmt::format("{} {} -o {}", TFE_PLAN_EXE, c.command, c.output));
    CAPTURE(c.command);
    CAPTURE(out);
    CHECK(rc == 1);
    CHECK(has(out, c.message));
  }
  CHECK(tfe::test::read_text(head) == head_bytes);
  CHECK(tfe::test::read_text(config) == "not read");
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_character_file("/dev/null"));
}

TEST_CASE("tfe-plan: --seed is an integer 0..2^64-1, and a head's name is printed with its escapes shown") {
  TempDir tmp;
  const std::string out = (tmp.path / "h.tfe").string();
  for (const char* bad : {"-1", "18446744073709551616", "1e23", "0x10", "7.0", "' '"}) {
    CAPTURE(bad);
    for (const char* sub : {"random --preset tiny", "reference h.tfe --streams 1 --rows 1 --steps 1"}) {
      const auto [rc, text] = run_command(fmt::format("{} {} --seed {} -o {}", TFE_PLAN_EXE, sub, bad, out));
      CAPTURE(text);
      CHECK(rc != 0);
      CHECK(has(text, "is not a seed: give an integer 0..18446744073709551615"));
    }
  }
  CHECK_FALSE(fs::exists(out));
  const auto [rc, text] =
      run_command(fmt::format("{} random --preset tiny --seed 18446744073709551615 -o {}", TFE_PLAN_EXE, out));
  CAPTURE(text);
  CHECK(rc == 0);
  CHECK(has(text, "seed 18446744073709551615"));

  tfe::HeadHeader h = tfe::preset_header("tiny");
  h.name = "red\x1b[31m\x07";
  const fs::path named = tmp.path / "named.tfe";
  tfe::test::write_file(named, tfe::test::random_head_bytes(h, 1));
  const auto [rc2, text2] = run_command(fmt::format("{} inspect {}", TFE_PLAN_EXE, named.string()));
  CAPTURE(text2);
  CHECK(rc2 == 0);
  CHECK(has(text2, "\"red\\x1b[31m\\x07\""));
  CHECK(!has(text2, "\x1b"));
}

TEST_CASE("tfe-plan --version: the project's version, the CUDA toolkit and the NVRTC loaded") {
  const auto [rc, out] = run_command(fmt::format("{} --version", TFE_PLAN_EXE));
  CAPTURE(out);
  CHECK(rc == 0);
  CHECK(has(out, fmt::format("tfe-plan {}\n", TFE_VERSION)));
  CHECK(has(out, fmt::format("CUDA toolkit {} (built against)", tfe::cuda_toolkit_version())));
  CHECK(has(out, fmt::format("NVRTC {} (loaded)", tfe::nvrtc_version().str())));
}

TEST_CASE("tfe-plan compile: an output that cannot be written is refused before anything compiles") {
  TempDir tmp;
  // An empty cache under TFE_JIT=off: a compile that started would fail naming TFE_JIT instead.
  const std::string run = fmt::format("TFE_CACHE_DIR={} TFE_JIT=off {} compile --preset tiny --buckets 1",
                                      (tmp.path / "cache").string(), TFE_PLAN_EXE);
  const fs::path file = tmp.path / "file";
  tfe::test::write_file(file, {});

  const auto [rc1, out1] = run_command(fmt::format("{} -o {}", run, file.string()));
  CAPTURE(out1);
  CHECK(rc1 == 1);
  CHECK(has(out1, fmt::format("artifact: {} exists and is not a directory", file.string())));
  CHECK(!has(out1, "TFE_JIT"));

  const auto [rc2, out2] = run_command(fmt::format("{} --output {}/a/b", run, file.string()));
  CAPTURE(out2);
  CHECK(rc2 == 1);
  CHECK(has(out2, fmt::format("{} is not a directory", file.string())));
  CHECK(!has(out2, "TFE_JIT"));
  CHECK(fs::is_regular_file(file));

  // A missing directory under a writable one passes the check (and the compile then fails on the cache),
  // with a trailing slash too.
  for (const std::string slash : {"", "/"}) {
    const auto [rc3, out3] =
        run_command(fmt::format("{} -o {}{}", run, (tmp.path / "new" / "artifact").string(), slash));
    CAPTURE(out3);
    CHECK(rc3 == 1);
    CHECK(has(out3, "TFE_JIT=off"));
  }
  // A directory that is not an artifact, with or without a trailing slash: refused before the compile.
  fs::create_directories(tmp.path / "mine");
  tfe::test::write_text(tmp.path / "mine" / "manifest.json", "{}");
  tfe::test::write_text(tmp.path / "mine" / "notes.txt", "keep me");
  for (const std::string slash : {"", "/"}) {
    const auto [rc6, out6] = run_command(fmt::format("{} -o {}{}", run, (tmp.path / "mine").string(), slash));
    CAPTURE(out6);
    CHECK(rc6 == 1);
    CHECK(has(out6, "does not parse as a tfe artifact's manifest"));
    CHECK(!has(out6, "TFE_JIT"));
  }
  CHECK(tfe::test::read_text(tmp.path / "mine" / "notes.txt") == "keep me");

  // Root writes anywhere, so the permission case runs only for other users.
  if (::geteuid() != 0) {
    const fs::path locked = tmp.path / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    const auto [rc4, out4] = run_command(fmt::format("{} -o {}", run, (locked / "artifact").string()));
    CAPTURE(out4);
    CHECK(rc4 == 1);
    CHECK(has(out4, fmt::format("{} is not writable", locked.string())));
    const auto [rc5, out5] = run_command(fmt::format("{} -o {}", run, locked.string()));
    CAPTURE(out5);
    CHECK(rc5 == 1);
    CHECK(has(out5, "TFE_JIT=off"));  // an empty directory is replaced by a rename in its writable parent
    fs::permissions(locked, fs::perms::owner_all);
  }
}

TEST_CASE("tfe-plan dump, compile: an --arch below sm_90 or malformed is refused by name") {
  TempDir tmp;
  const std::string out = (tmp.path / "artifact").string();
  for (const char* sub : {"dump", "compile"}) {
    CAPTURE(sub);
    const auto [rc1, out1] = run_command(fmt::format("{} {} --preset tiny --arch sm_80 -o {}", TFE_PLAN_EXE, sub, out));
    CAPTURE(out1);
    CHECK(rc1 == 1);
    CHECK(has(out1, "tfe-plan: --arch sm_80: tfe needs sm_90 or newer"));
    const auto [rc2, out2] = run_command(fmt::format("{} {} --preset tiny --arch 90 -o {}", TFE_PLAN_EXE, sub, out));
    CAPTURE(out2);
    CHECK(rc2 == 1);
    CHECK(has(out2, "tfe-plan: --arch 90: not of the form sm_<digits>"));
  }
  CHECK(!fs::exists(out));
  const auto [rc, text] = run_command(fmt::format("{} dump --preset tiny --buckets 1 --arch sm_100", TFE_PLAN_EXE));
  CAPTURE(text);
  CHECK(rc == 0);
  CHECK(has(text, "arch: sm_100"));
}

TEST_CASE("tfe-plan: an unknown subcommand is named, with the subcommands there are") {
  const auto [rc, out] = run_command(fmt::format("{} inpsect head.tfe", TFE_PLAN_EXE));
  CAPTURE(out);
  CHECK(rc == 2);
  CHECK(has(out,
            "tfe-plan: unknown subcommand `inpsect` (subcommands: random, convert, inspect, reference, dump, "
            "compile; tfe-plan --help)"));
  CHECK(!has(out, "A subcommand is required"));
}

TEST_CASE("tfe-plan random says the size it writes before it writes, and dump -o says what it wrote") {
  TempDir tmp;
  const std::string head = (tmp.path / "tiny.tfe").string();
  const auto [rc, out] = run_command(fmt::format("{} random --preset tiny --seed 1 -o {}", TFE_PLAN_EXE, head));
  CAPTURE(out);
  REQUIRE(rc == 0);
  const size_t writing = out.find(fmt::format("writing {}: ", head));
  REQUIRE(writing != std::string::npos);
  CHECK(writing < out.find("wrote "));
  CHECK(has(out, " MB of random weights\n"));
  // The size it announces is the file's, to the 0.1 MB it is rounded to (the header adds a few kB).
  const size_t mb = out.find(" tensors, ", writing) + std::string(" tensors, ").size();
  CHECK(std::abs(std::stod(out.substr(mb)) * 1e6 - static_cast<double>(fs::file_size(head))) < 1e5);

  const std::string plan = (tmp.path / "plan.yaml").string();
  const auto [rc2, out2] =
      run_command(fmt::format("{} dump {} --buckets 1,4 --max-steps 3 -o {}", TFE_PLAN_EXE, head, plan));
  CAPTURE(out2);
  CHECK(rc2 == 0);
  CHECK(out2 == fmt::format("wrote {}: the plan of tiny (buckets 1,4, max_steps 3, max_slots 64)\n", plan));
  CHECK(fs::file_size(plan) > 0);
}
