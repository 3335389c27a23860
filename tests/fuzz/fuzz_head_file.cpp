// libFuzzer target: any byte string handed to the .tfe reader is either a head or a tfe::Error. Any other
// exception, a crash, a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include <tfe/head_file.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    // Verifying hashes every tensor, so every accepted tensor's bytes are read end to end.
    const auto head = tfe::HeadFile::from_bytes(bytes, {.verify_sha256 = true});
    for (const auto& t : head.file().tensors()) (void)head.recorded_sha256(t.name);
    (void)head.header_sha256();
  } catch (const tfe::Error&) {
  }
  return 0;
}
