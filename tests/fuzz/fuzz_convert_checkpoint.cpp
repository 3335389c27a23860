// libFuzzer target: any EAGLE-3 checkpoint (config.json and one model.safetensors) handed to
// `tfe-plan convert` gives either a head or a tfe::Error. Any other exception, a crash, a hang or a
// sanitizer report is a finding, and so is a converted head that the .tfe reader refuses: what convert
// writes must open and verify.
//
// An input is the head's config.json, a NUL byte, then the bytes of its model.safetensors. The two go
// through files, as `tfe-plan convert` reads them.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "plan/convert.h"
#include "plan/error.h"
#include "plan/head_file.h"

namespace {

namespace fs = std::filesystem;

// A directory of this process's own, made once and reused for every input.
const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tfe-fuzz-convert-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  if (split == std::string_view::npos) return 0;
  write(checkpoint_dir() / "config.json", input.substr(0, split));
  write(checkpoint_dir() / "model.safetensors", input.substr(split + 1));
  tfe::ConvertOptions opt;
  opt.eagle_dir = checkpoint_dir().string();
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
