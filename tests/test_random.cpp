#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "core/error.h"
#include "head/fp8.h"
#include <tfe/head_file.h>
#include "head/header_yaml.h"
#include "core/numeric.h"
#include "head/presets.h"
#include "head/random_head.h"

using namespace tfe;
namespace fs = std::filesystem;

namespace {

std::vector<float> floats_of(const TensorView& t) {
  std::vector<float> v;
  for (bf16_bits b : t.as<bf16_bits>()) v.push_back(bf16_to_float(b));
  return v;
}

double stddev(const std::vector<float>& v, double mean_about = 0.0) {
  double s = 0.0;
  for (float f : v) s += (f - mean_about) * (f - mean_about);
  return std::sqrt(s / static_cast<double>(v.size()));
}

uint64_t fresh_seed() { return std::random_device{}() * 0x100000001ull + std::random_device{}(); }

fs::path scratch_dir(const std::string& tag) {
  const auto d = fs::temp_directory_path() / fmt::format("tfe-test-{}-{}", tag, fresh_seed());
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("random: same seed gives the same bytes for any thread count, and another seed differs") {
  const uint64_t seed = fresh_seed();
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const auto h = preset_header(preset);
    const auto a = random_head(h, seed, false, 1).serialize();
    const auto b = random_head(h, seed, false, 3).serialize();
    CHECK(a == b);
    const auto c = random_head(h, seed + 1, false, 2).serialize();
    CHECK(a != c);
    // The head id (sha256 of the stored header, which lists each tensor's sha256) differs too.
    CHECK(HeadFile::from_bytes(a).header_sha256() != HeadFile::from_bytes(c).header_sha256());
  }
}

TEST_CASE("random: every tensor is finite and varied, the file opens and validates, and d2t is distinct and sorted") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const auto h = preset_header(preset);
    const auto bytes = random_head(h, seed, false).serialize();
    const auto f = HeadFile::from_bytes(bytes, {.verify_sha256 = true});
    CHECK(f.header() == h);
    for (const auto& spec : expected_tensors(h)) {
      CAPTURE(spec.name);
      const auto& t = f.tensor(spec.name);
      if (spec.dtype != DType::BF16) continue;
      const auto v = floats_of(t);
      CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
      CHECK(std::any_of(v.begin(), v.end(), [&](float x) { return x != v[0]; }));
      CHECK(std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; }));
    }
    const auto d2t = f.tensor("d2t").as<int32_t>();
    REQUIRE(static_cast<int64_t>(d2t.size()) == h.draft_vocab);
    int64_t prev = -1;
    for (size_t i = 0; i < d2t.size(); ++i) {
      const int64_t target = static_cast<int64_t>(i) + d2t[i];
      CHECK(target > prev);  // strictly increasing: distinct and sorted
      CHECK(target < h.vocab);
      prev = target;
    }
    // Chosen by the seed, not the first draft_vocab ids.
    CHECK(prev > h.draft_vocab);
  }
}

TEST_CASE("random: draws have the table's scales, and the output head spreads logits over a few units") {
  const auto h = preset_header("tiny");
  const auto bytes = random_head(h, fresh_seed(), false).serialize();
  const auto f = HeadFile::from_bytes(bytes);
  for (const auto& t : random_tensor_table(h)) {
    if (t.init == RandomInit::d2t) continue;
    CAPTURE(t.spec.name);
    const auto v = floats_of(f.tensor(t.spec.name));
    if (t.init == RandomInit::norm) {
      CHECK(stddev(v, 1.0) == doctest::Approx(t.std).epsilon(0.25));
      CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return std::fabs(x - 1.0f) <= 2 * t.std; }));
    } else {
      CHECK(stddev(v) == doctest::Approx(t.std).epsilon(0.1));
    }
  }
  // Logits of unit-RMS inputs (normalized embedding rows) through lm_head: spread, and argmax varies.
  const auto embed = floats_of(f.tensor("embed"));
  const auto lm = floats_of(f.tensor("lm_head"));
  std::set<int64_t> argmaxes;
  std::vector<float> all_logits;
  for (int64_t row = 0; row < 32; ++row) {
    const float* x = embed.data() + row * 97 % h.vocab * h.hidden;
    double ms = 0.0;
    for (int64_t k = 0; k < h.hidden; ++k) ms += x[k] * x[k];
    const float r = static_cast<float>(1.0 / std::sqrt(ms / h.hidden));
    int64_t best = 0;
    float best_logit = -INFINITY;
    for (int64_t j = 0; j < h.draft_vocab; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < h.hidden; ++k) s += lm[j * h.hidden + k] * x[k] * r;
      all_logits.push_back(s);
      if (s > best_logit) best_logit = s, best = j;
    }
    argmaxes.insert(best);
  }
  CHECK(argmaxes.size() > 8);
  const double spread = stddev(all_logits);
  CHECK(spread > 1.0);
  CHECK(spread < 4.0);
}

TEST_CASE("random --fp8: every linear in use carries the FP8 form of its bf16 tensor") {
  for (const char* preset : {"tiny", "tiny-two-stage"}) {
    CAPTURE(preset);
    const auto h = preset_header(preset);
    const uint64_t seed = fresh_seed();
    const auto bytes = random_head(h, seed, true, 2).serialize();
    const auto f = HeadFile::from_bytes(bytes);
    CHECK(f.header().fp8.size() == linears_in_use(h).size());
    for (const auto& l : linears_in_use(h)) {
      CAPTURE(l);
      CHECK(f.header().has_fp8(l));
      const auto shape = linear_shape(h, l);
      const auto expect = quantize_fp8(f.tensor(l).as<bf16_bits>(), shape[0], shape[1]);
      const auto q = f.tensor(l + ".fp8").as<uint8_t>();
      const auto s = f.tensor(l + ".scale").as<float>();
      CHECK(std::equal(q.begin(), q.end(), expect.q.begin(), expect.q.end()));
      CHECK(std::equal(s.begin(), s.end(), expect.scale.begin(), expect.scale.end()));
    }
    // The bf16 tensors do not depend on whether FP8 forms are added.
    const auto plain = random_head(h, seed, false).serialize();
    const auto g = HeadFile::from_bytes(plain);
    for (const auto& spec : expected_tensors(h)) {
      const auto a = g.tensor(spec.name), b = f.tensor(spec.name);
      CHECK(std::equal(a.data, a.data + a.bytes, b.data, b.data + b.bytes));
    }
  }
}

TEST_CASE("random: the llama3-8b-eagle3 tensor table, without generating it") {
  auto h = preset_header("llama3-8b-eagle3");
  const auto table = random_tensor_table(h);
  const auto expected = expected_tensors(h);
  REQUIRE(table.size() == expected.size());
  for (size_t i = 0; i < table.size(); ++i) CHECK(table[i].spec == expected[i]);
  auto find = [&](std::string_view name) {
    auto it = std::find_if(table.begin(), table.end(), [&](const RandomTensor& t) { return t.spec.name == name; });
    REQUIRE(it != table.end());
    return *it;
  };
  CHECK(find("embed").spec.shape == std::vector<int64_t>{128256, 4096});
  CHECK(find("embed").init == RandomInit::normal);
  CHECK(find("fc").spec.shape == std::vector<int64_t>{4096, 3 * 4096});
  CHECK(find("fc").std == doctest::Approx(1.0 / std::sqrt(3.0 * 4096)));
  CHECK(find("wq").spec.shape == std::vector<int64_t>{4096, 8192});
  CHECK(find("wk").spec.shape == std::vector<int64_t>{1024, 8192});
  CHECK(find("w_down").std == doctest::Approx(1.0 / std::sqrt(14336.0)));
  CHECK(find("lm_head").spec.shape == std::vector<int64_t>{32000, 4096});
  CHECK(find("lm_head").std == doctest::Approx(kRandomLogitStd / 64.0));
  CHECK(find("final_norm").init == RandomInit::norm);
  CHECK(find("d2t").spec == TensorSpec{"d2t", DType::I32, {32000}});
  // FP8 adds a form for each of the nine linears a dense head uses, and nothing to the random table.
  mark_fp8_forms(h);
  CHECK(random_tensor_table(h) == table);
  CHECK(expected_tensors(h).size() == expected.size() + 2 * 9);
}

TEST_CASE("assemble_head refuses a missing, unknown or repeated tensor by name") {
  const auto h = preset_header("tiny");
  auto tensors_of = [&] {
    const auto bytes = random_head(h, 1, false).serialize();
    const auto f = HeadFile::from_bytes(bytes);
    std::vector<HeadTensor> t;
    for (const auto& spec : expected_tensors(h)) {
      const auto& v = f.tensor(spec.name);
      t.push_back({spec.name, spec.dtype, spec.shape, std::vector<std::byte>(v.data, v.data + v.bytes)});
    }
    return t;
  };
  auto t = tensors_of();
  CHECK_NOTHROW(assemble_head(h, t));
  t.erase(std::find_if(t.begin(), t.end(), [](const HeadTensor& x) { return x.name == "post_norm"; }));
  CHECK_THROWS_WITH_AS(assemble_head(h, t), doctest::Contains("`post_norm` is missing"), Error);
  t = tensors_of();
  t.push_back(t.front());
  CHECK_THROWS_WITH_AS(assemble_head(h, t), doctest::Contains("`fc` is given twice"), Error);
  t = tensors_of();
  t.push_back({"lr_a", DType::BF16, {1}, std::vector<std::byte>(2)});
  CHECK_THROWS_WITH_AS(assemble_head(h, t), doctest::Contains("`lr_a` is not a bf16 or int32 tensor"), Error);
}

TEST_CASE("tfe-plan random: --preset and --config write the head random_head makes, and bad input is refused") {
  const auto dir = scratch_dir("random");
  const auto seed = fresh_seed() % 1000000;
  const auto out = dir / "tiny.tfe";
  REQUIRE(std::system(fmt::format("{} random --preset tiny-two-stage --seed {} --fp8 -o {} >/dev/null", TFE_PLAN_EXE,
                                  seed, out.string())
                          .c_str()) == 0);
  const auto f = HeadFile::open(out.string(), {.verify_sha256 = true});
  const auto expect = random_head(preset_header("tiny-two-stage"), seed, true).serialize();
  std::ifstream in(out, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(got.size() == expect.size());
  CHECK(std::equal(got.begin(), got.end(), reinterpret_cast<const char*>(expect.data())));

  // --config: the header section of a dumped plan, here with a changed window and FP8 on two linears.
  auto h = preset_header("tiny");
  h.window = 7;
  h.fp8 = {"wq", "w_down"};
  {
    std::ofstream cfg(dir / "head.yaml");
    cfg << YAML::Dump(header_to_yaml(h));
  }
  const auto out2 = dir / "cfg.tfe";
  REQUIRE(std::system(fmt::format("{} random --config {} --seed {} -o {} >/dev/null", TFE_PLAN_EXE,
                                  (dir / "head.yaml").string(), seed, out2.string())
                          .c_str()) == 0);
  CHECK(HeadFile::open(out2.string()).header() == h);

  // Exactly one of --preset and --config; an unknown preset names the presets.
  const auto log = (dir / "err.txt").string();
  CHECK(std::system(fmt::format("{} random --preset tiny --config {} -o {} 2>{}", TFE_PLAN_EXE,
                                (dir / "head.yaml").string(), (dir / "x.tfe").string(), log)
                        .c_str()) != 0);
  CHECK(std::system(fmt::format("{} random -o {} 2>{}", TFE_PLAN_EXE, (dir / "x.tfe").string(), log).c_str()) != 0);
  CHECK(std::system(
            fmt::format("{} random --preset nope -o {} 2>{}", TFE_PLAN_EXE, (dir / "x.tfe").string(), log).c_str()) !=
        0);
  std::ifstream err(log);
  const std::string msg((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  CHECK(msg.find("tiny-two-stage") != std::string::npos);
  CHECK(!fs::exists(dir / "x.tfe"));
  fs::remove_all(dir);
}
