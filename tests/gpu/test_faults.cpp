// Faults injected where the GPU side can fail (runtime/testing.h, TestHooks::Faults and inject_cuda_error):
// a failed capture, graph instantiation or kernel load fails the call that met it with a message naming
// what failed, and after a CUDA error the runtime refuses every later call, naming the first failure, as
// <tfe/runtime.h> promises.
#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"

namespace tfe::test {
namespace {

// A runtime of the tiny head opened with `faults`, its rows extended, ready to draft.
struct Opened {
  std::unique_ptr<HeadImage> head = random_head_image("tiny", 61, false);
  PlanOptions po = test_plan_options(Fp8Mode::off);
  std::mt19937_64 rng{17};
};

// Checks that every call of `rt` is refused with a CudaError naming `first` (the first failure).
void check_refuses_every_call(Runtime& rt, const HeadHeader& h, std::mt19937_64& rng, const std::string& first) {
  const std::string message = "unusable after an earlier device failure";
  const std::vector<Rows> rows = {random_rows(rng, h, 1, 0, 3)};
  CHECK_THROWS_WITH_AS(rt.extend(requests(rows)), doctest::Contains(message.c_str()), CudaError);
  CHECK_THROWS_WITH_AS(rt.extend(requests(rows)), doctest::Contains(first.c_str()), CudaError);
  CHECK_THROWS_WITH_AS(rt.draft(std::vector<int>{0}, 2), doctest::Contains(first.c_str()), CudaError);
  CHECK_THROWS_WITH_AS(rt.reset(0), doctest::Contains(first.c_str()), CudaError);
  CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains(first.c_str()), CudaError);
}

TFE_GPU_TEST_CASE("faults: a CUDA error in a call makes the runtime refuse every later call, naming it") {
  Opened o;
  const HeadHeader& h = o.head->file.header();
  Runtime rt = Runtime::open(o.head->file, test_open_options(o.po));
  rt.extend(requests({random_rows(o.rng, h, 0, 0, 5)}));
  (void)rt.draft(std::vector<int>{0}, 2);
  testing::inject_cuda_error(rt, cudaErrorIllegalAddress);
  CHECK_THROWS_WITH_AS(rt.draft(std::vector<int>{0}, 2), doctest::Contains("cudaErrorIllegalAddress"), CudaError);
  check_refuses_every_call(rt, h, o.rng, "cudaErrorIllegalAddress");
}

TFE_GPU_TEST_CASE("faults: a failed capture at open fails the open, naming the pass") {
  Opened o;
  testing::Hooks hooks;
  hooks.faults.capture = true;
  CHECK_THROWS_WITH_AS(testing::open(o.head->file, test_open_options(o.po), hooks),
                       doctest::Contains("capturing the draft pass"), CudaError);
  // Without graphs the same fault never arises: every pass runs eagerly.
  Runtime eager = testing::open(o.head->file, test_open_options(o.po, false), hooks);
  eager.extend(requests({random_rows(o.rng, o.head->file.header(), 0, 0, 5)}));
  CHECK(eager.draft(std::vector<int>{0}, 3).tokens.size() == 3);
}

TFE_GPU_TEST_CASE("faults: a failed capture at the first replay fails that draft, naming the pass, and later calls") {
  Opened o;
  const HeadHeader& h = o.head->file.header();
  testing::Hooks hooks;
  hooks.faults.capture = true;
  hooks.capture = testing::Hooks::Capture::lazy;
  Runtime rt = testing::open(o.head->file, test_open_options(o.po), hooks);
  rt.extend(requests({random_rows(o.rng, h, 0, 0, 5)}));
  CHECK_THROWS_WITH_AS(rt.draft(std::vector<int>{0}, 2),
                       doctest::Contains("capturing the draft pass (streams 1, steps 2)"), CudaError);
  check_refuses_every_call(rt, h, o.rng, "capturing the draft pass (streams 1, steps 2)");
}

TFE_GPU_TEST_CASE("faults: a failed graph instantiation fails the open, naming the pass and the error") {
  Opened o;
  testing::Hooks hooks;
  hooks.faults.instantiate = cudaErrorMemoryAllocation;
  CHECK_THROWS_WITH_AS(testing::open(o.head->file, test_open_options(o.po), hooks),
                       doctest::Contains("instantiating the graph of the draft pass"), CudaError);
  // At the first replay: that draft fails, naming it, and so does every later call.
  hooks.capture = testing::Hooks::Capture::lazy;
  Runtime rt = testing::open(o.head->file, test_open_options(o.po), hooks);
  const HeadHeader& h = o.head->file.header();
  rt.extend(requests({random_rows(o.rng, h, 0, 0, 5)}));
  CHECK_THROWS_WITH_AS(rt.draft(std::vector<int>{0}, 1), doctest::Contains("cudaErrorMemoryAllocation"), CudaError);
  check_refuses_every_call(rt, h, o.rng, "instantiating the graph of the draft pass (streams 1, steps 1)");
}

TFE_GPU_TEST_CASE("faults: a kernel whose cubin fails to load fails the open, naming the specialization") {
  Opened o;
  const std::string uri = [&] {
    Runtime rt = Runtime::open(o.head->file, test_open_options(o.po));
    return testing::plan(rt).specs.front().uri();
  }();
  testing::Hooks hooks;
  hooks.faults.corrupt_cubin = uri;
  CHECK_THROWS_WITH_AS(testing::open(o.head->file, test_open_options(o.po), hooks), doctest::Contains(uri.c_str()),
                       Error);
  // The next open, without the fault, works: nothing the failed one made outlives it.
  Runtime rt = Runtime::open(o.head->file, test_open_options(o.po));
  rt.extend(requests({random_rows(o.rng, o.head->file.header(), 0, 0, 5)}));
  CHECK(rt.draft(std::vector<int>{0}, 2).tokens.size() == 2);
}

}  // namespace
}  // namespace tfe::test
