// tfe::Error: the library's exception type. Its message says what was wrong, where, and the limit.
// A failed CUDA or cuBLASLt call throws tfe::CudaError, an Error too, naming the call: a caller that must
// tell a refused call (nothing changed) from a device failure (device state unknown) catches it first.
#pragma once
#include <stdexcept>
#include <string>

namespace tfe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class CudaError : public Error {
 public:
  explicit CudaError(const std::string& what) : Error(what) {}
};

}  // namespace tfe
