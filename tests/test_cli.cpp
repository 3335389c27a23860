// tfe-plan as a user meets it: one spelling of the output flag, --version, and refusals that come before
// any work (an output directory that cannot be written, an arch the kernels do not run on).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "compiler/nvrtc.h"
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
  CHECK(has(out1, fmt::format("compile: -o {} is a file, not a directory", file.string())));
  CHECK(!has(out1, "TFE_JIT"));

  const auto [rc2, out2] = run_command(fmt::format("{} --output {}/a/b", run, file.string()));
  CAPTURE(out2);
  CHECK(rc2 == 1);
  CHECK(has(out2, fmt::format("cannot be created: {} is a file, not a directory", file.string())));
  CHECK(!has(out2, "TFE_JIT"));
  CHECK(fs::is_regular_file(file));

  // A missing directory under a writable one passes the check (and the compile then fails on the cache).
  const auto [rc3, out3] = run_command(fmt::format("{} -o {}", run, (tmp.path / "new" / "artifact").string()));
  CAPTURE(out3);
  CHECK(rc3 == 1);
  CHECK(has(out3, "TFE_JIT=off"));

  // Root writes anywhere, so the permission case runs only for other users.
  if (::geteuid() != 0) {
    const fs::path locked = tmp.path / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    const auto [rc4, out4] = run_command(fmt::format("{} -o {}", run, (locked / "artifact").string()));
    CAPTURE(out4);
    CHECK(rc4 == 1);
    CHECK(has(out4, fmt::format("cannot be created in {}", locked.string())));
    const auto [rc5, out5] = run_command(fmt::format("{} -o {}", run, locked.string()));
    CAPTURE(out5);
    CHECK(rc5 == 1);
    CHECK(has(out5, fmt::format("-o {}: cannot write into it", locked.string())));
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
