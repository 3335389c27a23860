// The runtime's diagnostics (docs/runtime.md "The self-check", "The tap dump"): the self-check at open passes
// on a sound runtime and leaves nothing behind, and refuses one whose weights were corrupted on the device;
// the tap dump holds the rows of host and device extends bit for bit, counts what it drops, and records
// nothing of a refused call.
#include <stdlib.h>

#include <cstring>
#include <filesystem>

#include <tfe/head_file.h>

#include "tests/gpu/fixture.h"
#include "tests/gpu/gpu_test.h"
#include "tests/test_util.h"

namespace tfe::test {
namespace {

void check_same_stats(const RuntimeStats& got, const RuntimeStats& want) {
  CHECK(got.replays == want.replays);
  CHECK(got.eager_passes == want.eager_passes);
  CHECK(got.extend_chunks == want.extend_chunks);
  CHECK(got.captures == want.captures);
  CHECK(got.graph_updates == want.graph_updates);
  CHECK(got.bytes_uploaded == want.bytes_uploaded);
  CHECK(got.bytes_downloaded == want.bytes_downloaded);
  CHECK(got.weight_bytes == want.weight_bytes);
}

// A runtime opened with the self-check against one opened without it: the check passed, compared steps,
// and left the slots, the counters, the outputs and every later draft as they would be had it not run.
void self_check_passes(const std::string& preset, Fp8Mode fp8) {
  auto head = random_head_image(preset, 51, fp8 != Fp8Mode::off);
  const HeadHeader& h = head->file.header();
  const PlanOptions po = test_plan_options(fp8);
  OpenOptions checked_options = test_open_options(po);
  checked_options.self_check = true;
  Runtime checked = Runtime::open(head->file, checked_options);
  Runtime plain = Runtime::open(head->file, test_open_options(po));
  const SelfCheckReport& report = tfe::testing::self_check_report(checked);
  CHECK(report.cases >= 1);
  CHECK(report.slots == 2);
  // A check that compared nothing proved nothing: the case must reach past a near-tie on these heads.
  CHECK(report.compared >= 1);
  MESSAGE(fmt::format("{} {}: self-check compared {} steps in {} cases", preset, fp8_mode_name(fp8), report.compared,
                      report.cases));
  CHECK(tfe::testing::self_check_report(plain).cases == 0);

  for (int s = 0; s < po.max_slots; ++s) CHECK(checked.slots().empty(s));
  check_same_stats(checked.stats(), plain.stats());
  CHECK(checked.device_outputs().tokens == nullptr);
  CHECK(checked.accept_totals().rounds == 0);
  // Device and host state as open leaves it: every slot's ring and state (the scratch slot's too), outputs.
  for (const char* name :
       {"ring_k", "ring_v", "slot_g", "slot_state", "out_token", "out_conf", "h2", "host_token", "host_conf"}) {
    CAPTURE(name);
    CHECK(tfe::testing::read_buffer(checked, name) == tfe::testing::read_buffer(plain, name));
  }

  std::mt19937_64 rng(8);
  const std::vector<Rows> rows = {random_rows(rng, h, 0, 0, 5), random_rows(rng, h, 1, 0, 2),
                                  random_rows(rng, h, 2, 0, 7)};
  checked.extend(requests(rows));
  plain.extend(requests(rows));
  const std::vector<int> slots = {0, 1, 2};
  const DraftResult a = checked.draft(slots, po.max_steps);
  const DraftResult b = plain.draft(slots, po.max_steps);
  CHECK(a.tokens == b.tokens);
  CHECK(std::memcmp(a.confidences.data(), b.confidences.data(), a.confidences.size() * sizeof(float)) == 0);
  check_same_stats(checked.stats(), plain.stats());
}

TFE_GPU_TEST_CASE("self-check: passes within the bound and leaves nothing behind, tiny dense bf16") {
  self_check_passes("tiny", Fp8Mode::off);
}
TFE_GPU_TEST_CASE("self-check: passes within the bound and leaves nothing behind, tiny two_stage FP8") {
  self_check_passes("tiny-two-stage", Fp8Mode::require);
}

// The final norm's weights negated on the device after the upload (testing::Hooks::Faults::negate_weight):
// n is negated, so are the dense head's logits, and the runtime drafts the reference's worst token wherever
// the reference's best stands above its second. The open must refuse it, naming where.
TFE_GPU_TEST_CASE("self-check: a runtime whose final norm was corrupted on the device is refused at open") {
  auto head = random_head_image("tiny", 51, false);
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  tfe::testing::Hooks corrupt;
  corrupt.faults.negate_weight = "final_norm";
  OpenOptions o = test_open_options(po);
  // Without the check the corruption goes unnoticed at open.
  CHECK_NOTHROW(tfe::testing::open(head->file, o, corrupt));
  o.self_check = true;
  CHECK_THROWS_WITH_AS(tfe::testing::open(head->file, o, corrupt),
                       doctest::Contains("refuses to serve past the stated bound"), Error);
  try {
    tfe::testing::open(head->file, o, corrupt);
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("self_check: case ") != std::string::npos);
    CHECK(m.find(", slot ") != std::string::npos);
    CHECK(m.find(", step 1: the runtime drafted token ") != std::string::npos);
    CHECK(m.find(fmt::format("kDraftMargin = {}", kDraftMargin)) != std::string::npos);
  }
  // TFE_CHECK=1 turns the check on over the option; TFE_CHECK=0 off.
  o.self_check = false;
  ::setenv("TFE_CHECK", "1", 1);
  CHECK_THROWS_WITH_AS(tfe::testing::open(head->file, o, corrupt),
                       doctest::Contains("refuses to serve past the stated bound"), Error);
  o.self_check = true;
  ::setenv("TFE_CHECK", "0", 1);
  CHECK_NOTHROW(tfe::testing::open(head->file, o, corrupt));
  ::unsetenv("TFE_CHECK");
  // The same head uncorrupted passes.
  CHECK_NOTHROW(Runtime::open(head->file, o));
}

template <typename T>
std::vector<T> tensor_values(const SafetensorsFile& f, const char* name) {
  const TensorView* t = f.find(name);
  REQUIRE(t != nullptr);
  const auto s = t->as<T>();
  return {s.begin(), s.end()};
}

// The dump's rows against the rows handed over, bit for bit: `calls[i]` is the extend call of rows[i].
void check_dump(const std::filesystem::path& path, const std::vector<Rows>& rows, const std::vector<int>& calls,
                const HeadFile& file) {
  const SafetensorsFile f = SafetensorsFile::open(path.string());
  const HeadHeader& h = file.header();
  std::vector<bf16_bits> taps;
  std::vector<int32_t> tokens, slots, positions, call_of_row;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Rows& r = rows[i];
    taps.insert(taps.end(), r.taps.begin(), r.taps.end());
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    for (size_t k = 0; k < r.tokens.size(); ++k) {
      slots.push_back(r.slot);
      positions.push_back(static_cast<int32_t>(r.first_pos + static_cast<int64_t>(k)));
      call_of_row.push_back(calls[i]);
    }
  }
  const auto n = static_cast<int64_t>(tokens.size());
  CHECK(f.metadata().at("rows") == std::to_string(n));
  CHECK(f.metadata().at("head_sha256") == file.header_sha256());
  CHECK(f.metadata().at("taps") == std::to_string(h.taps.size()));
  CHECK(f.metadata().at("target_hidden") == std::to_string(h.target_hidden));
  REQUIRE(f.find("taps") != nullptr);
  CHECK(f.find("taps")->shape == std::vector<int64_t>{n, row_width(h)});
  CHECK(tensor_values<bf16_bits>(f, "taps") == taps);
  CHECK(tensor_values<int32_t>(f, "tokens") == tokens);
  CHECK(tensor_values<int32_t>(f, "slots") == slots);
  CHECK(tensor_values<int32_t>(f, "positions") == positions);
  CHECK(tensor_values<int32_t>(f, "calls") == call_of_row);
}

TFE_GPU_TEST_CASE("tap dump: host and device extends bit for bit, and refused calls record nothing") {
  auto head = random_head_image("tiny", 52, false);
  const HeadHeader& h = head->file.header();
  const int64_t width = row_width(h);
  const PlanOptions po = test_plan_options(Fp8Mode::off);
  TempDir dir;
  const auto path = dir.path / "taps.safetensors";
  std::mt19937_64 rng(12);
  // Call 0 (host): slots 0 and 1. Call 1 (device, rows strided): slot 0 continued, slot 2 in two chunks.
  const std::vector<Rows> host_rows = {random_rows(rng, h, 0, 0, 4), random_rows(rng, h, 1, 0, 3)};
  const std::vector<Rows> device_rows = {random_rows(rng, h, 0, 4, 2), random_rows(rng, h, 2, 0, 20)};
  {
    OpenOptions o = test_open_options(po);
    o.tap_dump.path = path.string();
    // The self-check's own rows are not the engine's: they must not reach the dump.
    o.self_check = true;
    Runtime rt = Runtime::open(head->file, o);
    rt.extend(requests(host_rows));
    // Refused: slot 1 does not continue at position 0; nothing is recorded (not even a call index).
    const std::vector<Rows> bad = {random_rows(rng, h, 1, 0, 1)};
    CHECK_THROWS_AS(rt.extend(requests(bad)), Error);
    const DeviceRows d = to_device(device_rows, width, width + 8);
    // Refused: taps in host memory.
    std::vector<DeviceExtendRequest> host_pointer = d.requests;
    host_pointer[0].taps = device_rows[0].taps.data();
    CHECK_THROWS_AS(rt.extend(host_pointer), Error);
    rt.extend(d.requests);
    rt.synchronize();
    const uint64_t downloaded = rt.stats().bytes_downloaded;
    CHECK(downloaded >= static_cast<uint64_t>(22 * (width * 2 + 4)));  // the dump's copies are counted
    rt.write_tap_dump();
    std::vector<Rows> all = host_rows;
    all.insert(all.end(), device_rows.begin(), device_rows.end());
    check_dump(path, all, {0, 0, 1, 1}, head->file);
    const SafetensorsFile f = SafetensorsFile::open(path.string());
    CHECK(f.metadata().at("calls") == "2");
    CHECK(f.metadata().at("dropped_rows") == "0");
    // Drafting still works with the dump on (it only reads what extends hand over).
    const std::vector<int> slots = {0, 1, 2};
    CHECK(rt.draft(slots, po.max_steps).tokens.size() == static_cast<size_t>(3 * po.max_steps));
    // More rows after the explicit write: the file at close holds them too.
    const std::vector<Rows> more = {random_rows(rng, h, 1, 3, 2)};
    rt.extend(requests(more));
    all.insert(all.end(), more.begin(), more.end());
    std::filesystem::remove(path);
    // close: the destructor writes the file
    rt = Runtime::open(head->file, test_open_options(po));
    check_dump(path, all, {0, 0, 1, 1, 2}, head->file);
    CHECK_THROWS_WITH_AS(rt.write_tap_dump(), doctest::Contains("no tap dump is on"), Error);
  }
  // A row limit: the device call's rows past it are counted, not kept (and not copied).
  {
    OpenOptions o = test_open_options(po);
    o.tap_dump.path = path.string();
    o.tap_dump.max_rows = 9;
    Runtime rt = Runtime::open(head->file, o);
    rt.extend(requests(host_rows));  // 7 rows
    const DeviceRows d = to_device(device_rows, width, width);
    const uint64_t before = rt.stats().bytes_downloaded;
    rt.extend(d.requests);  // 2 kept, 20 dropped
    CHECK(rt.stats().bytes_downloaded - before == static_cast<uint64_t>(2 * (width * 2 + 4)));
    rt.write_tap_dump();
    std::vector<Rows> kept = host_rows;
    kept.push_back(device_rows[0]);
    check_dump(path, kept, {0, 0, 1}, head->file);
    const SafetensorsFile f = SafetensorsFile::open(path.string());
    CHECK(f.metadata().at("dropped_rows") == "20");
    CHECK(f.metadata().at("max_rows") == "9");
  }
  // TFE_TAP_DUMP names the file over the option; a directory that does not exist is refused at open.
  {
    const auto env_path = dir.path / "env.safetensors";
    ::setenv("TFE_TAP_DUMP", env_path.string().c_str(), 1);
    {
      Runtime rt = Runtime::open(head->file, test_open_options(po));
      rt.extend(requests(host_rows));
    }
    ::unsetenv("TFE_TAP_DUMP");
    check_dump(env_path, host_rows, {0, 0}, head->file);
    OpenOptions o = test_open_options(po);
    o.tap_dump.path = (dir.path / "missing" / "t.safetensors").string();
    CHECK_THROWS_WITH_AS(Runtime::open(head->file, o), doctest::Contains((dir.path / "missing").string().c_str()),
                         Error);
  }
}

}  // namespace
}  // namespace tfe::test
