// The engine's door (include/tfe/runtime.h): an extend of device rows, the enqueued draft, and a draft
// recorded into the caller's own stream capture, each against the host forms bit for bit; device input the
// host never sees, checked on the device and reported by name; calls a capturing stream cannot hold,
// refused.
#include <cmath>
#include <cstring>

#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

#define CHECK_CUDA(call) REQUIRE((call) == cudaSuccess)

void check_bits_equal(const DraftResult& got, const DraftResult& want) {
  REQUIRE(got.tokens.size() == want.tokens.size());
  CHECK(got.tokens == want.tokens);
  CHECK(std::memcmp(got.confidences.data(), want.confidences.data(), want.confidences.size() * sizeof(float)) == 0);
}

// Device outputs [rows, row_stride] read back into a DraftResult's layout.
DraftResult read_back(const int32_t* tokens, const float* confidences, int64_t row_stride, int rows, int steps) {
  DraftResult r;
  r.streams = rows;
  r.steps = steps;
  r.tokens.resize(static_cast<size_t>(rows * steps));
  r.confidences.resize(r.tokens.size());
  CHECK_CUDA(cudaMemcpy2D(r.tokens.data(), steps * 4, tokens, static_cast<size_t>(row_stride) * 4, steps * 4, rows,
                          cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy2D(r.confidences.data(), steps * 4, confidences, static_cast<size_t>(row_stride) * 4, steps * 4,
                          rows, cudaMemcpyDeviceToHost));
  return r;
}

void fill_nan(void* p, size_t bytes) { CHECK_CUDA(cudaMemset(p, 0xff, bytes)); }  // NaN floats, -1 ints

TFE_GPU_TEST_CASE("device calls: an extend of strided device rows drafts what the host form drafts, bit for bit") {
  auto head = random_head_image("tiny", 41, false);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  Runtime host = Runtime::open(head->file, test_open_options(po));
  Runtime device = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(3);
  const std::vector<int> slots = {0, 1, 2, 3, 4, 5};
  std::vector<Rows> prefix;
  // 20 rows (within the tiny head's ring of 24) run in two chunks of 16: a request split across chunks.
  for (int s : slots) prefix.push_back(random_rows(rng, h, s, 3 * s, s == 2 ? 20 : 1 + 3 * s));
  host.extend(requests(prefix));
  const DeviceRows d = to_device(prefix, row_width(h), row_width(h) + 24);
  device.extend(d.requests);
  CHECK(device.stats().bytes_uploaded < host.stats().bytes_uploaded);  // only tables crossed
  for (int round = 0; round < 8; ++round) {
    CAPTURE(round);
    for (int steps = 1; steps <= po.max_steps; ++steps)
      for (size_t n : {size_t{1}, size_t{4}, slots.size()}) {
        const std::span<const int> some(slots.data(), n);
        check_bits_equal(device.draft(some, steps), host.draft(some, steps));
      }
    std::vector<Rows> next;
    for (int s : slots) next.push_back(random_rows(rng, h, s, host.slots().last_pos(s) + 1, 1 + (round + s) % 5));
    host.extend(requests(next));
    const DeviceRows dn = to_device(next, row_width(h), row_width(h));  // packed rows: stride 0 means the same
    device.extend(dn.requests);
    device.synchronize();  // the device buffers of `dn` go out of scope
  }
  CHECK_NOTHROW(device.synchronize());
  CHECK_THROWS_WITH_AS(device.slots().last_token(0), doctest::Contains("in device memory"), Error);
}

TFE_GPU_TEST_CASE("device calls: draft_async equals draft bit for bit, into NaN-filled targets, host and device ids") {
  auto head = random_head_image("tiny-two-stage", 43, true);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::require);
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(5);
  const std::vector<int> slots = {4, 0, 7, 2, 9};
  std::vector<Rows> prefix;
  for (int s : slots) prefix.push_back(random_rows(rng, h, s, 0, 2 + s));
  rt.extend(requests(prefix));
  const int64_t stride = po.max_steps + 3;
  cuda::DeviceMemory tokens = cuda::allocate_device(slots.size() * stride * 4, "targets.tokens");
  cuda::DeviceMemory confs = cuda::allocate_device(slots.size() * stride * 4, "targets.confidences");
  cuda::DeviceMemory ids = cuda::allocate_device(slots.size() * 4, "device slot ids");
  CHECK_CUDA(cudaMemcpy(ids.data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const DraftTargets targets{reinterpret_cast<int32_t*>(tokens.data()), reinterpret_cast<float*>(confs.data()), stride};
  const int n = static_cast<int>(slots.size());
  for (int steps = 1; steps <= po.max_steps; ++steps) {
    CAPTURE(steps);
    const DraftResult want = rt.draft(slots, steps);
    for (bool device_ids : {false, true}) {
      CAPTURE(device_ids);
      fill_nan(tokens.data(), tokens.bytes());
      fill_nan(confs.data(), confs.bytes());
      const DeviceDraftOutputs out =
          device_ids ? rt.draft_async(reinterpret_cast<const int32_t*>(ids.data()), n, steps, targets)
                     : rt.draft_async(slots, steps, targets);
      rt.synchronize();
      check_bits_equal(read_back(targets.tokens, targets.confidences, stride, n, steps), want);
      check_bits_equal(read_back(out.tokens, out.confidences, out.row_stride, n, steps), want);
    }
  }
  // The runtime's own id buffer, written by the caller.
  CHECK_CUDA(cudaMemcpy(rt.draft_slots(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const DeviceDraftOutputs own = rt.draft_async(rt.draft_slots(), n, 2);
  rt.synchronize();
  check_bits_equal(read_back(own.tokens, own.confidences, own.row_stride, n, 2), rt.draft(slots, 2));
}

TFE_GPU_TEST_CASE("device calls: first ranks from the host and from the device draft the same bits, blocking or not") {
  auto head = random_head_image("tiny", 43, false);
  const HeadHeader& h = head->file.header();
  PlanOptions po = test_plan_options(Fp8Mode::off);
  po.first_ranks = true;
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(5);
  const std::vector<int> slots = {4, 0, 7, 2, 9};
  const std::vector<int> ranks = {0, 7, 1, 3, 2};
  std::vector<Rows> prefix;
  for (int s : slots) prefix.push_back(random_rows(rng, h, s, 0, 2 + s));
  rt.extend(requests(prefix));
  const int n = static_cast<int>(slots.size());
  const int64_t stride = po.max_steps;
  cuda::DeviceMemory tokens = cuda::allocate_device(slots.size() * stride * 4, "targets.tokens");
  cuda::DeviceMemory confs = cuda::allocate_device(slots.size() * stride * 4, "targets.confidences");
  cuda::DeviceMemory ids = cuda::allocate_device(slots.size() * 4, "device slot ids");
  cuda::DeviceMemory device_ranks = cuda::allocate_device(slots.size() * 4, "device first ranks");
  CHECK_CUDA(cudaMemcpy(ids.data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(device_ranks.data(), ranks.data(), ranks.size() * 4, cudaMemcpyHostToDevice));
  const DraftTargets targets{reinterpret_cast<int32_t*>(tokens.data()), reinterpret_cast<float*>(confs.data()), stride};
  for (int steps : {1, po.max_steps}) {
    CAPTURE(steps);
    const DraftResult want = rt.draft(slots, steps, ranks);
    CHECK(want.tokens != rt.draft(slots, steps).tokens);  // the ranks moved some step 1
    for (bool on_device : {false, true}) {
      CAPTURE(on_device);
      fill_nan(tokens.data(), tokens.bytes());
      fill_nan(confs.data(), confs.bytes());
      if (on_device)
        rt.draft_async(reinterpret_cast<const int32_t*>(ids.data()), n, steps, targets, std::nullopt,
                       reinterpret_cast<const int32_t*>(device_ranks.data()));
      else
        rt.draft_async(slots, steps, targets, std::nullopt, ranks);
      rt.synchronize();
      check_bits_equal(read_back(targets.tokens, targets.confidences, stride, n, steps), want);
    }
  }
  // A rank out of range from the device drafts the best token, and the next call names it, then clears.
  const std::vector<int> bad = {0, 7, 9, 3, 2};
  CHECK_CUDA(cudaMemcpy(device_ranks.data(), bad.data(), bad.size() * 4, cudaMemcpyHostToDevice));
  rt.draft_async(reinterpret_cast<const int32_t*>(ids.data()), n, 2, targets, std::nullopt,
                 reinterpret_cast<const int32_t*>(device_ranks.data()));
  CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains("found first rank 9 in row 2 of its device ranks"), Error);
  CHECK_NOTHROW(rt.synchronize());  // reported once
  std::vector<int> fixed = bad;
  fixed[2] = 0;
  check_bits_equal(read_back(targets.tokens, targets.confidences, stride, n, 2), rt.draft(slots, 2, fixed));
}

// The engine's case: its decode graph holds the draft; between replays the runtime extends (outside the
// graph) and the engine rewrites its slot ids. Each replay must draft what a direct call on a runtime with
// the same history drafts.
TFE_GPU_TEST_CASE("device calls: a draft recorded in the caller's capture, replayed after extends, equals direct") {
  auto head = random_head_image("tiny", 47, false);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  Runtime recorded = Runtime::open(head->file, test_open_options(po));
  Runtime direct = Runtime::open(head->file, test_open_options(po));
  cuda::Stream caller = cuda::create_stream();
  std::mt19937_64 rng(9);
  std::vector<int> slots = {0, 1, 2, 3};
  std::vector<Rows> prefix;
  for (int s : slots) prefix.push_back(random_rows(rng, h, s, 0, 3 + s));
  recorded.extend(requests(prefix), caller.get());
  direct.extend(requests(prefix));

  const int steps = po.max_steps, n = static_cast<int>(slots.size());
  cuda::DeviceMemory engine_ids = cuda::allocate_device(slots.size() * 4, "engine slot ids");
  cuda::DeviceMemory tokens = cuda::allocate_device(slots.size() * steps * 4, "engine draft tokens");
  cuda::DeviceMemory confs = cuda::allocate_device(slots.size() * steps * 4, "engine draft confidences");
  const DraftTargets targets{reinterpret_cast<int32_t*>(tokens.data()), reinterpret_cast<float*>(confs.data()), 0};
  CHECK_CUDA(cudaStreamSynchronize(caller.get()));

  // Global mode, as torch.cuda.graph captures by default: any unsafe call during the capture fails it.
  CHECK_CUDA(cudaStreamBeginCapture(caller.get(), cudaStreamCaptureModeGlobal));
  recorded.draft_async(reinterpret_cast<const int32_t*>(engine_ids.data()), n, steps, targets, caller.get());
  cudaGraph_t g = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(caller.get(), &g));
  cuda::Graph graph(g);
  cudaGraphExec_t e = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&e, graph.get(), 0));
  cuda::GraphExec exec(e);

  for (int round = 0; round < 12; ++round) {
    CAPTURE(round);
    std::shuffle(slots.begin(), slots.end(), rng);  // the engine's batch order changes between replays
    CHECK_CUDA(
        cudaMemcpyAsync(engine_ids.data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice, caller.get()));
    fill_nan(tokens.data(), tokens.bytes());
    fill_nan(confs.data(), confs.bytes());
    CHECK_CUDA(cudaGraphLaunch(exec.get(), caller.get()));
    CHECK_CUDA(cudaStreamSynchronize(caller.get()));
    recorded.synchronize();
    check_bits_equal(read_back(targets.tokens, targets.confidences, steps, n, steps), direct.draft(slots, steps));

    std::vector<Rows> next;
    for (int s : slots) next.push_back(random_rows(rng, h, s, direct.slots().last_pos(s) + 1, 1 + (round + s) % 4));
    recorded.extend(requests(next), caller.get());
    direct.extend(requests(next));
  }
}

TFE_GPU_TEST_CASE("device calls: a bad device token or slot id is replaced, reported by the next call, then cleared") {
  auto head = random_head_image("tiny", 53, false);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(11);
  std::vector<Rows> rows = {random_rows(rng, h, 0, 0, 5), random_rows(rng, h, 1, 0, 3)};
  rows[1].tokens[2] = static_cast<int32_t>(h.vocab + 5);
  const DeviceRows d = to_device(rows, row_width(h), row_width(h));
  rt.extend(d.requests);
  const std::string token_message = fmt::format("handed slot 1 token {}, outside 0..{}", h.vocab + 5, h.vocab - 1);
  CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains(token_message.c_str()), Error);
  CHECK_NOTHROW(rt.synchronize());  // reported once
  rt.reset(1);

  cuda::DeviceMemory ids = cuda::allocate_device(3 * 4, "device slot ids");
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{0, 999, -1}, std::vector<int32_t>{0, 7, -1}, std::vector<int32_t>{0, -5, -1}}) {
    CAPTURE(bad[1]);
    CHECK_CUDA(cudaMemcpy(ids.data(), bad.data(), 12, cudaMemcpyHostToDevice));
    rt.draft_async(reinterpret_cast<const int32_t*>(ids.data()), 3, 2);
    const std::string id_message = fmt::format("slot id {} in row 1", bad[1]);
    CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains(id_message.c_str()), Error);
  }
  // -1 is padding, not an error.
  const std::vector<int32_t> padded = {0, -1, -1};
  CHECK_CUDA(cudaMemcpy(ids.data(), padded.data(), 12, cudaMemcpyHostToDevice));
  rt.draft_async(reinterpret_cast<const int32_t*>(ids.data()), 3, 2);
  CHECK_NOTHROW(rt.synchronize());

  // Host memory where device memory is needed is refused on the host, before anything changes.
  std::vector<DeviceExtendRequest> on_host = {
      DeviceExtendRequest{2, 0, 1, rows[0].taps.data(), 0, rows[0].tokens.data()}};
  CHECK_THROWS_WITH_AS(rt.extend(on_host), doctest::Contains("requests[0].taps"), Error);
  CHECK(rt.slots().empty(2));
}

TFE_GPU_TEST_CASE("device calls: a capturing stream refuses what it cannot replay, by name, and nothing changes") {
  auto head = random_head_image("tiny", 59, false);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  Runtime rt = Runtime::open(head->file, test_open_options(po));
  std::mt19937_64 rng(13);
  const std::vector<Rows> rows = {random_rows(rng, h, 0, 0, 4)};
  rt.extend(requests(rows));
  rt.synchronize();
  cuda::Stream caller = cuda::create_stream();
  CHECK_CUDA(cudaStreamBeginCapture(caller.get(), cudaStreamCaptureModeRelaxed));
  const std::vector<Rows> more = {random_rows(rng, h, 0, 4, 2)};
  CHECK_THROWS_WITH_AS(rt.extend(requests(more), caller.get()), doctest::Contains("extend: the stream is capturing"),
                       Error);
  const std::vector<int> slot0 = {0};
  CHECK_THROWS_WITH_AS(rt.draft_async(slot0, 1, {}, caller.get()),
                       doctest::Contains("draft_async: the stream is capturing"), Error);
  CHECK_THROWS_WITH_AS(rt.reset(0, caller.get()), doctest::Contains("reset: the stream is capturing"), Error);
  cudaGraph_t g = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(caller.get(), &g));
  cuda::Graph graph(g);
  CHECK(rt.slots().last_pos(0) == 3);
  CHECK_NOTHROW(rt.draft(slot0, 1));
}

}  // namespace
}  // namespace tfe::test
