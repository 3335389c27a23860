#include "core/error.h"

namespace tfe {

namespace {

// The length of the UTF-8 sequence that starts `text` when it is well formed and encodes a printable
// character (not a C1 control, U+0080..U+009F), else 0.
size_t printable_utf8(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (lead >= 0xc2 && lead <= 0xdf)
    n = 2, cp = lead & 0x1fu;
  else if (lead >= 0xe0 && lead <= 0xef)
    n = 3, cp = lead & 0x0fu;
  else if (lead >= 0xf0 && lead <= 0xf4)
    n = 4, cp = lead & 0x07u;
  else
    return 0;
  if (text.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((byte(i) & 0xc0u) != 0x80u) return 0;
    cp = cp << 6 | (byte(i) & 0x3fu);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  const bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
  if (overlong || surrogate || cp > 0x10ffff || (cp >= 0x80 && cp <= 0x9f)) return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? printable_utf8(text.substr(i)) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

}  // namespace tfe
