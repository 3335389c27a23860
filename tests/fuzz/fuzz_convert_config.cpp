// libFuzzer target: any pair of config.json texts (an EAGLE-3 head's and its target's) handed to
// `tfe-plan convert`'s header reader gives either a valid header or a tfe::Error. Any other exception, a
// crash, a hang or a sanitizer report is a finding. An accepted header must pass the head rules again and
// either plan or be refused by the planner with a tfe::Error.
//
// An input is the head's config.json, optionally followed by a NUL byte and the target's config.json
// (then read as `--target`). The texts go through files, as `tfe-plan convert` reads them.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "plan/convert.h"
#include "plan/error.h"
#include "plan/plan.h"

namespace {

namespace fs = std::filesystem;

// A directory of this process's own, made once and reused for every input.
const fs::path& work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tfe-fuzz-convert-config-" + std::to_string(::getpid()));
    fs::create_directories(d / "head");
    fs::create_directories(d / "target");
    return d;
  }();
  return dir;
}

void write(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  tfe::ConvertOptions opt;
  opt.eagle_dir = (work_dir() / "head").string();
  write(work_dir() / "head" / "config.json", input.substr(0, split));
  if (split != std::string_view::npos) {
    opt.target_dir = (work_dir() / "target").string();
    write(work_dir() / "target" / "config.json", input.substr(split + 1));
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
