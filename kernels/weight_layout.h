// The tiled weight layout (Layout::tiled): the order in which the few-row GEMV (kernels/gemv.cuh) reads a
// matrix's bytes, so that each of a warp's loads is 512 consecutive bytes.
//
// A GEMV warp step reads, for the 16 rows of a column tile, one 64-byte K step of each: lane g * 4 + t the
// 16 bytes at 16 t of rows g and g + 8. Row-major, those are eight 64-byte pieces of eight rows a load.
// Tiled, a matrix of rows x row_bytes (rows a multiple of 16, row_bytes of 64) is a sequence of 16-row
// tiles, each a sequence of its row_bytes / 64 K steps, each step 1 KB: rows 0..7 of the tile (64 bytes
// each, in row order) and then rows 8..15. So byte `at` of row r lies at
//   (r / 16) * 16 * row_bytes + (at / 64) * 1024 + ((r / 8) % 2) * 512 + (r % 8) * 64 + at % 64,
// the sum of a row part and an `at` part, which is how the kernel computes it (weight_row_offset,
// weight_at_offset). A slice of whole tiles (first row a multiple of 16) is the tiled form of those rows
// at the same byte offset as in row-major order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace tfe {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kTileStepBytes = 64;

// Whether a matrix of `rows` rows of `row_bytes` bytes has a tiled form: whole tiles and whole K steps.
bool tileable(int64_t rows, int64_t row_bytes);

// Where byte `at` of row `row` lies in the tiled form of a matrix whose rows are `row_bytes` long.
int64_t tiled_offset(int64_t row, int64_t at, int64_t row_bytes);

// Writes the tiled form of rows 0..rows-1 (row r's bytes at row(r)) into out (rows * row_bytes bytes).
// The matrix must be tileable.
void tile_rows(const std::function<const std::byte*(int64_t)>& row, int64_t rows, int64_t row_bytes, std::byte* out);
// The same for a row-major matrix held in one piece.
void tile_rows(const void* matrix, int64_t rows, int64_t row_bytes, void* out);

}  // namespace tfe
