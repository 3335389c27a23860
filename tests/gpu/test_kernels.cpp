// Each kernel of a draft step against reference/ops.h, on the GPU's own inputs: one pass of
// one step leaves every intermediate in the arena (g, x, qkv, q, ring K/V, o, h1, post, m, h2, n and
// the vocabulary head's outputs), and each is recomputed on the CPU from the GPU's values before it, so
// a difference is the kernel's alone. A head whose RoPE runs in the wqkv gemv's epilogue (gemv_rope_kv)
// leaves no qkv: its q and ring K/V are checked against the reference's linear and RoPE of the GPU's x,
// and "kernels: gemv_rope_kv ..." checks them bit for bit against the two-node path. Every preset's specializations run
// (the big presets with random weights made in memory), for each bucket's row count.
//
// Tolerances: bf16 outputs: more than one bf16 ulp apart on at most 0.1% of the elements (and at least
// one element allowed), normalized error < 1e-2; fp32 scores and exact logits: normalized error < 1e-4;
// the dense head's top1 partials (its logits are never stored) and top1's picks: check_top1 (gpu_test.h),
// the draft id equal where the reference's top two differ by more than 1e-3 (relative).
// Selections made without arithmetic on the GPU's own values (topk's candidates, the
// two_stage pick) are exact, ties to the lower id included.
#include <algorithm>
#include <functional>
#include <numeric>
#include <thread>

#include "head/presets.h"
#include "reference/ops.h"
#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

void check_bf16(const char* what, std::span<const bf16_bits> got, std::span<const bf16_bits> want) {
  CAPTURE(what);
  REQUIRE(got.size() == want.size());
  const Bf16Diff d = compare_bf16(got, want);
  CAPTURE(d.first_bad);
  CHECK(d.beyond_one_ulp <= std::max<size_t>(1, d.n / 1000));
  CHECK(d.normalized_error < 1e-2);
}

template <typename T>
std::span<const T> row(const std::vector<T>& v, int64_t r, int64_t width) {
  return std::span<const T>(v).subspan(static_cast<size_t>(r * width), static_cast<size_t>(width));
}

const KernelSpec& node_spec(const Plan& plan, std::string_view node) {
  for (const auto& b : plan.buckets)
    for (const auto& n : b.nodes)
      if (n.name == node) return plan.spec(n.spec);
  fail("plan has no node `{}`", node);
}
// The spec of a node of one bucket (specs that depend on the row count, e.g. the lm_head gemv's COLS).
const KernelSpec& node_spec(const Plan& plan, int streams, std::string_view node) {
  for (const auto& b : plan.buckets)
    if (b.streams == streams)
      for (const auto& n : b.nodes)
        if (n.name == node) return plan.spec(n.spec);
  fail("plan has no node `{}` in bucket {}", node, streams);
}

struct Step {
  const HeadFile& file;
  const Plan& plan;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  bool matrix_fp8(std::string_view linear) const {
    std::string m(linear);
    if (m == "wq" || m == "wk" || m == "wv") m = "wqkv";
    if (m == "w_gate" || m == "w_up") m = "w_gate_up";
    return plan.weights.at(m).dtype == DType::F8_E4M3;
  }
  ref::Linear linear(const std::string& name) const {
    const auto shape = linear_shape(file.header(), name);
    if (matrix_fp8(name))
      return ref::Linear::fp8(name, file.tensor(name + ".fp8").as<uint8_t>(), file.tensor(name + ".scale").as<float>(),
                              shape[0], shape[1]);
    return ref::Linear::bf16(name, file.tensor(name).as<bf16_bits>(), shape[0], shape[1]);
  }
  std::span<const bf16_bits> norm(const std::string& name) const { return file.tensor(name).as<bf16_bits>(); }
  std::vector<bf16_bits> lin(const std::string& name, const std::vector<bf16_bits>& x, int64_t rows) const {
    const auto l = linear(name);
    std::vector<bf16_bits> y(static_cast<size_t>(rows * l.out));
    ref::linear(l, x, y, threads);
    return y;
  }
};

void check_step(Runtime& rt, const HeadFile& file, int rows) {
  const Plan& plan = tfe::testing::plan(rt);
  const HeadHeader& h = plan.header;
  const Step st{file, plan};
  const int64_t H = h.hidden, hd = h.head_dim, qw = h.heads * hd, kvw = h.kv_heads * hd, F = h.ffn, R = rt.ring_rows();
  auto buf = [&](const char* n) { return as_vector<bf16_bits>(tfe::testing::read_buffer(rt, n)); };
  const auto slot = as_vector<int32_t>(tfe::testing::read_buffer(rt, "slot"));
  const auto pos = as_vector<int32_t>(tfe::testing::read_buffer(rt, "pos"));
  const auto first_pos = as_vector<int32_t>(tfe::testing::read_buffer(rt, "first_pos"));
  const auto tok = as_vector<int32_t>(tfe::testing::read_buffer(rt, "tok"));
  const bool rope_in_wqkv = plan.arena.find("qkv") == nullptr;
  const auto g = buf("g"), x = buf("x"), q = buf("q"), o = buf("o"), h1 = buf("h1");
  const auto qkv = rope_in_wqkv ? std::vector<bf16_bits>{} : buf("qkv");
  const auto post = buf("post"), m = buf("m"), h2 = buf("h2"), n = buf("n");
  const auto ring_k = buf("ring_k"), ring_v = buf("ring_v"), slot_g = buf("slot_g");
  const auto inv_freq = rope_inv_freq(h);
  const auto embed = file.tensor("embed").as<bf16_bits>();

  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    // copy_rows (gather): exact.
    CHECK(std::equal(g.begin() + r * H, g.begin() + (r + 1) * H, slot_g.begin() + slot[r] * H));
    // prepare_x
    std::vector<bf16_bits> xr(static_cast<size_t>(2 * H));
    ref::rmsnorm(embed.subspan(static_cast<size_t>(tok[r] * H), static_cast<size_t>(H)), st.norm("input_norm"),
                 h.rms_eps, std::span<bf16_bits>(xr).first(static_cast<size_t>(H)));
    ref::rmsnorm(row(g, r, H), st.norm("hidden_norm"), h.rms_eps,
                 std::span<bf16_bits>(xr).last(static_cast<size_t>(H)));
    check_bf16("prepare_x", row(x, r, 2 * H), xr);
  }
  // wqkv gemv on the GPU's x.
  const std::vector<bf16_bits> xs(x.begin(), x.begin() + rows * 2 * H);
  const auto qr = st.lin("wq", xs, rows), kr = st.lin("wk", xs, rows), vr = st.lin("wv", xs, rows);
  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    auto position = [&](std::span<const bf16_bits> in, const char* norm) {
      std::vector<bf16_bits> a(in.begin(), in.end()), b(a.size());
      if (h.qk_norm) {
        ref::rmsnorm(in, st.norm(norm), h.rms_eps, b);
        a = b;
      }
      ref::rope(a, hd, pos[r], inv_freq, b);
      return b;
    };
    const size_t at = static_cast<size_t>((slot[r] * R + pos[r] % R) * kvw);
    const std::span<const bf16_bits> rk(ring_k.data() + at, static_cast<size_t>(kvw));
    const std::span<const bf16_bits> rv(ring_v.data() + at, static_cast<size_t>(kvw));
    if (rope_in_wqkv) {
      // Against the reference's linear, then its RoPE: the GEMV's tolerance (a sum that rounds to the
      // neighbouring bf16, rare at fp32 summation error, is rotated from there).
      check_bf16("gemv_rope_kv: q", row(q, r, qw), position(row(qr, r, qw), "q_norm"));
      check_bf16("gemv_rope_kv: ring k", rk, position(row(kr, r, kvw), "k_norm"));
      check_bf16("gemv_rope_kv: ring v", rv, row(vr, r, kvw));
    } else {
      const auto got = row(qkv, r, qw + 2 * kvw);
      check_bf16("wqkv: q", got.first(static_cast<size_t>(qw)), row(qr, r, qw));
      check_bf16("wqkv: k", got.subspan(static_cast<size_t>(qw), static_cast<size_t>(kvw)), row(kr, r, kvw));
      check_bf16("wqkv: v", got.last(static_cast<size_t>(kvw)), row(vr, r, kvw));
      // qk_rope_kv on the GPU's qkv.
      check_bf16("qk_rope_kv: q", row(q, r, qw), position(got.first(static_cast<size_t>(qw)), "q_norm"));
      check_bf16("qk_rope_kv: ring k", rk,
                 position(got.subspan(static_cast<size_t>(qw), static_cast<size_t>(kvw)), "k_norm"));
      CHECK(std::equal(rv.begin(), rv.end(), got.last(static_cast<size_t>(kvw)).begin()));  // v is stored as is
    }
    // ring_attention on the GPU's q and ring.
    std::vector<bf16_bits> keys, values, orf(static_cast<size_t>(qw));
    for (int64_t p = std::max<int64_t>(first_pos[r], pos[r] - h.window); p <= pos[r]; ++p) {
      const size_t a = static_cast<size_t>((slot[r] * R + p % R) * kvw);
      keys.insert(keys.end(), ring_k.begin() + a, ring_k.begin() + a + kvw);
      values.insert(values.end(), ring_v.begin() + a, ring_v.begin() + a + kvw);
    }
    ref::attention(row(q, r, qw), keys, values, h.heads, h.kv_heads, hd, orf);
    check_bf16("ring_attention", row(o, r, qw), orf);
  }
  auto first_rows = [&](const std::vector<bf16_bits>& v, int64_t w) {
    return std::vector<bf16_bits>(v.begin(), v.begin() + rows * w);
  };
  {
    std::vector<bf16_bits> want(static_cast<size_t>(rows * H));
    ref::linear_residual(st.linear("wo"), first_rows(o, qw), first_rows(g, H), want, st.threads);
    check_bf16("wo (residual epilogue)", std::span<const bf16_bits>(h1).first(want.size()), want);
    ref::rmsnorm(first_rows(h1, H), st.norm("post_norm"), h.rms_eps, want);
    check_bf16("post_norm", std::span<const bf16_bits>(post).first(want.size()), want);
    const auto gate = st.lin("w_gate", first_rows(post, H), rows), up = st.lin("w_up", first_rows(post, H), rows);
    std::vector<bf16_bits> mw(gate.size());
    ref::swiglu(gate, up, mw);
    check_bf16("w_gate_up (SwiGLU epilogue)", std::span<const bf16_bits>(m).first(mw.size()), mw);
    ref::linear_residual(st.linear("w_down"), first_rows(m, F), first_rows(h1, H), want, st.threads);
    check_bf16("w_down (residual epilogue)", std::span<const bf16_bits>(h2).first(want.size()), want);
    ref::rmsnorm(first_rows(h2, H), st.norm("final_norm"), h.rms_eps, want);
    check_bf16("final_norm", std::span<const bf16_bits>(n).first(want.size()), want);
  }
  const auto out_token = as_vector<int32_t>(tfe::testing::read_buffer(rt, "out_token"));
  const auto out_conf = as_vector<float>(tfe::testing::read_buffer(rt, "out_conf"));
  const auto d2t = file.tensor("d2t").as<int32_t>();
  const int64_t Vd = h.draft_vocab, ms = plan.options.max_steps;
  const auto nr = first_rows(n, H);
  if (h.head_type == HeadType::dense) {
    // The lm_head gemv stores no logits, only its top1 partials (one per CTA and row, at its COLS): they
    // and top1's join against the reference logits of the GPU's n (check_top1 states the tolerances).
    std::vector<float> want(static_cast<size_t>(rows * Vd));
    ref::linear_f32(st.linear("lm_head"), nr, want, st.threads);
    const KernelSpec& lm = node_spec(plan, rows, "s1.lm_head");
    REQUIRE(lm.constant("EPILOGUE") == kc::kEpilogueTop1);
    REQUIRE(node_spec(plan, rows, "s1.top1").constant("COLS") == lm.constant("COLS"));
    const auto parts = as_vector<Top1Record>(tfe::testing::read_buffer(rt, "top1_part"));
    check_top1(want, rows, Vd, lm.constant("COLS"), parts, d2t, out_token, out_conf, ms);
  } else {
    const auto u = buf("u");
    const auto scores = as_vector<float>(tfe::testing::read_buffer(rt, "scores"));
    const auto cand = as_vector<int32_t>(tfe::testing::read_buffer(rt, "cand"));
    const auto exact = as_vector<float>(tfe::testing::read_buffer(rt, "exact"));
    const auto ur = st.lin("lr_a", nr, rows);
    check_bf16("lr_a", std::span<const bf16_bits>(u).first(ur.size()), ur);
    std::vector<float> sw(static_cast<size_t>(rows * Vd));
    ref::linear_f32(st.linear("lr_b"), first_rows(u, h.lowrank), sw, st.threads);
    CHECK(f32_error(std::span<const float>(scores).first(sw.size()), sw) < 1e-4);
    const auto th = st.linear("target_head");
    const int64_t K = h.cand_k;
    for (int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      const auto s = row(scores, r, Vd);
      // topk selects on the GPU's scores without arithmetic: exact, ties included, ids ascending.
      std::vector<int32_t> best = ref::topk(s, static_cast<int>(K));
      std::sort(best.begin(), best.end());
      const auto got = row(cand, r, K);
      CHECK(std::vector<int32_t>(got.begin(), got.end()) == best);
      // rescore's logits on the GPU's candidates.
      std::vector<float> want;
      std::vector<int32_t> target;
      const auto nf = ref::widen(row(n, r, H));
      for (int32_t c : got) {
        target.push_back(c + d2t[static_cast<size_t>(c)]);
        want.push_back(th.acc(target.back(), nf.data()));
      }
      const auto logits = row(exact, r, K);
      CHECK(f32_error(logits, want) < 1e-4);
      // rescore's join on the GPU's exact logits: the pick is exact, the confidence differs in summation
      // order only.
      const ref::Rescored rs = ref::rescore(logits, target);
      CHECK(out_token[r * ms] == rs.target_id);
      CHECK(std::fabs(out_conf[r * ms] - rs.confidence) <= 1e-5f * rs.confidence + 1e-7f);
    }
  }
}

// The second half of kernels_vs_reference: one step of each bucket, checked kernel by kernel.
void check_buckets(Runtime& rt, const HeadImage& head, const std::vector<int>& buckets) {
  for (int b : buckets) {
    CAPTURE(b);
    std::vector<int> slots(static_cast<size_t>(b));
    std::iota(slots.begin(), slots.end(), 0);
    (void)rt.draft(slots, 1);  // step 1 leaves its intermediates in the arena
    check_step(rt, head.file, b);
  }
}

// Slot s holds prefix(s) rows from position 0, extended in requests of at most `per_request` rows.
void kernels_vs_reference(const HeadImage& head, bool fp8, std::vector<int> buckets, int max_steps,
                          const std::function<int64_t(int)>& prefix, int64_t per_request = 1 << 30) {
  const HeadHeader& h = head.file.header();
  PlanOptions po = test_plan_options(fp8 ? Fp8Mode::require : Fp8Mode::off);
  po.buckets = buckets;
  po.max_slots = buckets.back();
  po.max_steps = max_steps;
  Runtime rt = Runtime::open(head.file, test_open_options(po));
  std::mt19937_64 rng(17);
  for (int64_t at = 0;; at += per_request) {
    std::vector<Rows> rows;
    for (int s = 0; s < buckets.back(); ++s)
      if (prefix(s) > at) rows.push_back(random_rows(rng, h, s, at, std::min(per_request, prefix(s) - at)));
    if (rows.empty()) break;
    rt.extend(requests(rows));
  }
  check_buckets(rt, head, buckets);
}

void kernels_vs_reference(const std::string& preset, bool fp8, std::vector<int> buckets, int max_steps) {
  auto head = random_head_image(preset, 81, fp8);
  kernels_vs_reference(*head, fp8, buckets, max_steps, [](int s) { return 1 + (s * 3) % 20; });
}

TFE_GPU_TEST_CASE("kernels: tiny, bf16 and FP8, every bucket") {
  for (bool fp8 : {false, true}) kernels_vs_reference("tiny", fp8, {1, 2, 4, 8, 16}, 8);
}
TFE_GPU_TEST_CASE("kernels: tiny-two-stage, bf16 and FP8, every bucket") {
  for (bool fp8 : {false, true}) kernels_vs_reference("tiny-two-stage", fp8, {1, 2, 4, 8, 16}, 8);
}
TFE_GPU_TEST_CASE("kernels: llama3-8b-eagle3 shapes (random weights in memory), bf16 and FP8") {
  for (bool fp8 : {false, true}) kernels_vs_reference("llama3-8b-eagle3", fp8, {1, 16}, 8);
}
TFE_GPU_TEST_CASE("kernels: tfe-two-stage shapes (random weights in memory), bf16 and FP8") {
  for (bool fp8 : {false, true}) kernels_vs_reference("tfe-two-stage", fp8, {1, 16}, 8);
}
// gemv_rope_kv against the wqkv gemv and qk_rope_kv node it replaces (tuning rope_in_wqkv): the
// same head, extends and draft on two runtimes, one of each path; q, the ring and the drafts must be the
// same bits (q and the outputs filled with 0xFF, a NaN pattern, before each pass). Every bucket of tiny,
// and llama3's shapes at 1 and 16 rows (COLS 32 in FP8), bf16 and FP8.
void rope_paths_agree(const std::string& preset, bool fp8, std::vector<int> buckets) {
  auto head = random_head_image(preset, 87, fp8);
  const HeadHeader& h = head->file.header();
  std::vector<std::unique_ptr<Runtime>> rts;
  for (bool in_wqkv : {true, false}) {
    PlanOptions po = test_plan_options(fp8 ? Fp8Mode::require : Fp8Mode::off);
    po.buckets = buckets;
    po.max_slots = buckets.back();
    po.max_steps = 3;
    tfe::testing::Hooks hooks;
    hooks.tuning.rope_in_wqkv = in_wqkv;
    rts.push_back(std::make_unique<Runtime>(tfe::testing::open(head->file, test_open_options(po), hooks)));
  }
  const Plan& fused = tfe::testing::plan(*rts[0]);
  REQUIRE(fused.arena.find("qkv") == nullptr);                        // gemv_rope_kv
  REQUIRE(tfe::testing::plan(*rts[1]).arena.find("qkv") != nullptr);  // wqkv gemv + qk_rope_kv
  std::mt19937_64 rng(23);
  std::vector<Rows> rows;
  for (int s = 0; s < buckets.back(); ++s) rows.push_back(random_rows(rng, h, s, 0, 1 + (s * 5) % 13));
  for (auto& rt : rts) rt->extend(requests(rows));
  for (int b : buckets) {
    CAPTURE(b);
    std::vector<int> slots(static_cast<size_t>(b));
    std::iota(slots.begin(), slots.end(), 0);
    std::vector<std::vector<std::byte>> q, ring_k, ring_v, tokens, conf;
    for (auto& rt : rts) {
      for (const char* name : {"q", "out_token", "out_conf"}) tfe::testing::fill_buffer(*rt, name, 0xFF);
      (void)rt->draft(slots, 3);
      q.push_back(tfe::testing::read_buffer(*rt, "q"));
      ring_k.push_back(tfe::testing::read_buffer(*rt, "ring_k"));
      ring_v.push_back(tfe::testing::read_buffer(*rt, "ring_v"));
      tokens.push_back(tfe::testing::read_buffer(*rt, "out_token"));
      conf.push_back(tfe::testing::read_buffer(*rt, "out_conf"));
    }
    CHECK(q[0] == q[1]);
    CHECK(ring_k[0] == ring_k[1]);
    CHECK(ring_v[0] == ring_v[1]);
    CHECK(tokens[0] == tokens[1]);
    CHECK(conf[0] == conf[1]);
    // The 0xFF fill is gone from every drafted row's q.
    const auto qv = as_vector<uint16_t>(q[0]);
    CHECK(std::count(qv.begin(), qv.begin() + b * h.heads * h.head_dim, uint16_t{0xFFFF}) == 0);
  }
}

TFE_GPU_TEST_CASE("kernels: gemv_rope_kv equals the wqkv gemv and qk_rope_kv bit for bit, tiny and llama3 shapes") {
  for (bool fp8 : {false, true}) {
    CAPTURE(fp8);
    rope_paths_agree("tiny", fp8, {1, 2, 4, 8, 16});
    rope_paths_agree("llama3-8b-eagle3", fp8, {1, 16});
  }
}

// gemv_cluster (tfe-two-stage's FP8 lr_a: each column tile's K over a cluster of CTAs) on one head against the
// plain gemv (tuning gemv_cluster false), and its graph replay against an eager pass of the same plan. The
// cluster sums each column in another order, so u is held to the plain gemv's by check_bf16's tolerance
// (one bf16 step, beyond it one value in a thousand; the normalized error under 1e-2); replay and eager
// must agree bit for bit. u and the outputs are filled with 0xFF (a NaN pattern) before each pass, so an
// unwritten column cannot pass.
TFE_GPU_TEST_CASE("kernels: gemv_cluster against the plain gemv, and its graph replay against eager bit for bit, FP8") {
  auto head = random_head_image("tfe-two-stage", 89, true);
  const HeadHeader& h = head->file.header();
  PlanOptions po = test_plan_options(Fp8Mode::require);
  po.buckets = {1, 16};
  po.max_slots = 16;
  po.max_steps = 2;
  std::vector<std::unique_ptr<Runtime>> rts;  // cluster graph, cluster eager, plain gemv
  for (const auto& [cluster, graphs] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    tfe::testing::Hooks hooks;
    hooks.tuning.gemv_cluster = cluster;
    rts.push_back(std::make_unique<Runtime>(tfe::testing::open(head->file, test_open_options(po, graphs), hooks)));
  }
  const auto lr_a_kernel = [](const Plan& plan) {
    for (const Node& n : plan.buckets.front().nodes)
      if (n.name.ends_with("lr_a")) return plan.spec(n.spec).kernel;
    return std::string("none");
  };
  REQUIRE(lr_a_kernel(tfe::testing::plan(*rts[0])) == "gemv_cluster");
  REQUIRE(lr_a_kernel(tfe::testing::plan(*rts[2])) == "gemv");
  std::mt19937_64 rng(29);
  std::vector<Rows> rows;
  for (int s = 0; s < 16; ++s) rows.push_back(random_rows(rng, h, s, 0, 1 + (s * 5) % 13));
  for (auto& rt : rts) rt->extend(requests(rows));
  for (int b : po.buckets) {
    CAPTURE(b);
    std::vector<int> slots(static_cast<size_t>(b));
    std::iota(slots.begin(), slots.end(), 0);
    std::vector<std::vector<std::byte>> u, tokens, conf;
    for (auto& rt : rts) {
      for (const char* name : {"u", "scores", "out_token", "out_conf"}) tfe::testing::fill_buffer(*rt, name, 0xFF);
      (void)rt->draft(slots, 2);
      u.push_back(tfe::testing::read_buffer(*rt, "u"));
      tokens.push_back(tfe::testing::read_buffer(*rt, "out_token"));
      conf.push_back(tfe::testing::read_buffer(*rt, "out_conf"));
    }
    CHECK(u[0] == u[1]);
    CHECK(tokens[0] == tokens[1]);
    CHECK(conf[0] == conf[1]);
    const auto clustered = as_vector<bf16_bits>(u[0]), plain = as_vector<bf16_bits>(u[2]);
    const size_t n = static_cast<size_t>(b) * static_cast<size_t>(h.lowrank);
    check_bf16("u", std::span<const bf16_bits>(clustered).first(n), std::span<const bf16_bits>(plain).first(n));
  }
}

// 16 query heads of 256 over 2 kv heads (8 per group): ring_attention keeps 4 key passes in flight instead of
// 8 there (its registers would spill at 8), so the window must span many passes: a window of 511 keys, full
// after prefixes of 600 and 530 rows (in requests of 100, under the ring's 520 rows).
TFE_GPU_TEST_CASE("kernels: 16 query heads of 256 over 2 kv heads, a full window of 511 keys, bf16") {
  HeadHeader h = preset_header("tiny");
  h.name = "tiny-wide-heads";
  h.heads = 16;
  h.kv_heads = 2;
  h.head_dim = 256;
  h.window = 511;
  auto head = random_head_image(h, 83, false);
  kernels_vs_reference(
      *head, false, {1, 2}, 2, [](int s) { return s == 0 ? 600 : 530; }, 100);
}

}  // namespace
}  // namespace tfe::test
