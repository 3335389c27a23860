// Interop with Python: the `safetensors` package reads a head tfe wrote, and tfe reads a file the package
// wrote; and the PyTorch port of a head (bench/torch_head.py) drafts what the CPU reference drafts.
// Without python3 or the package (or torch) the tests skip (test::skip: ctest reports them "Skipped") and
// check nothing.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include <tfe/head_file.h>
#include "core/numeric.h"
#include "head/presets.h"
#include "test_util.h"

using namespace tfe;
using tfe::test::run_command;

namespace {

const std::string kScript = std::string(TFE_SOURCE_DIR) + "/tests/python/read_tfe.py";

// Empty when python3 and the safetensors package (with numpy) import; otherwise why not.
std::string python_missing() {
  static const std::string why = [] {
    auto [rc, out] = run_command("python3 -c 'import numpy, safetensors.numpy'");
    return rc == 0 ? std::string() : "python3 with numpy and safetensors is not available: " + out;
  }();
  return why;
}

}  // namespace

TEST_CASE("safetensors (Python) reads every tensor of a head tfe wrote") {
  if (const auto why = python_missing(); !why.empty()) {
    test::skip(why);
    return;
  }
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    auto h = preset_header(preset);
    h.fp8 = {"wq", "w_down"};  // F8_E4M3 and F32 beside BF16 and I32
    const auto image = test::random_head_bytes(h, std::random_device{}());
    const auto path = test::write_temp_file(image, std::string(preset) + ".tfe");
    const auto head = HeadFile::from_bytes(image);

    nlohmann::json expected;
    expected["metadata"] = head.file().metadata();
    for (const auto& t : head.file().tensors())
      expected["tensors"][t.name] = {
          {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"sha256", sha256_hex({t.data, size_t(t.bytes)})}};
    const auto expected_path = (test::temp_dir() / (std::string(preset) + ".expected.json")).string();
    std::ofstream(expected_path) << expected.dump();

    const auto [rc, out] = run_command(fmt::format("python3 {} read {} {}", kScript, path, expected_path));
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find(fmt::format("ok: {} tensors", head.file().tensors().size())) != std::string::npos);
  }
}

TEST_CASE("SafetensorsFile reads a file the safetensors (Python) package wrote") {
  if (const auto why = python_missing(); !why.empty()) {
    test::skip(why);
    return;
  }
  const auto path = (test::temp_dir() / "from_python.safetensors").string();
  const auto [rc, out] = run_command(fmt::format("python3 {} write {}", kScript, path));
  INFO(out);
  REQUIRE(rc == 0);

  const auto f = SafetensorsFile::open(path);
  CHECK(f.metadata() == std::map<std::string, std::string>{{"written_by", "safetensors.numpy"}});
  REQUIRE(f.tensors().size() == 5);

  const TensorView* a = f.find("a");
  REQUIRE(a);
  CHECK(a->dtype == DType::F32);
  CHECK(a->shape == std::vector<int64_t>{3, 4});
  for (int i = 0; i < 12; ++i) CHECK(a->as<float>()[i] == 0.5f * i);

  const TensorView* b = f.find("b");
  REQUIRE(b);
  CHECK(b->dtype == DType::I32);
  for (int i = 0; i < 11; ++i) CHECK(b->as<int32_t>()[i] == i - 5);

  const TensorView* c = f.find("c");
  REQUIRE(c);
  CHECK(c->dtype == DType::F16);
  CHECK(c->shape == std::vector<int64_t>{2, 3});
  // float16 bit patterns of 0, 0.25, 0.5, 0.75, 1, 1.25.
  const uint16_t c_bits[] = {0x0000, 0x3400, 0x3800, 0x3a00, 0x3c00, 0x3d00};
  for (int i = 0; i < 6; ++i) CHECK(c->as<uint16_t>()[i] == c_bits[i]);

  const TensorView* d = f.find("d");
  REQUIRE(d);
  CHECK(d->dtype == DType::I64);
  for (int i = 0; i < 5; ++i) CHECK(d->as<int64_t>()[i] == 3 * i - 7);

  const TensorView* e = f.find("e");
  REQUIRE(e);
  CHECK(e->shape == std::vector<int64_t>{0, 3});
  CHECK(e->bytes == 0);
}

// bench/torch_head.py, the PyTorch port of a head that tfe-bench is compared with, run on the CPU against
// the CPU reference (tests/python/check_torch_head.py says what it checks). Skips without torch.
TEST_CASE("torch_head.py drafts what the CPU reference drafts, and judges planted disagreements by kind") {
  test::TempDir tmp;
  const auto [rc, out] = run_command(fmt::format("python3 {}/tests/python/check_torch_head.py {} {}", TFE_SOURCE_DIR,
                                                 TFE_PLAN_EXE, tmp.path.string()));
  if (rc == 77) {
    test::skip(out);
    return;
  }
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("the port matches the CPU reference") != std::string::npos);
}
