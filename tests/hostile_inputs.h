// Oversized and deeply nested inputs that once took minutes to refuse: the fuzz targets' seeds
// (tests/fuzz/seeds) and the CPU tests' time bounds are made from them, so both try the same inputs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace tfe::test {

// A .tfe (safetensors) image whose JSON header is `header`, with no data.
inline std::vector<std::byte> safetensors_image(const std::string& header) {
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = std::byte(static_cast<uint8_t>(header.size() >> (8 * i)));
  for (char c : header) out.push_back(std::byte(static_cast<uint8_t>(c)));
  return out;
}

// A header of `bytes` of small JSON objects ("k0":{"a":{}}, ...), which a parser that rescans the parent
// object at every nested one reads in quadratic time.
inline std::string many_objects_header(size_t bytes) {
  std::string h = "{\"__metadata__\":{}";
  for (int i = 0; h.size() < bytes; ++i) h += fmt::format(",\"k{}\":{{\"a\":{{}}}}", i);
  return h + "}";
}

// A header whose tfe.header text nests `depth` JSON arrays.
inline std::string deep_metadata_header(int depth) {
  return "{\"__metadata__\":{\"tfe.format_version\":\"1\",\"tfe.header\":\"" + std::string(size_t(depth), '[') +
         std::string(size_t(depth), ']') + "\"}}";
}

// A YAML mapping of about `bytes` of keys k0, k1, ...: a reader that looks up each key by scanning the
// map reads it in quadratic time.
inline std::string many_keys_yaml(size_t bytes) {
  std::string text;
  for (int i = 0; text.size() < bytes; ++i) text += fmt::format("k{}: {}\n", i, i);
  return text;
}

// YAML nesting `depth` flow sequences under a key.
inline std::string deep_yaml(int depth) {
  return "schema_version: " + std::string(size_t(depth), '[') + "1" + std::string(size_t(depth), ']') + "\n";
}

}  // namespace tfe::test
