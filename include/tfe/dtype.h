// Element types, named as safetensors names them. Head files hold BF16, F32, I32 and F8_E4M3 only;
// the others appear in checkpoints that `convert` reads.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace tfe {

// A bf16 value as its 16 bits (the host never does arithmetic in bf16; core/numeric.h converts).
using bf16_bits = uint16_t;

enum class DType : uint8_t { BF16, F32, I32, F8_E4M3, F16, I64, BOOL };

constexpr bool head_dtype(DType t) {
  return t == DType::BF16 || t == DType::F32 || t == DType::I32 || t == DType::F8_E4M3;
}

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16:
      return 2;
    case DType::F32:
      return 4;
    case DType::I32:
      return 4;
    case DType::F8_E4M3:
      return 1;
    case DType::F16:
      return 2;
    case DType::I64:
      return 8;
    case DType::BOOL:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "BF16";
    case DType::F32:
      return "F32";
    case DType::I32:
      return "I32";
    case DType::F8_E4M3:
      return "F8_E4M3";
    case DType::F16:
      return "F16";
    case DType::I64:
      return "I64";
    case DType::BOOL:
      return "BOOL";
  }
  return "?";
}

inline std::optional<DType> dtype_from_name(std::string_view s) {
  if (s == "BF16") return DType::BF16;
  if (s == "F32") return DType::F32;
  if (s == "I32") return DType::I32;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "F16") return DType::F16;
  if (s == "I64") return DType::I64;
  if (s == "BOOL") return DType::BOOL;
  return std::nullopt;
}

}  // namespace tfe
