// Splits a loop over output rows across threads. Each row is computed by exactly one thread in a
// fixed order, so results are identical for any thread count; small loops stay on the calling thread.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace tfe::ref {

// Multiply-adds below which a loop is not worth a thread start (tens of microseconds).
inline constexpr int64_t kMinWorkPerThread = int64_t{1} << 20;

// Resolves a requested thread count: 0 means the machine's hardware threads.
inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Calls body(begin, end) over disjoint ranges covering [0, rows). cost_per_row: multiply-adds per row.
template <typename Body>
void parallel_rows(int64_t rows, int64_t cost_per_row, int threads, Body&& body) {
  const int64_t by_work = std::max<int64_t>(1, rows * cost_per_row / kMinWorkPerThread);
  const int64_t n = std::min<int64_t>({static_cast<int64_t>(std::max(threads, 1)), rows, by_work});
  if (n <= 1) {
    body(int64_t{0}, rows);
    return;
  }
  const int64_t chunk = (rows + n - 1) / n;
  std::vector<std::jthread> pool;
  for (int64_t begin = chunk; begin < rows; begin += chunk)
    pool.emplace_back([&body, begin, end = std::min(rows, begin + chunk)] { body(begin, end); });
  body(int64_t{0}, std::min(rows, chunk));
}

}  // namespace tfe::ref
