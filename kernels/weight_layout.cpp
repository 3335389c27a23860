#include "kernels/weight_layout.h"

#include <cstring>

#include "core/error.h"

namespace tfe {

bool tileable(int64_t rows, int64_t row_bytes) {
  return rows > 0 && row_bytes > 0 && rows % kTileRows == 0 && row_bytes % kTileStepBytes == 0;
}

int64_t tiled_offset(int64_t row, int64_t at, int64_t row_bytes) {
  return (row / kTileRows) * kTileRows * row_bytes + (at / kTileStepBytes) * kTileRows * kTileStepBytes +
         ((row / 8) % 2) * 8 * kTileStepBytes + (row % 8) * kTileStepBytes + at % kTileStepBytes;
}

void tile_rows(const std::function<const std::byte*(int64_t)>& row, int64_t rows, int64_t row_bytes, std::byte* out) {
  if (!tileable(rows, row_bytes))
    fail("tile_rows: {} rows of {} bytes are not whole tiles of {} rows and {}-byte K steps", rows, row_bytes,
         kTileRows, kTileStepBytes);
  const int64_t steps = row_bytes / kTileStepBytes;
  const std::byte* src[kTileRows];
  for (int64_t tile = 0; tile < rows / kTileRows; ++tile) {
    for (int64_t i = 0; i < kTileRows; ++i) src[i] = row(tile * kTileRows + i);
    // Output order: step, then the tile's rows 0..15 (rows 0..7 are the first 512-byte half).
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t i = 0; i < kTileRows; ++i, out += kTileStepBytes)
        std::memcpy(out, src[i] + s * kTileStepBytes, kTileStepBytes);
  }
}

void tile_rows(const void* matrix, int64_t rows, int64_t row_bytes, void* out) {
  const auto* base = static_cast<const std::byte*>(matrix);
  tile_rows([&](int64_t r) { return base + r * row_bytes; }, rows, row_bytes, static_cast<std::byte*>(out));
}

}  // namespace tfe
