// tfe::Error: the library's exception type. Its message says what was wrong, where, and the limit.
// A failed CUDA or cuBLASLt call throws tfe::CudaError, an Error too, naming the call: a caller that must
// tell a refused call (nothing changed) from a device failure (device state unknown) catches it first.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace tfe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class CudaError : public Error {
 public:
  explicit CudaError(const std::string& what) : Error(what) {}
};

// `text` as a message shows it: every byte that is not printable text (C0 controls, DEL, the C1 controls,
// bytes that are not UTF-8) written as \xNN, valid UTF-8 beyond ASCII kept. A name read from a file (a
// tensor name, a key) then cannot move the cursor, recolor or clear the terminal a message is printed on,
// nor start a line of its own. Backslashes are kept, so printable(printable(s)) == printable(s).
std::string printable(std::string_view text);

}  // namespace tfe
