// libFuzzer target: any pair of config.json texts (an EAGLE-3 head's and its target's) handed to
// `tfe-plan convert`'s header reader gives either a valid header or a tfe::Error. Any other exception, a
// crash, a hang or a sanitizer report is a finding. An accepted header must pass the head rules again and
// either plan or be refused by the planner with a tfe::Error.
//
// An input is the head's config.json, optionally followed by a NUL byte and the target's config.json
// (then read as `--target`). The texts go through files, as `tfe-plan convert` reads them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "head/convert.h"
#include "core/error.h"
#include "plan/plan.h"
#include "test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tfe::test::TempDir head_dir, target_dir;
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  const auto nul = std::find(input.begin(), input.end(), std::byte{0});
  tfe::ConvertOptions opt;
  opt.eagle_dir = head_dir.path.string();
  tfe::test::write_file(head_dir.path / "config.json", {input.begin(), nul});
  if (nul != input.end()) {
    opt.target_dir = target_dir.path.string();
    tfe::test::write_file(target_dir.path / "config.json", {nul + 1, input.end()});
  }
  tfe::HeadHeader h;
  try {
    h = tfe::eagle3_header(opt);
  } catch (const tfe::Error&) {
    return 0;
  }
  // What the reader accepts, the head rules accept too (outside the try: a throw here is a finding), and the
  // planner either plans it or refuses it by name.
  tfe::validate(h);
  try {
    (void)tfe::make_plan(h, tfe::PlanOptions{});
  } catch (const tfe::Error&) {
  }
  return 0;
}
