#include "runtime/tap_dump.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <system_error>

#include <tfe/head_file.h>

#include "core/error.h"
#include "core/files.h"

namespace tfe {

namespace {

constexpr const char* kFormat = "tfe.tap_dump";
constexpr int kFormatVersion = 1;

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v.data(), v.size()));
}

}  // namespace

void check_tap_dump_options(const TapDumpOptions& o) {
  namespace fs = std::filesystem;
  if (o.path.empty()) fail("tap dump: path is empty; name the safetensors file to write");
  if (o.max_rows < 1 || o.max_rows > INT32_MAX)
    fail("tap dump: max_rows = {} is outside 1..{} (rows kept in memory)", o.max_rows, INT32_MAX);
  files::check_output(fs::path(o.path), "tap dump: path");
}

TapDump::TapDump(TapDumpOptions options, int taps, int64_t target_hidden, std::string head_sha256)
    : options_(std::move(options)),
      taps_(taps),
      target_hidden_(target_hidden),
      row_width_(int64_t{taps} * target_hidden),
      head_sha256_(std::move(head_sha256)) {
  check_tap_dump_options(options_);
  if (taps < 1 || target_hidden < 1)
    fail("tap dump: taps = {} and target_hidden = {} must both be at least 1", taps, target_hidden);
}

TapDump::~TapDump() {
  try {
    write();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfe: %s\n", e.what());
  }
}

void TapDump::record(std::span<const ExtendRequest> call, int64_t left_out) {
  if (left_out < 0) fail("tap dump: left_out = {} rows must be 0 or more", left_out);
  for (size_t i = 0; i < call.size(); ++i) {
    const ExtendRequest& q = call[i];
    if (q.slot < 0) fail("tap dump: requests[{}].slot = {} is negative", i, q.slot);
    if (q.n_rows < 0) fail("tap dump: requests[{}].n_rows = {} is negative", i, q.n_rows);
    if (q.first_pos < 0 || q.first_pos + q.n_rows - 1 > INT32_MAX)
      fail("tap dump: requests[{}] positions {}..{} are outside 0..{}", i, q.first_pos, q.first_pos + q.n_rows - 1,
           INT32_MAX);
    if (static_cast<int64_t>(q.taps.size()) != q.n_rows * row_width_)
      fail("tap dump: requests[{}].taps holds {} values; {} rows of {} x {} need {}", i, q.taps.size(), q.n_rows, taps_,
           target_hidden_, q.n_rows * row_width_);
    if (static_cast<int64_t>(q.tokens.size()) != q.n_rows)
      fail("tap dump: requests[{}].tokens holds {} values; the request has {} rows", i, q.tokens.size(), q.n_rows);
  }
  if (calls_ >= INT32_MAX) fail("tap dump: {} extend calls recorded; the file's call index is int32", calls_);
  const auto call_index = static_cast<int32_t>(calls_);
  int64_t dropped = left_out;
  for (const ExtendRequest& q : call) {
    const int64_t keep = std::min(q.n_rows, room());
    dropped += q.n_rows - keep;
    taps_data_.insert(taps_data_.end(), q.taps.begin(), q.taps.begin() + static_cast<ptrdiff_t>(keep * row_width_));
    tokens_.insert(tokens_.end(), q.tokens.begin(), q.tokens.begin() + static_cast<ptrdiff_t>(keep));
    for (int64_t r = 0; r < keep; ++r) {
      slots_.push_back(q.slot);
      positions_.push_back(static_cast<int32_t>(q.first_pos + r));
      call_of_row_.push_back(call_index);
    }
  }
  if (dropped > 0 && dropped_ == 0)
    std::fprintf(stderr,
                 "tfe: tap dump: max_rows = %lld rows reached at extend call %lld; the rows past it are counted in "
                 "%s's dropped_rows, not kept\n",
                 static_cast<long long>(options_.max_rows), static_cast<long long>(calls_), options_.path.c_str());
  dropped_ += dropped;
  ++calls_;
}

void TapDump::write() const {
  const int64_t n = rows();
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"format_version", std::to_string(kFormatVersion)},
      {"taps", std::to_string(taps_)},
      {"target_hidden", std::to_string(target_hidden_)},
      {"rows", std::to_string(n)},
      {"calls", std::to_string(calls_)},
      {"dropped_rows", std::to_string(dropped_)},
      {"max_rows", std::to_string(options_.max_rows)},
  };
  if (!head_sha256_.empty()) metadata["head_sha256"] = head_sha256_;
  const std::vector<SafetensorsEntry> entries = {
      {"taps", DType::BF16, {n, row_width_}, bytes_of(taps_data_)},
      {"tokens", DType::I32, {n}, bytes_of(tokens_)},
      {"slots", DType::I32, {n}, bytes_of(slots_)},
      {"positions", DType::I32, {n}, bytes_of(positions_)},
      {"calls", DType::I32, {n}, bytes_of(call_of_row_)},
  };
  try {
    write_safetensors(options_.path, metadata, entries);
  } catch (const std::exception& e) {
    fail("tap dump: writing {} failed: {}", options_.path, e.what());
  }
}

}  // namespace tfe
