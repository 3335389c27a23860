#include <tfe/head_file.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "core/error.h"
#include "core/files.h"
#include "head/strict_json.h"
#include "core/numeric.h"

namespace tfe {

using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr size_t kLengthBytes = 8;  // the little-endian u64 that precedes the JSON header
constexpr size_t kMaxRank = 8;
// A safetensors header nests two levels (entry -> shape); anything much deeper is not one.
constexpr int kMaxJsonDepth = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

// ---------------------------------------------------------------------------------------------------
// Hashing

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string to_hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 0xf];
  }
  return s;
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// ---------------------------------------------------------------------------------------------------
// Writing

int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("tensor `{}`: dimension {} is negative", name, d);
    if (__builtin_mul_overflow(n, d, &n)) fail("tensor `{}`: element count overflows int64", name);
  }
  return n;
}

int64_t checked_bytes(const std::vector<int64_t>& shape, DType dtype, std::string_view name) {
  int64_t b = 0;
  if (__builtin_mul_overflow(checked_numel(shape, name), dtype_size(dtype), &b))
    fail("tensor `{}`: byte size overflows int64", name);
  return b;
}

// The JSON header of a safetensors file, padded with spaces so that the data section starts 8-aligned.
std::string safetensors_header(const std::map<std::string, std::string>& metadata,
                               const std::vector<SafetensorsEntry>& entries) {
  ordered_json j = ordered_json::object();
  if (!metadata.empty()) j[kMetadataKey] = metadata;
  uint64_t offset = 0;
  std::set<std::string_view> names;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == kMetadataKey)
      fail("safetensors writer: tensor name `{}` is not allowed (empty or reserved)", e.name);
    if (e.shape.size() > kMaxRank)
      fail("safetensors writer: tensor `{}` has rank {}; readers accept at most {}", e.name, e.shape.size(), kMaxRank);
    if (!names.insert(e.name).second) fail("safetensors writer: tensor `{}` is given twice", e.name);
    const int64_t bytes = checked_bytes(e.shape, e.dtype, e.name);
    if (static_cast<uint64_t>(bytes) != e.bytes.size())
      fail("safetensors writer: tensor `{}` has {} bytes; {} {} needs {}", e.name, e.bytes.size(), dtype_name(e.dtype),
           fmt::join(e.shape, "x"), bytes);
    ordered_json t;
    t["dtype"] = dtype_name(e.dtype);
    t["shape"] = e.shape;
    t["data_offsets"] = {offset, offset + e.bytes.size()};
    j[e.name] = std::move(t);
    offset += e.bytes.size();
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void append(std::vector<std::byte>& out, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

std::array<unsigned char, kLengthBytes> length_prefix(uint64_t n) {
  std::array<unsigned char, kLengthBytes> le{};
  for (size_t i = 0; i < kLengthBytes; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  return le;
}

// ---------------------------------------------------------------------------------------------------
// Reading

// A non-negative JSON integer as u64; floats, negatives and other types are refused by the caller.
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

std::string describe(const json& v) { return v.is_structured() ? std::string(v.type_name()) : v.dump(); }

json parse_header_json(std::string_view text, const std::string& label) {
  return parse_strict_json(text, label + ": header", kMaxJsonDepth);
}

struct RawEntry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

RawEntry parse_entry(const std::string& name, const json& v, const std::string& label) {
  if (!v.is_object()) fail("{}: tensor `{}` entry must be an object (got {})", label, name, v.type_name());
  for (const auto& [key, value] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail("{}: tensor `{}` has unknown field `{}`", label, name, key);
  RawEntry r;
  r.view.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end()) fail("{}: tensor `{}`: field `dtype` missing", label, name);
  if (!dt->is_string()) fail("{}: tensor `{}`: dtype must be a string (got {})", label, name, describe(*dt));
  auto dtype = dtype_from_name(dt->get<std::string>());
  if (!dtype) fail("{}: tensor `{}`: unknown dtype \"{}\"", label, name, dt->get<std::string>());
  r.view.dtype = *dtype;

  auto sh = v.find("shape");
  if (sh == v.end()) fail("{}: tensor `{}`: field `shape` missing", label, name);
  if (!sh->is_array()) fail("{}: tensor `{}`: shape must be an array (got {})", label, name, describe(*sh));
  if (sh->size() > kMaxRank) fail("{}: tensor `{}`: rank {} exceeds {}", label, name, sh->size(), kMaxRank);
  int64_t numel = 1;
  for (size_t i = 0; i < sh->size(); ++i) {
    auto d = as_u64((*sh)[i]);
    if (!d || *d > static_cast<uint64_t>(INT64_MAX))
      fail("{}: tensor `{}`: shape[{}] = {} must be a non-negative integer", label, name, i, describe((*sh)[i]));
    r.view.shape.push_back(static_cast<int64_t>(*d));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(*d), &numel))
      fail("{}: tensor `{}`: shape {} has more elements than int64 holds", label, name, sh->dump());
  }
  if (__builtin_mul_overflow(numel, dtype_size(r.view.dtype), &r.view.bytes))
    fail("{}: tensor `{}`: shape {} of {} is more bytes than int64 holds", label, name, sh->dump(),
         dtype_name(r.view.dtype));

  auto off = v.find("data_offsets");
  if (off == v.end()) fail("{}: tensor `{}`: field `data_offsets` missing", label, name);
  if (!off->is_array() || off->size() != 2)
    fail("{}: tensor `{}`: data_offsets must be an array of 2 integers (got {})", label, name, describe(*off));
  auto b = as_u64((*off)[0]), e = as_u64((*off)[1]);
  if (!b || !e) fail("{}: tensor `{}`: data_offsets {} must be non-negative integers", label, name, off->dump());
  if (*b > *e) fail("{}: tensor `{}`: data_offsets [{}, {}] are reversed (begin > end)", label, name, *b, *e);
  r.begin = *b;
  r.end = *e;
  if (*e - *b != static_cast<uint64_t>(r.view.bytes))
    fail("{}: tensor `{}`: data_offsets [{}, {}] span {} bytes; {} {} needs {}", label, name, *b, *e, *e - *b,
         dtype_name(r.view.dtype), sh->dump(), r.view.bytes);
  return r;
}

}  // namespace

std::string sha256_hex(std::span<const std::byte> bytes) {
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1 || EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1)
    fail("sha256: OpenSSL digest failed");
  return to_hex(digest, len);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow was excluded when the view was made
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Plain safetensors writer

std::vector<std::byte> serialize_safetensors(const std::map<std::string, std::string>& metadata,
                                             const std::vector<SafetensorsEntry>& entries) {
  const std::string header = safetensors_header(metadata, entries);
  size_t total = kLengthBytes + header.size();
  for (const auto& e : entries) total += e.bytes.size();
  std::vector<std::byte> out;
  out.reserve(total);
  append(out, length_prefix(header.size()).data(), kLengthBytes);
  append(out, header.data(), header.size());
  for (const auto& e : entries) append(out, e.bytes.data(), e.bytes.size());
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       const std::vector<SafetensorsEntry>& entries) {
  // Streamed rather than serialized: a full-size head is gigabytes.
  const std::string header = safetensors_header(metadata, entries);
  files::AtomicWriter f(path, "output");
  f.write(length_prefix(header.size()).data(), kLengthBytes);
  f.write(header.data(), header.size());
  for (const auto& e : entries) f.write(e.bytes.data(), e.bytes.size());
  f.commit();
}

// ---------------------------------------------------------------------------------------------------
// Head writer

namespace {

// d2t maps a draft id to a target id as `id + d2t[id]` (docs/head.md); both writer and reader hold every
// target inside the vocabulary, since the runtime indexes embed and target_head with it unchecked.
void check_d2t(std::span<const std::byte> bytes, int64_t vocab, const std::string& where) {
  const size_t n = bytes.size() / sizeof(int32_t);
  for (size_t i = 0; i < n; ++i) {
    int32_t off;
    std::memcpy(&off, bytes.data() + i * sizeof(int32_t), sizeof off);
    const int64_t target = static_cast<int64_t>(i) + off;
    if (target < 0 || target >= vocab)
      fail("{}: d2t[{}] = {} maps draft id {} to target id {}, outside the vocabulary 0..{}", where, i, off, i, target,
           vocab - 1);
  }
}

const TensorSpec* find_spec(const std::vector<TensorSpec>& specs, std::string_view name) {
  auto it = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

}  // namespace

void check_weight_values(const TensorView& t, std::string_view where) {
  const std::span<const std::byte> bytes{t.data, static_cast<size_t>(t.bytes)};
  switch (t.dtype) {
    case DType::F8_E4M3:
      check_e4m3_finite(bytes, t.name, where);
      return;
    case DType::BF16: {
      const auto v = t.as<bf16_bits>();
      if (const int64_t at = find_bf16_nonfinite(v); at >= 0)
        fail("{}: tensor `{}`: element {} is {} (bf16 0x{:04x}); weights must be finite", where, t.name, at,
             bf16_to_float(v[static_cast<size_t>(at)]), v[static_cast<size_t>(at)]);
      return;
    }
    case DType::F32: {
      const bool scale = t.name.ends_with(".scale");
      const auto v = t.as<float>();
      const int64_t at = find_first_bad(v, [scale](float x) { return !std::isfinite(x) || (scale && !(x > 0.0f)); });
      if (at >= 0)
        fail("{}: tensor `{}`: element {} is {}; {} must be finite{}", where, t.name, at, v[static_cast<size_t>(at)],
             scale ? "FP8 scales" : "weights", scale ? " and positive" : "");
      return;
    }
    default:
      return;
  }
}

void check_e4m3_finite(std::span<const std::byte> bytes, std::string_view tensor, std::string_view where) {
  const int64_t at = find_e4m3_nan(bytes);
  if (at >= 0)
    fail("{}: tensor `{}`: element {} is 0x{:02x}, an e4m3 NaN code; FP8 weights must be finite", where, tensor, at,
         std::to_integer<unsigned>(bytes[static_cast<size_t>(at)]));
}

HeadWriter::HeadWriter(HeadHeader h) : header_(std::move(h)) { validate(header_); }

void HeadWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                     std::span<const std::byte> bytes) {
  add(name, dtype, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end()));
}

void HeadWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte>&& bytes) {
  const auto specs = expected_tensors(header_);
  const TensorSpec* spec = find_spec(specs, name);
  if (!spec) fail("head writer: tensor `{}` is not part of a head with this header", name);
  for (const auto& e : entries_)
    if (e.name == name) fail("head writer: tensor `{}` is added twice", name);
  if (dtype != spec->dtype)
    fail("head writer: tensor `{}` is {}; the header expects {}", name, dtype_name(dtype), dtype_name(spec->dtype));
  if (shape != spec->shape)
    fail("head writer: tensor `{}` has shape [{}]; the header expects [{}]", name, fmt::join(shape, ", "),
         fmt::join(spec->shape, ", "));
  const int64_t expected = checked_bytes(shape, dtype, name);
  if (static_cast<uint64_t>(expected) != bytes.size())
    fail("head writer: tensor `{}` has {} bytes; shape [{}] of {} needs {}", name, bytes.size(), fmt::join(shape, ", "),
         dtype_name(dtype), expected);
  if (name == "d2t") check_d2t(bytes, header_.vocab, "head writer");
  // What a reader would refuse is never written (a NaN weight converted from a checkpoint, say).
  // check_weight_values reads elements in place: a caller's buffer off its element alignment is copied.
  std::vector<std::byte> aligned;
  const std::byte* data = bytes.data();
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(dtype_size(dtype)) != 0) {
    aligned.assign(bytes.begin(), bytes.end());
    data = aligned.data();
  }
  TensorView view;
  view.name = std::string(name);
  view.dtype = dtype;
  view.data = data;
  view.bytes = static_cast<int64_t>(bytes.size());
  check_weight_values(view, "head writer");
  entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

namespace {

std::map<std::string, std::string> head_metadata(const HeadHeader& h, const std::vector<SafetensorsEntry>& entries) {
  auto md = header_to_metadata(h);
  ordered_json sha = ordered_json::object();
  for (const auto& e : entries) sha[e.name] = sha256_hex(e.bytes);
  md["tfe.sha256"] = sha.dump();
  return md;
}

// The entries in the order added, once every tensor the header expects is there.
template <typename Entries>
std::vector<SafetensorsEntry> complete_entries(const HeadHeader& h, const Entries& added) {
  for (const auto& spec : expected_tensors(h)) {
    auto it = std::find_if(added.begin(), added.end(), [&](const auto& e) { return e.name == spec.name; });
    if (it == added.end()) fail("head writer: tensor `{}` was never added", spec.name);
  }
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const auto& e : added) {
    // The reader refuses a tensor not aligned to its element size (it is read in place); the data section
    // starts 8-aligned, so the order added decides. Adding larger elements first always works.
    if (offset % static_cast<uint64_t>(dtype_size(e.dtype)) != 0)
      fail("head writer: tensor `{}` ({}) would start at data offset {}, not a multiple of {}; add it earlier", e.name,
           dtype_name(e.dtype), offset, dtype_size(e.dtype));
    offset += e.bytes.size();
    entries.push_back({e.name, e.dtype, e.shape, e.bytes});
  }
  return entries;
}

}  // namespace

std::vector<std::byte> HeadWriter::serialize() const {
  const auto entries = complete_entries(header_, entries_);
  return serialize_safetensors(head_metadata(header_, entries), entries);
}

void HeadWriter::write(const std::string& path) const {
  const auto entries = complete_entries(header_, entries_);
  write_safetensors(path, head_metadata(header_, entries), entries);
}

// ---------------------------------------------------------------------------------------------------
// Safetensors reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this == &o) return *this;
  if (mapped_) ::munmap(const_cast<std::byte*>(base_), size_);
  path_ = std::move(o.path_);
  metadata_ = std::move(o.metadata_);
  tensors_ = std::move(o.tensors_);  // views point into the mapping, which does not move
  base_ = std::exchange(o.base_, nullptr);
  size_ = std::exchange(o.size_, 0);
  header_len_ = std::exchange(o.header_len_, 0);
  mapped_ = std::exchange(o.mapped_, false);
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<std::byte*>(base_), size_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  uint64_t size = 0;
  files::Fd file = files::open_regular(path, "safetensors file", &size);
  if (size < kLengthBytes)
    fail("{} is not a safetensors file: it is {} bytes; a safetensors file starts with an {}-byte header length", path,
         size, kLengthBytes);
  // Read into anonymous memory rather than mapped: a file truncated while in use is then a read error
  // here, where a mapping of it would kill the process with SIGBUS at the first touch of a lost page.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("{}: cannot allocate {} bytes to read it into: {}", path, size, std::strerror(errno));
  SafetensorsFile f;  // owns the memory from here, so a refusal below releases it
  f.base_ = static_cast<const std::byte*>(p);
  f.size_ = size;
  f.mapped_ = true;
  auto* dst = static_cast<char*>(p);
  for (uint64_t done = 0; done < size;) {
    const ssize_t n =
        ::pread(file.get(), dst + done, std::min<uint64_t>(size - done, uint64_t{1} << 30), static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: reading failed after {} of {} bytes: {}", path, done, size, std::strerror(errno));
    if (n == 0) fail("{}: the file shrank from {} to {} bytes while it was read", path, size, done);
    done += static_cast<uint64_t>(n);
  }
  ::mprotect(p, size, PROT_READ);
  f.path_ = path;
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::span<const std::byte> bytes, std::string label) {
  SafetensorsFile f;
  f.base_ = bytes.data();
  f.size_ = bytes.size();
  f.path_ = std::move(label);
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& label = path_;
  if (size_ < kLengthBytes)
    fail("{} is not a safetensors file: it is {} bytes; a safetensors file starts with an {}-byte header length", label,
         size_, kLengthBytes);
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<uint64_t>(base_[i]) << (8 * i);
  if (n > kMaxHeaderBytes) {
    // A text file (a config.json, a YAML header given for a head) lands here: its first bytes, read as a
    // length, are absurd. Showing them as text says what the file is.
    std::string text;
    for (size_t i = 0; i < kLengthBytes; ++i) {
      const auto c = static_cast<unsigned char>(base_[i]);
      if (c < 0x20 || c > 0x7e) break;
      text += static_cast<char>(c);
    }
    fail("{} is not a safetensors file: header length {} exceeds the limit of {} bytes{}", label, n, kMaxHeaderBytes,
         text.size() == kLengthBytes ? fmt::format(" (the file begins with the text \"{}\")", text) : "");
  }
  if (n > size_ - kLengthBytes)
    fail(
        "{} is not a safetensors file (or is truncated): header length {} exceeds the {} bytes that follow the "
        "length field",
        label, n, size_ - kLengthBytes);
  // The safetensors format requires this first byte; a file without it is something else.
  if (n == 0 || base_[kLengthBytes] != std::byte{'{'})
    fail("{} is not a safetensors file: its header does not begin with `{{`", label);
  header_len_ = n;
  const uint64_t data_size = size_ - kLengthBytes - n;
  const std::byte* data = base_ + kLengthBytes + n;

  const json j = parse_header_json({reinterpret_cast<const char*>(base_ + kLengthBytes), n}, label);
  if (!j.is_object()) fail("{}: header must be a JSON object (got {})", label, j.type_name());

  std::vector<RawEntry> entries;
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) fail("{}: __metadata__ must be an object (got {})", label, value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail("{}: __metadata__[\"{}\"] must be a string (got {})", label, mk, describe(mv));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(key, value, label));
  }

  // Offsets past the data first, each naming its own tensor: sorted, a tensor past the end would leave a
  // "gap" before an unrelated one, which the contiguity pass below would report instead.
  for (const auto& e : entries)
    if (e.end > data_size)
      fail("{}: tensor `{}`: data_offsets [{}, {}] are out of range: the data section has {} bytes", label, e.view.name,
           e.begin, e.end, data_size);
  // Zero-size tensors sort before a tensor that starts at the same offset, so that contiguity reads simply.
  std::sort(entries.begin(), entries.end(),
            [](const RawEntry& a, const RawEntry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected = 0;
  std::string previous = "the start of the data section";
  for (auto& e : entries) {
    if (e.begin > expected)
      fail("{}: tensor `{}`: gap of {} bytes before it (it begins at {}; {} ends at {})", label, e.view.name,
           e.begin - expected, e.begin, previous, expected);
    if (e.begin < expected)
      fail("{}: tensor `{}`: data_offsets [{}, {}] overlap {}, which ends at {}", label, e.view.name, e.begin, e.end,
           previous, expected);
    e.view.data = data + e.begin;
    expected = e.end;
    previous = fmt::format("`{}`", e.view.name);
  }
  if (expected != data_size)
    fail("{}: {} trailing bytes after the last tensor (tensors end at {}; the data section has {} bytes)", label,
         data_size - expected, expected, data_size);
  tensors_.reserve(entries.size());
  for (auto& e : entries) tensors_.push_back(std::move(e.view));
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = std::find_if(tensors_.begin(), tensors_.end(), [&](const TensorView& t) { return t.name == name; });
  return it == tensors_.end() ? nullptr : &*it;
}

std::span<const std::byte> SafetensorsFile::header_bytes() const { return {base_ + kLengthBytes, header_len_}; }

// ---------------------------------------------------------------------------------------------------
// Head reader

HeadFile HeadFile::open(const std::string& path, Options opt) {
  HeadFile h(SafetensorsFile::open(path));
  h.check(opt);
  return h;
}

HeadFile HeadFile::from_bytes(std::span<const std::byte> bytes, Options opt) {
  HeadFile h(SafetensorsFile::from_bytes(bytes));
  h.check(opt);
  return h;
}

void HeadFile::check(Options opt) {
  const std::string& label = file_.path();
  for (const auto& [key, value] : file_.metadata())
    if (key.starts_with("tfe.") && key != "tfe.format_version" && key != "tfe.header" && key != "tfe.sha256")
      fail("{}: unknown metadata key `{}`", label, key);
  try {
    header_ = header_from_metadata(file_.metadata());
  } catch (const Error& e) {
    fail("{}: {}", label, e.what());
  }

  const auto specs = expected_tensors(header_);
  for (const auto& t : file_.tensors()) {
    if (!head_dtype(t.dtype))
      fail("{}: tensor `{}` is {}; a head holds only BF16, F32, I32 and F8_E4M3", label, t.name, dtype_name(t.dtype));
    const TensorSpec* spec = find_spec(specs, t.name);
    if (!spec) fail("{}: unexpected tensor `{}` (not part of a head with this header)", label, t.name);
    if (t.dtype != spec->dtype)
      fail("{}: tensor `{}` is {}; the header expects {}", label, t.name, dtype_name(t.dtype), dtype_name(spec->dtype));
    if (t.shape != spec->shape)
      fail("{}: tensor `{}` has shape [{}]; the header expects [{}]", label, t.name, fmt::join(t.shape, ", "),
           fmt::join(spec->shape, ", "));
    // Kernels and the CPU reference read tensors in place as arrays of their element type.
    if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(dtype_size(t.dtype)) != 0)
      fail("{}: tensor `{}` starts at file offset {}, not aligned to its {}-byte elements", label, t.name,
           t.data - file_.header_bytes().data() + kLengthBytes, dtype_size(t.dtype));
  }
  for (const auto& spec : specs)
    if (!file_.find(spec.name)) fail("{}: tensor `{}` missing", label, spec.name);

  auto sha_text = file_.metadata().find("tfe.sha256");
  if (sha_text == file_.metadata().end()) fail("{}: metadata key `tfe.sha256` missing", label);
  const json sha = parse_header_json(sha_text->second, label + " (tfe.sha256)");
  if (!sha.is_object()) fail("{}: `tfe.sha256` must be a JSON object (got {})", label, sha.type_name());
  for (const auto& [name, value] : sha.items()) {
    if (!file_.find(name)) fail("{}: `tfe.sha256` records tensor `{}`, which the file does not hold", label, name);
    if (!value.is_string() || !is_sha256_hex(value.get<std::string>()))
      fail("{}: `tfe.sha256` of `{}` = {} is not 64 lowercase hex digits", label, name, describe(value));
    sha_[name] = value.get<std::string>();
  }
  for (const auto& t : file_.tensors())
    if (!sha_.contains(t.name)) fail("{}: `tfe.sha256` has no entry for tensor `{}`", label, t.name);

  const TensorView& d2t = tensor("d2t");
  check_d2t({d2t.data, static_cast<size_t>(d2t.bytes)}, header_.vocab, label);

  if (opt.check_values)
    for (const auto& t : file_.tensors()) check_weight_values(t, label);

  if (opt.verify_sha256) {
    for (const auto& t : file_.tensors()) {
      const std::span<const std::byte> bytes{t.data, static_cast<size_t>(t.bytes)};
      const std::string actual = sha256_hex(bytes);
      if (actual != sha_.find(t.name)->second)
        fail("{}: tensor `{}`: sha256 {} does not match the recorded {}", label, t.name, actual,
             sha_.find(t.name)->second);
      if (t.dtype == DType::F8_E4M3) check_e4m3_finite(bytes, t.name, label);
    }
  }
}

const TensorView& HeadFile::tensor(std::string_view name) const {
  const TensorView* t = file_.find(name);
  if (!t) fail("{}: no tensor `{}`", file_.path(), name);
  return *t;
}

const std::string& HeadFile::recorded_sha256(std::string_view name) const {
  auto it = sha_.find(name);
  if (it == sha_.end()) fail("{}: no recorded sha256 for `{}`", file_.path(), name);
  return it->second;
}

std::string HeadFile::header_sha256() const { return sha256_hex(file_.header_bytes()); }

}  // namespace tfe
