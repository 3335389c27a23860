// Graph replay against eager passes, bit for bit, and the graph cache's capture / update / eviction.
#include <algorithm>
#include <cstring>

#include "graphs/graph_cache.h"
#include "head/presets.h"
#include "device/cuda_check.h"
#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

// Two runtimes on one head, one replaying graphs and one launching node by node, fed the same calls:
// every output and every state buffer must match to the bit, for each bucket and step count. Outputs and
// activations are filled with 0xFF (NaN in bf16 and fp32, -1 as int32) before each pass, so a pass that
// leaves a value unwritten cannot match by leftover. `dependent`: how the graph runtime launches; the
// eager one never overlaps kernels, so programmatic launch is held to the plain order's bits. `window`
// other than 0 replaces the preset's, so that attention splits the keys over a cluster (32 keys a CTA
// at least: the tiny presets' 16 keys take one CTA). `graph_stream`: the graph runtime's stream (null:
// its own). `first_ranks`: the plan option on, each draft's slots taking ranks 0..7.
void graph_vs_eager(const std::string& preset, Fp8Mode fp8,
                    testing::Hooks::DependentLaunch dependent = testing::Hooks::DependentLaunch::plan,
                    int64_t window = 0, cudaStream_t graph_stream = nullptr, bool first_ranks = false) {
  HeadHeader header = preset_header(preset);
  if (window) header.window = window;
  auto head = random_head_image(header, 11, fp8 != Fp8Mode::off);
  const HeadHeader& h = head->file.header();
  PlanOptions po = test_plan_options(fp8);
  po.first_ranks = first_ranks;
  testing::Hooks gh;
  gh.dependent_launch = dependent;
  OpenOptions go = test_open_options(po, true);
  go.stream = graph_stream;
  Runtime graph = testing::open(head->file, go, gh);
  testing::Hooks eh;
  eh.dependent_launch = testing::Hooks::DependentLaunch::off;
  Runtime eager = testing::open(head->file, test_open_options(po, false), eh);
  REQUIRE(graph.graphs_enabled());
  REQUIRE_FALSE(eager.graphs_enabled());

  std::mt19937_64 rng(5);
  std::vector<Rows> prefix;
  // Lengths 3..W + 7: some shorter than the window, some longer, all within one ring (W + 1 + max_steps).
  for (int s = 0; s < 16; ++s) prefix.push_back(random_rows(rng, h, s, 0, 3 + (13 * s) % (h.window + 5)));
  graph.extend(requests(prefix));
  eager.extend(requests(prefix));

  std::vector<std::string> compared = {"out_token", "out_conf", "host_token", "host_conf", "h2",
                                       "n",         "slot_g",   "ring_k",     "ring_v"};
  std::vector<std::string> filled = {"out_token", "out_conf", "host_token", "host_conf", "host_done",
                                     "h2",        "n",        "x",          "h1"};
  if (first_ranks)
    for (const char* b : {"logits", "rank"}) {
      compared.push_back(b);
      filled.push_back(b);
    }
  for (int bucket : po.buckets) {
    std::vector<int> slots;
    std::vector<int> ranks;
    for (int s = 0; s < bucket; ++s) {
      slots.push_back((s * 7) % 16);  // distinct, not in order
      if (first_ranks) ranks.push_back((3 * s + bucket) % (kMaxFirstRank + 1));
    }
    for (int steps = 1; steps <= po.max_steps; ++steps) {
      CAPTURE(bucket);
      CAPTURE(steps);
      for (Runtime* r : {&graph, &eager})
        for (const auto& b : filled) tfe::testing::fill_buffer(*r, b, 0xFF);
      const DraftResult a = graph.draft(slots, steps, ranks);
      const DraftResult b = eager.draft(slots, steps, ranks);
      CHECK(std::memcmp(a.tokens.data(), b.tokens.data(), a.tokens.size() * sizeof(int32_t)) == 0);
      CHECK(std::memcmp(a.confidences.data(), b.confidences.data(), a.confidences.size() * sizeof(float)) == 0);
      for (size_t i = 0; i < a.tokens.size(); ++i) {
        CHECK(a.tokens[i] >= 0);
        CHECK(a.tokens[i] < h.vocab);
        CHECK(a.confidences[i] > 0.0f);  // false for NaN: every asked output was written
        CHECK(a.confidences[i] <= 1.0f);
      }
      for (const auto& name : compared) {
        CAPTURE(name);
        CHECK(tfe::testing::read_buffer(graph, name) == tfe::testing::read_buffer(eager, name));
      }
      // The host arena's outputs are the device outputs' copy, entry for entry (unwritten ones NaN in both).
      CHECK(tfe::testing::read_buffer(graph, "host_token") == tfe::testing::read_buffer(graph, "out_token"));
      CHECK(tfe::testing::read_buffer(graph, "host_conf") == tfe::testing::read_buffer(graph, "out_conf"));
      // The completion word the host polled: set by the pass (filled with -1 before, cleared by draft()).
      const int32_t one = 1;
      const std::vector<std::byte> done(reinterpret_cast<const std::byte*>(&one),
                                        reinterpret_cast<const std::byte*>(&one) + sizeof one);
      CHECK(tfe::testing::read_buffer(graph, "host_done") == done);
      CHECK(tfe::testing::read_buffer(eager, "host_done") == done);
    }
  }
  const RuntimeStats gs = graph.stats(), es = eager.stats();
  CHECK(gs.replays == po.buckets.size() * static_cast<size_t>(po.max_steps));
  CHECK(gs.eager_passes == 0);
  CHECK(gs.captures == po.buckets.size() * static_cast<size_t>(po.max_steps));  // all at open, none since
  CHECK(es.replays == 0);
  CHECK(es.eager_passes == po.buckets.size() * static_cast<size_t>(po.max_steps));
}

TFE_GPU_TEST_CASE("graphs: replay equals eager bit for bit, tiny dense, every bucket and step") {
  graph_vs_eager("tiny", Fp8Mode::off);
}
// FP8 takes the row scale inside the lm_head gemv's top1 epilogue.
TFE_GPU_TEST_CASE("graphs: replay equals eager bit for bit, tiny dense FP8") {
  graph_vs_eager("tiny", Fp8Mode::require);
}
TFE_GPU_TEST_CASE("graphs: replay equals eager bit for bit, tiny two_stage FP8") {
  graph_vs_eager("tiny-two-stage", Fp8Mode::require);
}
TFE_GPU_TEST_CASE("graphs: replay equals eager bit for bit, tiny dense FP8 with first ranks") {
  graph_vs_eager("tiny", Fp8Mode::require, testing::Hooks::DependentLaunch::plan, 0, nullptr, true);
}
TFE_GPU_TEST_CASE("graphs: replay with dependent launch on every node equals plain eager, tiny dense bf16") {
  graph_vs_eager("tiny", Fp8Mode::off, testing::Hooks::DependentLaunch::all);
}
TFE_GPU_TEST_CASE("graphs: replay with dependent launch on every node equals plain eager, tiny two_stage FP8") {
  graph_vs_eager("tiny-two-stage", Fp8Mode::require, testing::Hooks::DependentLaunch::all);
}
// A window of 96 keys: attention's chunks over a cluster of 3 CTAs and their join, in every bucket.
TFE_GPU_TEST_CASE("graphs: replay equals eager bit for bit, tiny dense bf16, attention over a cluster of 3") {
  graph_vs_eager("tiny", Fp8Mode::off, testing::Hooks::DependentLaunch::plan, 95);
}

// The legacy default stream (torch's) cannot capture: the runtime captures on a stream of its own and
// replays there.
TFE_GPU_TEST_CASE("graphs: replay on the legacy default stream equals eager bit for bit, tiny dense bf16") {
  graph_vs_eager("tiny", Fp8Mode::off, testing::Hooks::DependentLaunch::plan, 0, cudaStreamLegacy);
}

TFE_GPU_TEST_CASE("graphs: lazy capture captures each key once, at its first replay") {
  auto head = random_head_image("tiny", 3, false);
  testing::Hooks hooks;
  hooks.capture = testing::Hooks::Capture::lazy;
  Runtime rt = testing::open(head->file, test_open_options(test_plan_options()), hooks);
  CHECK(rt.stats().captures == 0);
  std::mt19937_64 rng(1);
  auto rows = random_rows(rng, head->file.header(), 0, 0, 9);
  const std::vector<ExtendRequest> req = {rows.request()};
  rt.extend(req);
  const std::vector<int> slots = {0};
  const DraftResult first = rt.draft(slots, 3);
  const DraftResult second = rt.draft(slots, 3);
  CHECK(rt.stats().captures == 1);
  CHECK(rt.stats().replays == 2);
  CHECK(first.tokens == second.tokens);  // a draft does not change a slot's real state
  (void)rt.draft(slots, 2);
  CHECK(rt.stats().captures == 2);
}

// The cache on its own, with memset nodes: capture, an update when the bound address changes, the
// bindings check, and eviction of the least recently used executor.
TFE_GPU_TEST_CASE("graphs: cache updates an executor whose addresses changed and refuses stale bindings") {
  cuda::Stream stream = cuda::create_stream();
  cuda::DeviceMemory a = cuda::allocate_device(4096, "a"), b = cuda::allocate_device(4096, "b");
  std::byte* target = a.data();
  const GraphCache::Record record = [&](cudaStream_t s) { TFE_CUDA(cudaMemsetAsync(target, 0x5A, 4096, s)); };
  GraphCache cache(stream.get(), 2, true);
  const GraphKey key{1, 1};
  cache.run(key, Bindings{a.data()}, record);
  CHECK(cache.counters().captures == 1);

  target = b.data();
  TFE_CUDA(cudaMemsetAsync(b.data(), 0, 4096, stream.get()));
  CHECK_THROWS_WITH_AS(cache.replay(key, Bindings{b.data()}), doctest::Contains("was captured with arena"), tfe::Error);
  cache.run(key, Bindings{b.data()}, record);  // re-captured and applied by cudaGraphExecUpdate
  CHECK(cache.counters().updates + cache.counters().reinstantiated == 1);
  std::vector<uint8_t> host(4096);
  TFE_CUDA(cudaStreamSynchronize(stream.get()));
  TFE_CUDA(cudaMemcpy(host.data(), b.data(), host.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(host.begin(), host.end(), [](uint8_t v) { return v == 0x5A; }));

  cache.run(GraphKey{2, 1}, Bindings{b.data()}, record);
  cache.run(GraphKey{4, 1}, Bindings{b.data()}, record);  // capacity 2: evicts (1, 1)
  CHECK(cache.size() == 2);
  CHECK(cache.counters().evictions == 1);
  CHECK_FALSE(cache.contains(key));
  CHECK_THROWS_WITH_AS(cache.replay(key, Bindings{b.data()}), doctest::Contains("has not been captured"), tfe::Error);
}

}  // namespace
}  // namespace tfe::test
