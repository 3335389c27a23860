// Reads a head's header through the public API and opens a runtime on it. Without a GPU the open must
// fail with tfe::Error naming the missing device; with one, it drafts a step for slot 0.
#include <cstdio>
#include <vector>

#include <tfe/head_file.h>
#include <tfe/runtime.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HEAD.tfe\n");
    return 2;
  }
  const tfe::HeadFile head = tfe::HeadFile::open(argv[1]);
  const tfe::HeadHeader& h = head.header();
  std::printf("head: hidden %lld, vocab %lld, window %d\n", static_cast<long long>(h.hidden),
              static_cast<long long>(h.vocab), static_cast<int>(h.window));
  try {
    tfe::Runtime rt = tfe::Runtime::open(head);
    const int64_t width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
    std::vector<tfe::bf16_bits> taps(static_cast<size_t>(width), 0x3f80);  // 1.0
    std::vector<int32_t> tokens = {1};
    const tfe::ExtendRequest rq{0, 0, 1, taps, tokens};
    rt.extend({&rq, 1});
    const int slot = 0;
    const tfe::DraftResult d = rt.draft({&slot, 1}, 1);
    std::printf("drafted token %d\n", d.token(0, 1));
  } catch (const tfe::Error& e) {
    std::printf("no draft, as expected without a GPU: %s\n", e.what());
  }
  return 0;
}
