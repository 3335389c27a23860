// libFuzzer target: any EAGLE-3 checkpoint (config.json and one model.safetensors) handed to
// `tfe-plan convert` gives either a head or a tfe::Error. Any other exception, a crash, a hang or a
// sanitizer report is a finding, and so is a converted head that the .tfe reader refuses: what convert
// writes must open and verify.
//
// An input is the head's config.json, a NUL byte, then the bytes of its model.safetensors. The two go
// through files, as `tfe-plan convert` reads them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "head/convert.h"
#include "core/error.h"
#include <tfe/head_file.h>
#include "test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tfe::test::TempDir checkpoint_dir;
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  const auto nul = std::find(input.begin(), input.end(), std::byte{0});
  if (nul == input.end()) return 0;
  tfe::test::write_file(checkpoint_dir.path / "config.json", {input.begin(), nul});
  tfe::test::write_file(checkpoint_dir.path / "model.safetensors", {nul + 1, input.end()});
  tfe::ConvertOptions opt;
  opt.eagle_dir = checkpoint_dir.path.string();
  opt.threads = 1;
  std::vector<std::byte> head;
  try {
    head = tfe::convert_eagle3(opt).serialize();
  } catch (const tfe::Error&) {
    return 0;
  }
  // Outside a try: a converted head the reader refuses is a finding.
  (void)tfe::HeadFile::from_bytes(head, {.verify_sha256 = true});
  return 0;
}
