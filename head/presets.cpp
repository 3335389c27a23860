#include "head/presets.h"

#include "core/error.h"

namespace tfe {

std::vector<std::string> preset_names() { return {"tiny", "tiny-two-stage", "llama3-8b-eagle3", "tfe-two-stage"}; }

namespace {

HeadHeader llama3_8b_target() {
  HeadHeader h;
  h.target_hidden = 4096;
  h.hidden = 4096;
  h.heads = 32;
  h.kv_heads = 8;
  h.head_dim = 128;
  h.ffn = 14336;
  h.vocab = 128256;
  h.draft_vocab = 32000;
  h.rope = Rope{500000.0f, true, 8.0f, 1.0f, 4.0f, 8192};
  h.rms_eps = 1e-5f;
  return h;
}

}  // namespace

HeadHeader preset_header(std::string_view name) {
  if (name == "tiny" || name == "tiny-two-stage") {
    HeadHeader h;
    h.name = std::string(name);
    h.taps = {{1, false}, {3, true}, {-1, false}};
    h.target_hidden = 96;
    h.hidden = 64;
    h.heads = 4;
    h.kv_heads = 2;
    h.head_dim = 16;
    h.ffn = 160;
    h.vocab = 1000;
    h.draft_vocab = 300;
    h.window = 15;
    h.rope = Rope{10000.0f, false, 8.0f, 1.0f, 4.0f, 8192};
    h.rms_eps = 1e-6f;
    if (name == "tiny-two-stage") {
      h.head_type = HeadType::two_stage;
      h.qk_norm = true;
      h.cand_k = 16;
      h.lowrank = 24;
    }
    return h;
  }
  if (name == "llama3-8b-eagle3") {
    HeadHeader h = llama3_8b_target();
    h.name = "llama3-8b-eagle3";
    // EAGLE-3 reads a low, a middle and a high layer of the 32-layer target: 2, 16, 29.
    h.taps = {{2, false}, {16, false}, {29, false}};
    h.window = 511;
    return h;
  }
  if (name == "tfe-two-stage") {
    HeadHeader h = llama3_8b_target();
    h.name = "tfe-two-stage";
    // The final tap is the pre-norm residual stream, whose scale grows with depth: normalize it alone.
    h.taps = {{2, false}, {11, false}, {20, false}, {-1, true}};
    h.window = 128;
    h.qk_norm = true;
    h.head_type = HeadType::two_stage;
    h.lowrank = 512;
    h.cand_k = 64;
    return h;
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  fail("unknown preset `{}` (presets: {})", name, names);
}

}  // namespace tfe
