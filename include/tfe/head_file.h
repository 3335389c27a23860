// The .tfe head file: a safetensors file whose __metadata__ carries the head header and the sha256 of
// every tensor. HeadFile maps a file read-only and validates it, first as safetensors, then as a head.
// HeadWriter builds one (used by `random`, `convert` and tests).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <tfe/dtype.h>
#include <tfe/error.h>
#include <tfe/header.h>

namespace tfe {

// Largest safetensors JSON header accepted (the safetensors package's own limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A read-only view of one tensor inside a mapped file (or any buffer that outlives the view).
struct TensorView {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  int64_t bytes = 0;
  int64_t numel() const;
  template <typename T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(data), static_cast<size_t>(bytes / sizeof(T))};
  }
};

// The raw safetensors layer: header JSON parsed and every offset checked; no head semantics.
// Rules: 8-byte little-endian header length <= kMaxHeaderBytes and inside the file; the header a JSON
// object; each entry has a known dtype, a shape of non-negative dims and data_offsets [begin, end);
// byte size = product(shape) x dtype size (overflow-checked) = end - begin; entries, sorted by offset,
// are contiguous from 0 and end exactly at the end of the file (no gaps, no overlap, no trailing bytes).
class SafetensorsFile {
 public:
  // Reads `path` (a regular file) into memory; throws tfe::Error naming the file, the field and the limit
  // on any violation.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory image (used by the fuzzer); the bytes must outlive the object.
  static SafetensorsFile from_bytes(std::span<const std::byte> bytes, std::string label = "<memory>");
  // A temporary buffer would be freed while the views into it live on.
  static SafetensorsFile from_bytes(std::vector<std::byte>&& bytes, std::string label = "<memory>") = delete;

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }  // in offset order
  const TensorView* find(std::string_view name) const;
  std::span<const std::byte> header_bytes() const;  // the JSON header as stored (sha256 of it is the head id)

 private:
  SafetensorsFile() = default;
  void parse();  // validates base_[0, size_) and fills metadata_ and tensors_
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorView> tensors_;
  const std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t header_len_ = 0;
  bool mapped_ = false;
};

// A head: the header parsed from __metadata__ and validated, and every expected tensor present with the
// right dtype and shape; extra tensors are refused by name; d2t targets inside the vocabulary.
class HeadFile {
 public:
  struct Options {
    // `--verify`: hash every tensor and compare with the metadata, and check that no F8_E4M3 tensor holds
    // a NaN code (check_e4m3_finite)
    bool verify_sha256 = false;
    // Weights checked as values (check_weight_values): every bf16 and fp32 value finite, FP8 scales
    // positive, no e4m3 NaN code. On by default: a NaN weight would make every draft NaN, silently.
    bool check_values = true;
  };
  static HeadFile open(const std::string& path, Options opt);
  static HeadFile open(const std::string& path) { return open(path, Options{}); }
  static HeadFile from_bytes(std::span<const std::byte> bytes, Options opt);
  // (An overload, not a default argument: GCC and Clang refuse `Options opt = {}` inside the class that
  // nests Options, whose member initializers are not yet usable there.)
  static HeadFile from_bytes(std::span<const std::byte> bytes) { return from_bytes(bytes, Options{}); }
  static HeadFile from_bytes(std::vector<std::byte>&& bytes, Options opt) = delete;  // would dangle
  static HeadFile from_bytes(std::vector<std::byte>&& bytes) = delete;

  const HeadHeader& header() const { return header_; }
  const SafetensorsFile& file() const { return file_; }
  // The tensor `name`; throws tfe::Error when absent.
  const TensorView& tensor(std::string_view name) const;
  const TensorView* find(std::string_view name) const { return file_.find(name); }
  // Recorded sha256 (hex) of a tensor's bytes.
  const std::string& recorded_sha256(std::string_view name) const;
  // sha256 (hex) of the stored JSON header: identifies the head (plans and artifacts record it).
  std::string header_sha256() const;

 private:
  explicit HeadFile(SafetensorsFile f) : file_(std::move(f)) {}
  void check(Options opt);  // the head rules, on top of the safetensors ones
  SafetensorsFile file_;
  HeadHeader header_;
  std::map<std::string, std::string, std::less<>> sha_;
};

// The header <-> __metadata__ mapping (string keys to string values, as safetensors requires).
// Keys: "tfe.format_version", "tfe.header" (the header as JSON text), "tfe.sha256" (JSON object name -> hex).
std::map<std::string, std::string> header_to_metadata(const HeadHeader& h);
HeadHeader header_from_metadata(const std::map<std::string, std::string>& md);  // throws naming the field

// Writes a .tfe: tensors in the order given, __metadata__ with the header and each tensor's sha256.
// The writer checks every tensor against expected_tensors(header) before writing anything.
class HeadWriter {
 public:
  explicit HeadWriter(HeadHeader h);
  // Adds a tensor; the bytes are copied. Throws on a name the header does not expect or a wrong size.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> bytes);
  // Adds a tensor by moving owned bytes.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte>&& bytes);
  // Writes atomically (temporary file + rename). Throws if an expected tensor is missing.
  void write(const std::string& path) const;
  // The whole file image in memory (tests, fuzz seeds).
  std::vector<std::byte> serialize() const;
  const HeadHeader& header() const { return header_; }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  HeadHeader header_;
  std::vector<Entry> entries_;
};

// A plain safetensors writer (no head semantics): used for EAGLE-3 style checkpoints in tests and for
// `tfe-plan reference` vectors. Entries are written in the order given; the file is written atomically.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};
void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       const std::vector<SafetensorsEntry>& entries);
std::vector<std::byte> serialize_safetensors(const std::map<std::string, std::string>& metadata,
                                             const std::vector<SafetensorsEntry>& entries);

// Throws, naming `where`, the tensor, the element and its byte, when an F8_E4M3 tensor's bytes hold a NaN
// code (find_e4m3_nan in core/numeric.h says why FP8 weights must be finite). HeadWriter::add always
// checks; a reader with verify_sha256, and the runtime's upload.
void check_e4m3_finite(std::span<const std::byte> bytes, std::string_view tensor, std::string_view where);

// Throws, naming `where`, the tensor, the element and its value, when a BF16 or F32 tensor holds a NaN or
// an infinity, an FP8 scale (`*.scale`) is not positive, or an F8_E4M3 tensor holds a NaN code. The
// tensor's data must be aligned to its element size, as the reader requires of every tensor.
void check_weight_values(const TensorView& tensor, std::string_view where);

// Hex sha256 of bytes (OpenSSL).
std::string sha256_hex(std::span<const std::byte> bytes);

}  // namespace tfe
