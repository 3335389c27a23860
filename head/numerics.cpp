#include "head/numerics.h"

#include <cmath>

#include "core/error.h"

namespace tfe {

std::vector<float> rope_inv_freq(const HeadHeader& h) {
  const int64_t hd = h.head_dim;
  std::vector<float> inv(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(h.rope.theta, static_cast<float>(2 * i) / static_cast<float>(hd));
  if (!h.rope.llama3) return inv;
  const Rope& r = h.rope;
  const float old_len = static_cast<float>(r.original_max_positions);
  const float low_freq_wavelen = old_len / r.low_freq_factor;
  const float high_freq_wavelen = old_len / r.high_freq_factor;
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    // Long wavelengths (low frequencies) are stretched by `factor`; short ones kept; the band between
    // blends the two by where the wavelength falls.
    const float scaled = wavelen > low_freq_wavelen ? f / r.factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1.0f - smooth) * scaled / r.factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv;
}

float attention_scale(int64_t hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }

int rescored_candidates(const HeadHeader& h, int requested) {
  if (requested == 0) return h.cand_k;
  if (h.head_type == HeadType::dense)
    fail("cand_k = {} is set, but the head is dense: only a two_stage head rescores candidates (give 0)", requested);
  if (requested < 0 || requested > h.draft_vocab)
    fail("cand_k = {} is outside 1..{} (the head's draft_vocab)", requested, h.draft_vocab);
  return requested;
}

}  // namespace tfe
