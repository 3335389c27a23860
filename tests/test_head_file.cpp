// The .tfe head file: writer and reader round trips, and one malformed file per validation rule, each
// refused with a message that names what is wrong.
#include <sys/stat.h>
#include <chrono>

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include <tfe/head_file.h>
#include <tfe/header.h>
#include "core/numeric.h"
#include "head/presets.h"
#include "head/random_head.h"
#include "hostile_inputs.h"
#include "test_util.h"

using namespace tfe;
using nlohmann::json;
using tfe::test::random_head_bytes;
using tfe::test::run_command;
using tfe::test::write_temp_file;

namespace {

using Bytes = std::vector<std::byte>;

// A safetensors image from header text and `data_bytes` random non-zero data bytes; `length` overrides the
// stored header length.
Bytes raw_file(const std::string& header, size_t data_bytes, std::optional<uint64_t> length = {}) {
  const uint64_t n = length.value_or(header.size());
  Bytes out(8);
  for (int i = 0; i < 8; ++i) out[i] = std::byte(n >> (8 * i));
  for (char c : header) out.push_back(std::byte(c));
  std::mt19937 rng(static_cast<uint32_t>(data_bytes));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(std::byte(1 + rng() % 255));
  return out;
}

void refuses_raw(const Bytes& image, const std::string& message) {
  CAPTURE(message);
  CHECK_THROWS_WITH_AS(SafetensorsFile::from_bytes(image, "bad.safetensors"), doctest::Contains(message.c_str()),
                       Error);
}

void refuses_head(const Bytes& image, const std::string& message, HeadFile::Options opt = {}) {
  CAPTURE(message);
  CHECK_THROWS_WITH_AS(HeadFile::from_bytes(image, opt), doctest::Contains(message.c_str()), Error);
}

// A valid head re-serialized after `edit` changed its metadata or tensors (entries point into `image`).
using Edit = std::function<void(std::map<std::string, std::string>&, std::vector<SafetensorsEntry>&)>;
Bytes rebuild(const Bytes& image, const Edit& edit) {
  const auto f = SafetensorsFile::from_bytes(image);
  auto md = f.metadata();
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : f.tensors()) entries.push_back({t.name, t.dtype, t.shape, {t.data, size_t(t.bytes)}});
  edit(md, entries);
  return serialize_safetensors(md, entries);
}

// A valid head whose header JSON was changed by `edit` (the tensors stay as they were).
Bytes edit_header(const Bytes& image, const std::function<void(json&)>& edit) {
  return rebuild(image, [&](auto& md, auto&) {
    json h = json::parse(md.at("tfe.header"));
    edit(h);
    md["tfe.header"] = h.dump();
  });
}

HeadHeader fp8_tiny() {
  auto h = preset_header("tiny");
  h.fp8 = {"wq", "w_down", "lm_head"};
  return h;
}

}  // namespace

TEST_CASE("head file: write, read back, every dtype and byte intact") {
  for (auto h : {fp8_tiny(), preset_header("tiny-two-stage")}) {
    CAPTURE(h.name);
    const uint64_t seed = std::random_device{}();
    CAPTURE(seed);
    const Bytes image = random_head_bytes(h, seed);
    const auto path = write_temp_file(image, "roundtrip.tfe");
    const auto head = HeadFile::open(path, {.verify_sha256 = true});
    CHECK(head.header() == h);
    const auto specs = expected_tensors(h);
    REQUIRE(head.file().tensors().size() == specs.size());

    // The same bytes written by the writer to disk read back identically, tensor by tensor.
    const auto memory = HeadFile::from_bytes(image);
    std::set<DType> dtypes;
    for (const auto& spec : specs) {
      CAPTURE(spec.name);
      const TensorView& t = head.tensor(spec.name);
      const TensorView& m = memory.tensor(spec.name);
      CHECK(t.dtype == spec.dtype);
      CHECK(t.shape == spec.shape);
      CHECK(t.bytes == t.numel() * dtype_size(t.dtype));
      REQUIRE(t.bytes == m.bytes);
      CHECK(std::memcmp(t.data, m.data, size_t(t.bytes)) == 0);
      CHECK(head.recorded_sha256(spec.name) == sha256_hex({t.data, size_t(t.bytes)}));
      dtypes.insert(t.dtype);
    }
    if (!h.fp8.empty()) CHECK(dtypes == std::set{DType::BF16, DType::F32, DType::I32, DType::F8_E4M3});
    CHECK(head.header_sha256() == memory.header_sha256());
    CHECK(head.header_sha256().size() == 64);
    CHECK_THROWS_WITH_AS(head.tensor("nope"), doctest::Contains("no tensor `nope`"), Error);
  }
}

// A head file truncated while a process holds it open cannot take the process down: the reader holds the
// file's bytes, not a mapping whose lost pages would raise SIGBUS.
TEST_CASE("head file: truncating the file under an open HeadFile changes nothing it reads") {
  const auto h = preset_header("tiny");
  const Bytes image = random_head_bytes(h, 7);
  const auto path = write_temp_file(image, "truncated-later.tfe");
  const auto head = HeadFile::open(path, {.verify_sha256 = true});
  std::filesystem::resize_file(path, 8);
  uint64_t sum = 0;
  for (const auto& t : head.file().tensors())
    for (int64_t i = 0; i < t.bytes; ++i) sum += static_cast<uint8_t>(t.data[i]);
  CHECK(sum > 0);
  CHECK_THROWS_WITH_AS(HeadFile::open(path), doctest::Contains("header length"), Error);
}

// A weight that is NaN or infinite, a scale that is not positive, or an e4m3 NaN code would make every
// draft NaN, silently: refused at open by default, by tensor and element.
TEST_CASE("head file: weights are checked as values at open") {
  const auto h = preset_header("tiny");
  const Bytes image = random_head(h, 7, /*fp8=*/true).serialize();
  const auto head = HeadFile::from_bytes(image);
  // A copy of the image with `value` written over element `index` of `tensor`.
  const auto with = [&](const std::string& tensor, size_t index, const void* value, size_t size) {
    Bytes copy = image;
    const TensorView& t = head.tensor(tensor);
    std::memcpy(copy.data() + (t.data - image.data()) + index * size, value, size);
    return copy;
  };
  const uint16_t bf16_nan = 0x7fc0, bf16_inf = 0xff80;
  const float negative = -0.5f, zero = 0.0f, inf = INFINITY;
  const uint8_t e4m3_nan = 0x7f;
  const std::vector<std::pair<Bytes, std::string>> cases = {
      {with("wo", 3, &bf16_nan, 2), "tensor `wo`: element 3 is nan"},
      {with("embed", 0, &bf16_inf, 2), "tensor `embed`: element 0 is -inf"},
      {with("wo.scale", 1, &negative, 4),
       "tensor `wo.scale`: element 1 is -0.5; FP8 scales must be finite and positive"},
      {with("wo.scale", 2, &zero, 4), "element 2 is 0; FP8 scales must be finite and positive"},
      {with("w_up.scale", 0, &inf, 4), "tensor `w_up.scale`: element 0 is inf"},
      {with("wo.fp8", 5, &e4m3_nan, 1), "tensor `wo.fp8`: element 5 is 0x7f, an e4m3 NaN code"},
  };
  for (const auto& [bytes, message] : cases) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(HeadFile::from_bytes(bytes), doctest::Contains(message.c_str()), Error);
    CHECK_NOTHROW(HeadFile::from_bytes(bytes, {.check_values = false}));
  }
}

TEST_CASE("head file: a FIFO given as the head file is refused at once") {
  const auto path = tfe::test::temp_dir() / "fifo.tfe";
  std::filesystem::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(HeadFile::open(path.string()), doctest::Contains("is a FIFO; give a regular file"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("head file: HeadWriter::write is atomic and equals serialize()") {
  const auto h = preset_header("tiny");
  const Bytes image = random_head_bytes(h, 7);
  const auto head = HeadFile::from_bytes(image);
  HeadWriter w(h);
  for (const auto& t : head.file().tensors()) w.add(t.name, t.dtype, t.shape, {t.data, size_t(t.bytes)});
  const auto dir = tfe::test::temp_dir() / "atomic";
  std::filesystem::create_directories(dir);
  const auto path = (dir / "a.tfe").string();
  w.write(path);
  w.write(path);                                                            // over an existing file
  CHECK(std::distance(std::filesystem::directory_iterator(dir), {}) == 1);  // no temporary left behind
  std::ifstream in(path, std::ios::binary);
  const std::string disk((std::istreambuf_iterator<char>(in)), {});
  const Bytes mem = w.serialize();
  REQUIRE(disk.size() == mem.size());
  CHECK(std::memcmp(disk.data(), mem.data(), mem.size()) == 0);
  CHECK_THROWS_WITH_AS(w.write((dir / "missing-dir" / "a.tfe").string()),
                       doctest::Contains("missing-dir does not exist"), Error);
}

TEST_CASE("head file: HeadWriter refuses what the header does not expect") {
  const auto h = preset_header("tiny");
  const Bytes image = random_head_bytes(h, 11);
  const auto head = HeadFile::from_bytes(image);
  const TensorView& wq = head.tensor("wq");
  const std::span<const std::byte> wq_bytes(wq.data, size_t(wq.bytes));
  HeadWriter w(h);
  CHECK_THROWS_WITH_AS(w.add("wz", DType::BF16, wq.shape, wq_bytes), doctest::Contains("tensor `wz` is not part"),
                       Error);
  CHECK_THROWS_WITH_AS(w.add("wq", DType::F32, wq.shape, wq_bytes),
                       doctest::Contains("is F32; the header expects BF16"), Error);
  CHECK_THROWS_WITH_AS(w.add("wq", DType::BF16, {wq.shape[1], wq.shape[0]}, wq_bytes),
                       doctest::Contains("has shape [128, 64]; the header expects [64, 128]"), Error);
  CHECK_THROWS_WITH_AS(w.add("wq", DType::BF16, wq.shape, wq_bytes.first(10)), doctest::Contains("has 10 bytes"),
                       Error);
  w.add("wq", DType::BF16, wq.shape, wq_bytes);
  CHECK_THROWS_WITH_AS(w.add("wq", DType::BF16, wq.shape, wq_bytes), doctest::Contains("added twice"), Error);

  std::vector<int32_t> d2t(size_t(h.draft_vocab), 0);
  d2t[17] = int32_t(h.vocab);  // 17 + vocab is past the end
  CHECK_THROWS_WITH_AS(w.add("d2t", DType::I32, {h.draft_vocab}, tfe::test::to_bytes(d2t)),
                       doctest::Contains("d2t[17] = 1000"), Error);
  CHECK_THROWS_WITH_AS(w.serialize(), doctest::Contains("tensor `fc` was never added"), Error);
  CHECK_THROWS_WITH_AS(w.write((tfe::test::temp_dir() / "never.tfe").string()), doctest::Contains("never added"),
                       Error);
  CHECK_FALSE(std::filesystem::exists(tfe::test::temp_dir() / "never.tfe"));

  auto bad = preset_header("tiny");
  bad.window = 0;
  CHECK_THROWS_WITH_AS(HeadWriter{bad}, doctest::Contains("window = 0"), Error);
}

TEST_CASE("head file: HeadWriter refuses an order that would misalign a tensor") {
  auto h = preset_header("tiny");
  h.target_hidden = 95;  // tap_norm.1 is then 190 bytes: whatever follows it sits 2 bytes off 4-alignment
  const Bytes image = random_head_bytes(h, 3);
  const auto head = HeadFile::from_bytes(image);
  HeadWriter w(h);
  for (const char* name : {"tap_norm.1", "d2t"}) {
    const auto& t = head.tensor(name);
    w.add(t.name, t.dtype, t.shape, {t.data, size_t(t.bytes)});
  }
  for (const auto& t : head.file().tensors())
    if (t.name != "tap_norm.1" && t.name != "d2t") w.add(t.name, t.dtype, t.shape, {t.data, size_t(t.bytes)});
  CHECK_THROWS_WITH_AS(w.serialize(),
                       doctest::Contains("`d2t` (I32) would start at data offset 190, not a multiple of 4"), Error);

  // The same layout written by another tool is refused by the reader, which hands tensors out in place.
  const Bytes misaligned = rebuild(random_head_bytes(h, 4), [](auto&, auto& entries) {
    std::stable_partition(entries.begin(), entries.end(),
                          [](const SafetensorsEntry& e) { return e.name == "tap_norm.1"; });
    std::stable_partition(entries.begin() + 1, entries.end(),
                          [](const SafetensorsEntry& e) { return e.name == "d2t"; });
  });
  refuses_head(misaligned, "tensor `d2t` starts at file offset");
  refuses_head(misaligned, "not aligned to its 4-byte elements");
}

TEST_CASE("head file: header <-> metadata round trip of every field") {
  auto h = preset_header("tfe-two-stage");
  h.name = "a \"quoted\" name";
  h.rope.llama3 = true;
  h.rope.factor = 16.0f;
  h.rope.low_freq_factor = 0.75f;
  h.rope.high_freq_factor = 5.5f;
  h.rope.original_max_positions = 4096;
  h.rms_eps = 3.25e-6f;
  h.fp8 = {"lr_a", "target_head", "fc"};
  const auto md = header_to_metadata(h);
  CHECK(md.at("tfe.format_version") == "1");
  CHECK(header_from_metadata(md) == h);
  const json j = json::parse(md.at("tfe.header"));
  CHECK(j.at("taps").back() == json{{"layer", "final"}, {"norm", true}});
  CHECK(j.at("head_type") == "two_stage");
  CHECK(j.at("rms_eps").get<double>() == 3.25e-6);  // written as the shortest decimal

  h.rope.llama3 = false;
  h.rope.factor = std::numeric_limits<float>::infinity();  // unused without llama3, so validate() allows it
  CHECK_THROWS_WITH_AS(header_to_metadata(h), doctest::Contains("field `rope.factor` = inf cannot be stored"), Error);
}

TEST_CASE("head file: header_from_metadata names the missing, mistyped or unknown field") {
  const auto md = header_to_metadata(preset_header("tiny-two-stage"));
  auto with = [&](const std::function<void(json&)>& edit) {
    auto m = md;
    json j = json::parse(m.at("tfe.header"));
    edit(j);
    m["tfe.header"] = j.dump();
    return m;
  };
  auto refuses = [](const std::map<std::string, std::string>& m, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(header_from_metadata(m), doctest::Contains(message), Error);
  };
  refuses(with([](json& j) { j.erase("window"); }), "field `window` missing");
  refuses(with([](json& j) { j["window"] = 15.5; }), "field `window` must be an integer (got 15.5)");
  refuses(with([](json& j) { j["window"] = "15"; }), "field `window` must be an integer");
  refuses(with([](json& j) { j["window"] = uint64_t(1) << 40; }), "field `window` = 1099511627776 is outside");
  refuses(with([](json& j) { j["hidden"] = -64; }), "hidden = -64 is outside 1..16777216");
  refuses(with([](json& j) { j["hidden"] = uint64_t(1) << 63; }), "field `hidden` = 9223372036854775808 is outside");
  refuses(with([](json& j) { j["qk_norm"] = 1; }), "field `qk_norm` must be a boolean");
  refuses(with([](json& j) { j["rms_eps"] = 1e300; }), "field `rms_eps` = 1e+300 does not fit a 32-bit float");
  refuses(with([](json& j) { j["rope"].erase("theta"); }), "field `rope.theta` missing");
  refuses(with([](json& j) { j["rope"]["extra"] = 1; }), "unknown field `rope.extra`");
  refuses(with([](json& j) { j["rope"] = 1; }), "field `rope` must be an object");
  refuses(with([](json& j) { j["taps"][1]["layer"] = "last"; }), "field `taps[1].layer` = \"last\" must be");
  refuses(with([](json& j) { j["taps"][0]["layer"] = -1; }), "field `taps[0].layer` = -1 is outside 0..");
  refuses(with([](json& j) { j["taps"][2].erase("norm"); }), "field `taps[2].norm` missing");
  refuses(with([](json& j) { j["taps"] = json::array(); }), "taps has 0 entries");
  refuses(with([](json& j) { j["head_type"] = "sparse"; }), "field `head_type` = \"sparse\"");
  refuses(with([](json& j) { j["fp8"] = {"wq", 3}; }), "field `fp8[1]` must be a string");
  refuses(with([](json& j) { j["fp8"] = {"embed"}; }), "fp8 names `embed`, which is not a linear");
  refuses(with([](json& j) { j["windows"] = 15; }), "unknown field `windows`");
  refuses(with([](json& j) { j = json::array(); }), "must be a JSON object");

  auto m = md;
  m["tfe.format_version"] = "2";
  refuses(m, "`tfe.format_version` = 2 is not supported (this build reads 1)");
  m["tfe.format_version"] = "1x";
  refuses(m, "is not an integer");
  m.erase("tfe.format_version");
  refuses(m, "key `tfe.format_version` missing");
  m = md;
  m["tfe.header"] = "{\"name\": ";
  refuses(m, "`tfe.header` is not valid JSON");
  m["tfe.header"] = std::string(100, '[') + std::string(100, ']');
  refuses(m, "nests deeper than 8 levels");
  m = md;
  m["tfe.header"] = R"({"window": 7, "window": 9})";
  refuses(m, "key `window` twice in one object");
}

// A header of many small objects used to take minutes (nlohmann's callback parser rescans the parent object
// at every nested one); a linear reader refuses this 4 MiB one in well under a second.
TEST_CASE("safetensors reader: a header of many small objects is read in linear time") {
  std::string h = "{\"__metadata__\":{}";
  for (int i = 0; h.size() < (4u << 20); ++i) h += fmt::format(",\"k{}\":{{\"a\":{{}}}}", i);
  h += "}";
  const Bytes image = raw_file(h, 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(SafetensorsFile::from_bytes(image, "big.safetensors"), Error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

// The fuzz target's seeds (tests/fuzz/seeds/fuzz_head_file.cpp): refused by name in well under a second.
TEST_CASE("head file: a 1 MiB header of small objects and a deeply nested tfe.header are refused in < 1 s") {
  const auto refused_quickly = [](const Bytes& image, const char* message) {
    CAPTURE(message);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(HeadFile::from_bytes(image), doctest::Contains(message), Error);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  };
  refused_quickly(test::safetensors_image(test::many_objects_header(size_t{1} << 20)),
                  "tensor `k0` has unknown field `a`");
  refused_quickly(test::safetensors_image(test::deep_metadata_header(10000)), "nests deeper than 8 levels");
}

TEST_CASE("safetensors reader: accepts zero-size tensors, reports metadata and header bytes") {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"c":{"dtype":"I64","shape":[],"data_offsets":[6,14]}})";
  const Bytes image = raw_file(header, 14);
  const auto f = SafetensorsFile::from_bytes(image, "ok.safetensors");
  CHECK(f.metadata() == std::map<std::string, std::string>{{"k", "v"}});
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0].name == "a");  // offset order; the empty tensor first
  CHECK(f.tensors()[0].bytes == 0);
  CHECK(f.find("c")->numel() == 1);
  CHECK(f.find("c")->data == image.data() + 8 + header.size() + 6);
  CHECK(f.find("z") == nullptr);
  CHECK(std::string(reinterpret_cast<const char*>(f.header_bytes().data()), f.header_bytes().size()) == header);
}

TEST_CASE("safetensors reader: one malformed file per rule") {
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dtype, shape, offsets);
  };
  auto file = [](const std::vector<std::string>& entries, size_t data) {
    std::string h = "{";
    for (size_t i = 0; i < entries.size(); ++i) h += (i ? "," : "") + entries[i];
    return raw_file(h + "}", data);
  };
  const auto a = entry("a", "F32", "[2,3]", "[0,24]");

  refuses_raw(Bytes(5), "bad.safetensors is not a safetensors file: it is 5 bytes");
  refuses_raw(raw_file("{}", 0, kMaxHeaderBytes + 1),
              "bad.safetensors is not a safetensors file: header length 100000001 exceeds the limit of 100000000");
  refuses_raw(raw_file("{}", 0, 3), "header length 3 exceeds the 2 bytes that follow");
  refuses_raw(raw_file("{\"a\": ", 0), "bad.safetensors: header is not valid JSON");
  refuses_raw(raw_file("[1, 2]", 0), "bad.safetensors is not a safetensors file: its header does not begin with `{`");
  refuses_raw(raw_file(" {}", 0), "its header does not begin with `{`");
  refuses_raw(raw_file("", 0), "its header does not begin with `{`");
  refuses_raw(raw_file("{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}", 0),
              "nests deeper than 8 levels");
  refuses_raw(raw_file(R"({"__metadata__":{"x":"1","x":"2"}})", 0), "key `x` twice");
  // As the safetensors package reads a header: no NUL inside or as padding, no byte-order mark.
  refuses_raw(raw_file(std::string("{}\0\0", 4), 0), "holds a NUL byte at byte 2");
  refuses_raw(raw_file(std::string("{\"a\":\0{}}", 8), 0), "holds a NUL byte at byte 5");
  refuses_raw(raw_file("\xEF\xBB\xBF{}", 0), "its header does not begin with `{`");
  refuses_raw(raw_file("{}  x", 0), "is not valid JSON");
  refuses_raw(file({entry("a", "F64", "[2,3]", "[0,48]")}, 48), "tensor `a`: unknown dtype \"F64\"");
  refuses_raw(file({entry("a", "F32", "[2,-3]", "[0,24]")}, 24), "tensor `a`: shape[1] = -3 must be a non-negative");
  refuses_raw(file({entry("a", "F32", "[2,3.5]", "[0,24]")}, 24), "shape[1] = 3.5 must be a non-negative integer");
  refuses_raw(file({entry("a", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]")}, 4), "rank 9 exceeds 8");
  refuses_raw(file({entry("a", "F32", "3", "[0,12]")}, 12), "shape must be an array (got 3)");
  refuses_raw(file({entry("a", "F32", "[2,3]", "[24,0]")}, 24), "data_offsets [24, 0] are reversed");
  refuses_raw(file({entry("a", "F32", "[2,3]", "[0,24,0]")}, 24), "data_offsets must be an array of 2 integers");
  refuses_raw(file({entry("a", "F32", "[2,3]", "[-1,23]")}, 24), "must be non-negative integers");
  refuses_raw(file({entry("a", "F32", "[2,3]", "[0,20]")}, 20), "span 20 bytes; F32 [2,3] needs 24");
  refuses_raw(file({entry("a", "BF16", "[4294967296,4294967296]", "[0,2]")}, 2), "more elements than int64 holds");
  refuses_raw(file({entry("a", "F32", "[3037000499,3037000499]", "[0,2]")}, 2), "more bytes than int64 holds");
  refuses_raw(file({entry("a", "F32", "[18446744073709551615]", "[0,2]")}, 2), "shape[0] = 18446744073709551615");
  refuses_raw(file({a, entry("b", "F32", "[2]", "[20,28]")}, 28), "tensor `b`: data_offsets [20, 28] overlap `a`");
  refuses_raw(file({a, entry("b", "F32", "[2]", "[28,36]")}, 36), "tensor `b`: gap of 4 bytes before it");
  refuses_raw(file({entry("a", "F32", "[2,3]", "[4,28]")}, 28), "tensor `a`: gap of 4 bytes");
  refuses_raw(file({a, entry("b", "F32", "[2]", "[24,32]")}, 30), "[24, 32] are out of range: the data section has 30");
  // A tensor past the end is named itself, not as a gap before another ("c" sorts after "b" and its gap).
  refuses_raw(file({a, entry("b", "F32", "[2]", "[28,36]"), entry("c", "F32", "[2]", "[1000,1008]")}, 36),
              "tensor `c`: data_offsets [1000, 1008] are out of range: the data section has 36");
  refuses_raw(file({a}, 25), "1 trailing bytes after the last tensor");
  refuses_raw(file({}, 3), "3 trailing bytes");
  refuses_raw(raw_file(R"({"__metadata__":{"x":1}})", 0), "__metadata__[\"x\"] must be a string (got 1)");
  refuses_raw(raw_file(R"({"__metadata__":[]})", 0), "__metadata__ must be an object");
  refuses_raw(raw_file(R"({"a":[]})", 0), "tensor `a` entry must be an object");
  refuses_raw(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"crc":0}})", 4),
              "tensor `a` has unknown field `crc`");
  refuses_raw(raw_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "field `dtype` missing");
  refuses_raw(raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "field `shape` missing");
  refuses_raw(raw_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "field `data_offsets` missing");
  CHECK_THROWS_WITH_AS(SafetensorsFile::open((tfe::test::temp_dir() / "absent.safetensors").string()),
                       doctest::Contains("absent.safetensors: cannot open"), Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile::open(write_temp_file(Bytes(3), "short.safetensors")),
                       doctest::Contains("short.safetensors is not a safetensors file: it is 3 bytes"), Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile::open(tfe::test::temp_dir().string()),
                       doctest::Contains("is a directory; give a regular file"), Error);
}

TEST_CASE("head file: one bad head per rule") {
  const Bytes good = random_head_bytes(preset_header("tiny"), 5);
  CHECK_NOTHROW(HeadFile::from_bytes(good, {.verify_sha256 = true}));

  auto drop = [](const std::string& name) {
    return [name](auto& md, auto& entries) {
      std::erase_if(entries, [&](const SafetensorsEntry& e) { return e.name == name; });
      json sha = json::parse(md.at("tfe.sha256"));
      sha.erase(name);
      md["tfe.sha256"] = sha.dump();
    };
  };
  refuses_head(rebuild(good, drop("w_up")), "tensor `w_up` missing");
  refuses_head(rebuild(good, drop("d2t")), "tensor `d2t` missing");

  const std::vector<std::byte> extra_bytes(16, std::byte{3});
  refuses_head(rebuild(good,
                       [&](auto&, auto& entries) {
                         entries.push_back({"bias", DType::F32, {4}, extra_bytes});
                       }),
               "unexpected tensor `bias`");
  refuses_head(rebuild(good,
                       [&](auto&, auto& entries) {
                         entries.push_back({"bias", DType::F16, {8}, extra_bytes});
                       }),
               "tensor `bias` is F16; a head holds only BF16, F32, I32 and F8_E4M3");
}

TEST_CASE("head file: a value is stated as written, against the format's limit, and a name from the file escaped") {
  const Bytes good = random_head_bytes(preset_header("tiny"), 8);
  // No float holds 1e-300: it would read as 0, which is not what the file says.
  refuses_head(edit_header(good, [](json& j) { j["rms_eps"] = 1e-300; }),
               "field `rms_eps` = 1e-300 does not fit a 32-bit float");
  refuses_head(edit_header(good, [](json& j) { j["rope"]["theta"] = 1e39; }),
               "field `rope.theta` = 1e+39 does not fit a 32-bit float");
  // An int field past int's range, and an int64 one past int64's, are refused with the format's range.
  refuses_head(edit_header(good, [](json& j) { j["window"] = int64_t{1} << 32; }),
               "field `window` = 4294967296 is outside 1..511");
  refuses_head(edit_header(good, [](json& j) { j["cand_k"] = -(int64_t{1} << 40); }),
               "field `cand_k` = -1099511627776 is outside 0..512");
  refuses_head(edit_header(good, [](json& j) { j["vocab"] = ~uint64_t{0}; }),
               "field `vocab` = 18446744073709551615 is outside 1..16777216");
  // Control bytes of a name (here a terminal's clear-screen and bell) are shown as \xNN, never sent raw.
  const auto raw_free = [](const Bytes& image, const std::string& message) {
    refuses_head(image, message);
    try {
      (void)HeadFile::from_bytes(image);
    } catch (const Error& e) {
      CHECK(std::string_view(e.what()).find('\x1b') == std::string_view::npos);
    }
  };
  raw_free(edit_header(good, [](json& j) { j["q\x1b[2Jk"] = 1; }), "unknown field `q\\x1b[2Jk`");
  const std::vector<std::byte> extra_bytes(16, std::byte{3});
  raw_free(rebuild(good,
                   [&](auto&, auto& entries) {
                     entries.push_back({"b\x1b[2Jias\x07", DType::F32, {4}, extra_bytes});
                   }),
           "unexpected tensor `b\\x1b[2Jias\\x07`");
}

TEST_CASE("printable: control bytes, C1 controls and bytes that are not UTF-8 as hex escapes, text and UTF-8 kept") {
  CHECK(printable("embed") == "embed");
  CHECK(printable("a\x1b[31mb\n\r\t\x7f") == "a\\x1b[31mb\\x0a\\x0d\\x09\\x7f");
  CHECK(printable("caf\xc3\xa9 \xe2\x82\xac") == "caf\xc3\xa9 \xe2\x82\xac");
  CHECK(printable("\xc2\x9b"
                  "2J") == "\\xc2\\x9b2J");               // U+009B, the C1 CSI
  CHECK(printable("\xff\xc3") == "\\xff\\xc3");           // not UTF-8; a sequence cut short
  CHECK(printable("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");  // overlong
  CHECK(printable(printable("a\x1b"
                            "b")) == printable("a\x1b"
                                               "b"));  // a message wrapping a message
  // fail() shows every string argument so; text the program wrote (Verbatim) keeps its line breaks.
  CHECK_THROWS_WITH_AS(fail("{} {}", std::string("x\x1b"), Verbatim{"l1\nl2"}), "x\\x1b l1\nl2", Error);
}

TEST_CASE("head file: wrong shape, wrong dtype, header limits") {
  const Bytes good = random_head_bytes(preset_header("tiny"), 8);
  refuses_head(rebuild(good,
                       [](auto&, auto& entries) {
                         for (auto& e : entries)
                           if (e.name == "fc") e.shape = {e.shape[1], e.shape[0]};
                       }),
               "tensor `fc` has shape [288, 64]; the header expects [64, 288]");
  refuses_head(rebuild(good,
                       [](auto&, auto& entries) {
                         for (auto& e : entries)
                           if (e.name == "d2t") e.dtype = DType::F32;
                       }),
               "tensor `d2t` is F32; the header expects I32");
  refuses_head(edit_header(good, [](json& j) { j["window"] = 0; }), "window = 0 is outside 1..511");
  refuses_head(edit_header(good, [](json& j) { j["window"] = 512; }), "window = 512 is outside 1..511");
  refuses_head(edit_header(good, [](json& j) { j["head_dim"] = 15; }), "head_dim = 15 must be even");
  refuses_head(edit_header(good, [](json& j) { j["heads"] = 3; }), "heads = 3 is not divisible by kv_heads = 2");
  refuses_head(edit_header(good, [](json& j) { j["draft_vocab"] = 1001; }), "draft_vocab = 1001 exceeds vocab");
  const Bytes two = random_head_bytes(preset_header("tiny-two-stage"), 9);
  refuses_head(edit_header(two, [](json& j) { j["cand_k"] = 0; }), "cand_k = 0 is outside 1..512");
  refuses_head(edit_header(two, [](json& j) { j["cand_k"] = 513; }), "cand_k = 513 is outside 1..512");
  refuses_head(edit_header(two, [](json& j) { j["cand_k"] = 301; }), "cand_k = 301 exceeds draft_vocab = 300");
  refuses_head(edit_header(good, [](json& j) { j["cand_k"] = 4; }), "cand_k = 4 is set but head_type is dense");
}

TEST_CASE("head file: d2t, sha256 records and --verify") {
  const auto h = preset_header("tiny");
  const Bytes good = random_head_bytes(h, 12);
  const auto head = HeadFile::from_bytes(good);
  const TensorView& d2t = head.tensor("d2t");
  const auto d2t_at = size_t(d2t.data - good.data());

  // d2t[i] pointing outside the vocabulary, below and above; the sha256 is left stale on purpose so that
  // the range check (always on) is what refuses it.
  for (int32_t target : {-1, int32_t(h.vocab)}) {
    Bytes bad = good;
    const int32_t off = target - 42;
    std::memcpy(bad.data() + d2t_at + 42 * 4, &off, 4);
    refuses_head(
        bad, fmt::format("d2t[42] = {} maps draft id 42 to target id {}, outside the vocabulary 0..999", off, target));
  }

  // A flipped bit in a weight passes the structural checks and is caught by --verify, by name.
  Bytes flipped = good;
  const TensorView& wv = head.tensor("wv");
  flipped[size_t(wv.data - good.data()) + 100] ^= std::byte{0x10};
  CHECK_NOTHROW(HeadFile::from_bytes(flipped));
  refuses_head(flipped, "tensor `wv`: sha256", {.verify_sha256 = true});

  auto edit_sha = [&](const std::function<void(json&)>& edit) {
    return rebuild(good, [&](auto& md, auto&) {
      json sha = json::parse(md.at("tfe.sha256"));
      edit(sha);
      md["tfe.sha256"] = sha.dump();
    });
  };
  refuses_head(edit_sha([](json& s) { s.erase("embed"); }), "`tfe.sha256` has no entry for tensor `embed`");
  refuses_head(edit_sha([](json& s) { s["ghost"] = std::string(64, 'a'); }), "records tensor `ghost`, which the file");
  refuses_head(edit_sha([](json& s) { s["fc"] = std::string(64, 'A'); }), "`tfe.sha256` of `fc` = \"AAAA");
  refuses_head(edit_sha([](json& s) { s["fc"] = 12; }), "`tfe.sha256` of `fc` = 12 is not 64 lowercase hex");
  refuses_head(edit_sha([](json& s) { s = json::array(); }), "`tfe.sha256` must be a JSON object");
  refuses_head(rebuild(good, [](auto& md, auto&) { md.erase("tfe.sha256"); }), "metadata key `tfe.sha256` missing");
  refuses_head(rebuild(good, [](auto& md, auto&) { md["tfe.extra"] = "1"; }), "unknown metadata key `tfe.extra`");
  refuses_head(rebuild(good, [](auto& md, auto&) { md.erase("tfe.header"); }), "key `tfe.header` missing");
  const Bytes foreign_key = rebuild(good, [](auto& md, auto&) { md["format"] = "pt"; });
  CHECK_NOTHROW(HeadFile::from_bytes(foreign_key));
}

TEST_CASE("head file: an e4m3 NaN code in an FP8 tensor is refused at open, by --verify and by the writer") {
  // find_e4m3_nan on every byte value, at and around its 4 KiB blocks' edges.
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9000}}) {
    for (unsigned code = 0; code < 256; ++code) {
      std::vector<std::byte> bytes(9001, std::byte{0x7e});  // 448, finite
      bytes[at] = std::byte(code);
      CAPTURE(at);
      CAPTURE(code);
      CHECK(find_e4m3_nan(bytes) == ((code & 0x7f) == 0x7f ? int64_t(at) : -1));
    }
  }

  const auto h = fp8_tiny();
  const Bytes good = random_head_bytes(h, 13);
  const auto head = HeadFile::from_bytes(good, {.verify_sha256 = true});
  const auto f8 = std::find_if(head.file().tensors().begin(), head.file().tensors().end(),
                               [](const TensorView& t) { return t.dtype == DType::F8_E4M3; });
  REQUIRE(f8 != head.file().tensors().end());
  const std::string name = f8->name;
  Bytes bad = good;
  bad[size_t(f8->data - good.data()) + 7] = std::byte{0xff};
  // The hash recorded anew, so that what refuses it is the NaN check, not the hash.
  const Bytes resealed = rebuild(bad, [&](auto& md, auto& entries) {
    json sha = json::parse(md.at("tfe.sha256"));
    for (const auto& e : entries)
      if (e.name == name) sha[name] = sha256_hex(e.bytes);
    md["tfe.sha256"] = sha.dump();
  });
  const std::string message =
      fmt::format("tensor `{}`: element 7 is 0xff, an e4m3 NaN code; FP8 weights must be finite", name);
  refuses_head(resealed, message, {});  // the value check at open, on by default
  refuses_head(resealed, message, {.verify_sha256 = true, .check_values = false});
  CHECK_NOTHROW(HeadFile::from_bytes(resealed, {.check_values = false}));

  HeadWriter w(h);
  std::vector<std::byte> bytes(f8->data, f8->data + f8->bytes);
  bytes[3] = std::byte{0x7f};
  CHECK_THROWS_WITH_AS(w.add(name, f8->dtype, f8->shape, std::span<const std::byte>(bytes)),
                       doctest::Contains(fmt::format("head writer: tensor `{}`: element 3 is 0x7f", name).c_str()),
                       Error);
}

TEST_CASE("head file: errors from a file name it") {
  const Bytes good = random_head_bytes(preset_header("tiny"), 13);
  const auto path = write_temp_file(edit_header(good, [](json& j) { j.erase("ffn"); }), "no-ffn.tfe");
  CHECK_THROWS_WITH_AS(HeadFile::open(path), doctest::Contains("no-ffn.tfe: head header: field `ffn` missing"), Error);
}

TEST_CASE("head file: truncated anywhere, refused without a crash") {
  const Bytes good = random_head_bytes(preset_header("tiny-two-stage"), 14);
  const auto head = HeadFile::from_bytes(good);
  const size_t header_end = 8 + head.file().header_bytes().size();
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, header_end / 2, header_end - 1, header_end,
                     header_end + 1, (header_end + good.size()) / 2, good.size() - 1}) {
    CAPTURE(cut);
    const Bytes part(good.begin(), good.begin() + long(cut));
    CHECK_THROWS_AS(HeadFile::from_bytes(part), Error);
    CHECK_THROWS_AS(HeadFile::open(write_temp_file(part, "cut.tfe")), Error);
  }
}

TEST_CASE("head file: random byte corruption is refused or accepted, never a crash") {
  const Bytes good = random_head_bytes(preset_header("tiny"), 15);
  const size_t header_end = 8 + HeadFile::from_bytes(good).file().header_bytes().size();
  const uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    Bytes bad = good;
    for (int k = 0; k < 3; ++k) bad[rng() % header_end] = std::byte(rng());  // the JSON is where the rules are
    try {
      HeadFile::from_bytes(bad);
    } catch (const Error&) {
      ++refused;
    }
  }
  CHECK(refused > 200);
}

TEST_CASE("tfe-plan inspect: header, tensors, parameters, step bytes, and a refused file") {
  const auto h = fp8_tiny();
  const Bytes image = random_head_bytes(h, 16);
  const auto path = write_temp_file(image, "inspect.tfe");
  const auto [rc, out] = run_command(fmt::format("{} inspect {} --verify --rows 2 --bandwidth 2", TFE_PLAN_EXE, path));
  CAPTURE(out);
  CHECK(rc == 0);
  const auto head = HeadFile::from_bytes(image);
  CHECK(out.find(head.header_sha256()) != std::string::npos);
  CHECK(out.find("tensors (22)") != std::string::npos);
  CHECK(out.find("fp8              wq, w_down, lm_head") != std::string::npos);
  CHECK(out.find("lm_head.fp8") != std::string::npos);
  CHECK(out.find("per draft step (2 rows, HBM at 2 TB/s)") != std::string::npos);
  // The bf16 and FP8 step totals, as step_bytes computes them.
  CHECK(out.find(fmt::format("{:>12.3f}", step_bytes(h, 2, false).total() / 1e6)) != std::string::npos);
  CHECK(out.find(fmt::format("{:>12.3f}", step_bytes(h, 2, true).total() / 1e6)) != std::string::npos);
  CHECK(out.find("sha256: all 22 tensors match") != std::string::npos);

  Bytes flipped = image;
  flipped[size_t(head.tensor("embed").data - image.data())] ^= std::byte{1};
  const auto bad = write_temp_file(flipped, "inspect-bad.tfe");
  const auto [rc2, out2] = run_command(fmt::format("{} inspect {} --verify", TFE_PLAN_EXE, bad));
  CHECK(rc2 == 1);
  CHECK(out2.find("inspect-bad.tfe: tensor `embed`: sha256") != std::string::npos);
}

TEST_CASE("tfe-plan inspect: a text file is refused as not a safetensors file") {
  const std::string text = "{\n  \"architectures\": [\"LlamaForCausalLMEagle3\"]\n}\n";
  const auto path = write_temp_file(std::as_bytes(std::span(text)), "config.json");
  const auto [rc, out] = run_command(fmt::format("{} inspect {}", TFE_PLAN_EXE, path));
  CAPTURE(out);
  CHECK(rc == 1);
  CHECK(out.find(fmt::format("tfe-plan: {} is not a safetensors file: header length", path)) != std::string::npos);
  CHECK(out.find("the limit of 100000000 bytes") != std::string::npos);

  const std::string yaml = "hidden: 4096\nheads: 32\n";
  const auto yaml_path = write_temp_file(std::as_bytes(std::span(yaml)), "header.yaml");
  const auto [rc2, out2] = run_command(fmt::format("{} inspect {}", TFE_PLAN_EXE, yaml_path));
  CAPTURE(out2);
  CHECK(rc2 == 1);
  CHECK(out2.find(fmt::format("{} is not a safetensors file", yaml_path)) != std::string::npos);
  CHECK(out2.find("(the file begins with the text \"hidden: \")") != std::string::npos);
}

TEST_CASE("safetensors writer: plain files round trip, bad entries refused before writing") {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> a(12);
  for (auto& x : a) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  std::vector<int64_t> b = {int64_t(rng()), -int64_t(rng()), 7};
  const Bytes a_bytes = tfe::test::to_bytes(a), b_bytes = tfe::test::to_bytes(b);
  const std::vector<SafetensorsEntry> entries = {
      {"b", DType::I64, {3}, b_bytes}, {"a", DType::F32, {3, 2, 2}, a_bytes}, {"empty", DType::BF16, {0}, {}}};
  const auto path = (tfe::test::temp_dir() / "plain.safetensors").string();
  write_safetensors(path, {{"k", "v"}}, entries);
  const auto f = SafetensorsFile::open(path);
  CHECK(f.metadata().at("k") == "v");
  CHECK((f.header_bytes().size() + 8) % 8 == 0);  // the data section starts 8-aligned
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0].name == "b");  // in the order given
  CHECK(std::memcmp(f.find("a")->data, a.data(), a_bytes.size()) == 0);
  CHECK(f.find("a")->shape == std::vector<int64_t>{3, 2, 2});
  CHECK(f.find("b")->as<int64_t>()[1] == b[1]);
  CHECK(serialize_safetensors({{"k", "v"}}, entries).size() == std::filesystem::file_size(path));

  auto refuses = [](const std::vector<SafetensorsEntry>& e, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(serialize_safetensors({}, e), doctest::Contains(message), Error);
  };
  refuses({{"a", DType::F32, {3, 2}, a_bytes}}, "tensor `a` has 48 bytes; F32 3x2 needs 24");
  refuses({{"a", DType::F32, {-12}, a_bytes}}, "dimension -12 is negative");
  refuses({{"a", DType::F32, {12}, a_bytes}, {"a", DType::F32, {12}, a_bytes}}, "tensor `a` is given twice");
  refuses({{"__metadata__", DType::F32, {12}, a_bytes}}, "not allowed (empty or reserved)");
  refuses({{"a", DType::F32, {1, 1, 1, 1, 1, 1, 1, 1, 12}, a_bytes}}, "has rank 9; readers accept at most 8");
  refuses({{"a", DType::F32, {int64_t(1) << 62, 4}, a_bytes}}, "element count overflows int64");
}
