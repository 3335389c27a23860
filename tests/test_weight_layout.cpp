// The tiled weight layout (kernels/weight_layout.h): the formula the kernel computes, the host's reordering
// at upload, and the plans that use it.
#include <doctest/doctest.h>

#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "plan/plan.h"
#include "head/presets.h"
#include "kernels/weight_layout.h"
#include "plan_edits.h"

namespace tfe::test {
namespace {

TEST_CASE("tile_rows: every byte moves to tiled_offset, a warp's chunks of one step are 512 consecutive bytes") {
  std::mt19937_64 rng(7);
  for (const auto& [rows, row_bytes] : {std::pair<int64_t, int64_t>{16, 64}, {48, 192}, {32, 1024}}) {
    CAPTURE(rows);
    CAPTURE(row_bytes);
    std::vector<std::byte> src(static_cast<size_t>(rows * row_bytes)), out(src.size());
    for (auto& b : src) b = static_cast<std::byte>(rng());
    tile_rows([&](int64_t r) { return src.data() + r * row_bytes; }, rows, row_bytes, out.data());
    std::vector<std::byte> whole(src.size());
    tile_rows(src.data(), rows, row_bytes, whole.data());
    CHECK(whole == out);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t at = 0; at < row_bytes; ++at) {
        const int64_t o = tiled_offset(r, at, row_bytes);
        REQUIRE(o >= 0);
        REQUIRE(o < rows * row_bytes);
        seen.insert(o);
        CHECK(out[static_cast<size_t>(o)] == src[static_cast<size_t>(r * row_bytes + at)]);
      }
    CHECK(static_cast<int64_t>(seen.size()) == rows * row_bytes);  // a permutation
    // The kernel's lanes: lane g * 4 + t reads the 16 bytes at 16 t of step s of rows g (first half) and
    // g + 8 (second half) of a tile; half h of step s is 512 bytes from the step's start + 512 h.
    for (int64_t tile = 0; tile < rows / 16; ++tile)
      for (int64_t s = 0; s < row_bytes / 64; ++s)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t lane = 0; lane < 32; ++lane) {
            const int64_t g = lane / 4, t = lane % 4;
            const int64_t base = tiled_offset(tile * 16, s * 64, row_bytes) + h * 512;
            CHECK(tiled_offset(tile * 16 + g + 8 * h, s * 64 + 16 * t, row_bytes) == base + 16 * lane);
          }
    // A slice from a whole tile on is the tiled form of its rows at the row-major byte offset.
    if (rows >= 32) CHECK(tiled_offset(16, 0, row_bytes) == 16 * row_bytes);
  }
  CHECK_FALSE(tileable(24, 64));
  CHECK_FALSE(tileable(16, 96));
  CHECK(tileable(16, 128));
  std::vector<std::byte> buf(24 * 64);
  CHECK_THROWS_WITH_AS(tile_rows([&](int64_t r) { return buf.data() + r * 64; }, 24, 64, buf.data()),
                       doctest::Contains("24 rows of 64 bytes are not whole tiles of 16 rows"), Error);
}

TEST_CASE("make_plan: matrices only GEMVs read are tiled, and every GEMV's TILED says how its w is stored") {
  for (const char* preset : {"llama3-8b-eagle3", "tfe-two-stage", "tiny", "tiny-two-stage"})
    for (const bool fp8 : {false, true})
      for (const bool tiled_weights : {true, false}) {
        CAPTURE(preset);
        CAPTURE(fp8);
        CAPTURE(tiled_weights);
        HeadHeader h = preset_header(preset);
        if (fp8) h.fp8 = linears_in_use(h);
        Tuning t;
        t.tiled_weights = tiled_weights;
        const Plan p = make_plan(h, PlanOptions{}, t);
        std::set<std::string> tiled;
        for (const Buffer& b : p.weights.buffers)
          if (b.layout == Layout::tiled) tiled.insert(b.name);
        if (!tiled_weights) CHECK(tiled.empty());
        // Never tiled: what cuBLASLt or rescore reads row by row.
        CHECK_FALSE(tiled.count("target_head"));
        CHECK_FALSE(tiled.count("wkv"));
        if (!fp8) CHECK_FALSE(tiled.count("fc"));
        // llama3: every layer linear and the vocabulary head; fc too where the extend reads it by the GEMV.
        std::set<std::string> llama3 = {"wqkv", "wo", "w_gate_up", "w_down", "lm_head"};
        if (fp8) llama3.insert("fc");
        if (tiled_weights && std::string(preset).starts_with("llama3")) CHECK(tiled == llama3);
        size_t gemvs = 0;
        for (const auto* nodes : {&p.buckets.back().nodes, &p.extend})
          for (const Node& n : *nodes) {
            if (n.kind != Node::Kind::kernel || !p.spec(n.spec).kernel.starts_with("gemv")) continue;
            ++gemvs;
            const Buffer& w = p.weights.at(n.args[0].buffer);
            CHECK((p.spec(n.spec).constant("TILED") == 1) == (w.layout == Layout::tiled));
          }
        CHECK(gemvs > 0);
      }
}

TEST_CASE("validate: a tiled matrix read by anything but a gemv of TILED 1, or off a tile, is refused by name") {
  const Plan good = make_plan(preset_header("tiny"), PlanOptions{});
  REQUIRE(good.weights.at("wo").layout == Layout::tiled);
  CHECK_NOTHROW(validate(good));
  auto refused = [&](const char* what, const std::function<void(Plan&)>& edit, const char* message) {
    check_refused(good, what, edit, message);
  };
  auto weight = [](Plan& p, std::string_view name) -> Buffer& {
    for (Buffer& b : p.weights.buffers)
      if (b.name == name) return b;
    FAIL("no weight " << name);
    throw std::logic_error("unreachable");
  };
  const auto node = plan_node;
  refused(
      "a tiled matrix read as rows", [&](Plan& p) { weight(p, "wo").layout = Layout::rows; },
      "node s1.wo arg `w`: spec gemv__rows_1__k_64__n_64__weight_0__epilogue_2__cols_16__tiled_1 has TILED = 1, "
      "but `wo` is rows");
  refused(
      "a norm's weight tiled", [&](Plan& p) { weight(p, "post_norm").layout = Layout::tiled; },
      "buffer `post_norm` is tiled, which only a bf16 or FP8 weight matrix [rows, K] may be");
  refused(
      "a norm reading a tiled matrix as its weight",
      [&](Plan& p) {
        for (Arg& a : node(p, "s1.post_norm").args)
          if (a.param == "w") a.buffer = "wo";
      },
      "node s1.post_norm arg `w`: `wo` is tiled, which only a gemv's `w` reads");
  refused(
      "the extend's cuBLASLt GEMM reading a tiled copy", [&](Plan& p) { weight(p, "wkv").layout = Layout::tiled; },
      "gemm node extend.kv: w `wkv` is tiled; cuBLASLt reads a row-major matrix");
  refused(
      "a GEMV from the middle of a tile",
      [&](Plan& p) {
        Arg& w = node(p, "s1.wo").args[0];
        w.byte_offset = p.weights.at("wo").bytes / p.weights.at("wo").shape[0];  // row 1
      },
      "node s1.wo arg `w`: byte_offset");
  // A tiled spec whose shape has no tiled form (it would not compile) is refused before NVRTC sees it.
  refused(
      "a tiled gemv of 8 columns",
      [&](Plan& p) {
        for (KernelSpec& spec : p.specs)
          if (spec.kernel == "gemv" && spec.constant("TILED") == 1)
            for (auto& [name, v] : spec.constants)
              if (name == "N") v = 8;
      },
      "TILED = 1 needs N a multiple of 16 and rows of whole 64-byte K steps (N = 8");
}

}  // namespace
}  // namespace tfe::test
