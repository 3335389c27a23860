#include <sys/stat.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "head/convert.h"
#include "core/error.h"
#include "head/fp8.h"
#include <tfe/head_file.h>
#include "core/numeric.h"
#include "eagle3_checkpoint.h"
#include "test_util.h"

using namespace tfe;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A tiny EAGLE-3 head: H 64, 4 query heads of 16 over 2 K/V heads, F 96, V 500, Vd 120; the target's
// width is H (so the head may share its embedding) or, through target_hidden_size, another.
constexpr int64_t H = 64, NH = 4, NKV = 2, HD = 16, F = 96, V = 500, VD = 120, TARGET_LAYERS = 6;

Eagle3Dims dims(int64_t target_hidden) { return {H, NH, NKV, HD, F, V, VD, target_hidden}; }

json head_config(int64_t target_hidden) { return eagle3_config(dims(target_hidden)); }

json target_config(int64_t hidden = H) {
  return json{{"num_hidden_layers", TARGET_LAYERS}, {"hidden_size", hidden}, {"vocab_size", V}};
}

struct Src {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// A checkpoint in memory: EAGLE-3 names -> tensors, written as one file or as shards with an index.
struct Ckpt {
  json config;
  std::map<std::string, Src> tensors;
};

std::mt19937_64& rng() {
  static std::mt19937_64 r(std::random_device{}());
  return r;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Fresh random values of a floating dtype, spread over several binades (so RNE to bf16 has work to do).
Src random_float(DType dtype, std::vector<int64_t> shape, float center = 0.0f) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const int64_t n = numel(shape);
  Src s{dtype, shape, {}};
  if (dtype == DType::F32) {
    std::vector<float> v(n);
    for (auto& x : v) x = center + normal(rng());
    s.bytes = bytes_of(v);
  } else if (dtype == DType::BF16) {
    std::vector<bf16_bits> v(n);
    for (auto& x : v) x = float_to_bf16(center + normal(rng()));
    s.bytes = bytes_of(v);
  } else {
    // F16 bit patterns: random sign and mantissa, exponent 2^-10 .. 2^1 (plus 1.0 + noise for norms).
    std::vector<uint16_t> v(n);
    for (auto& x : v) {
      const uint64_t r = rng()();
      x = center != 0.0f ? static_cast<uint16_t>(0x3c00 | (r & 0x3ff))
                         : static_cast<uint16_t>((r & 0x8000) | ((5 + (r >> 16) % 11) << 10) | ((r >> 32) & 0x3ff));
    }
    s.bytes = bytes_of(v);
  }
  return s;
}

Src random_d2t(DType dtype) {
  std::vector<int64_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  ids.resize(VD);
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> d2t(VD);
  for (int64_t i = 0; i < VD; ++i) d2t[i] = ids[i] - i;
  if (dtype == DType::I64) return {dtype, {VD}, bytes_of(d2t)};
  return {dtype, {VD}, bytes_of(std::vector<int32_t>(d2t.begin(), d2t.end()))};
}

Ckpt random_ckpt(DType dtype, bool with_embed, DType d2t_dtype = DType::I64, int64_t Ht = H) {
  Ckpt c{head_config(Ht), {}};
  for (const auto& t : eagle3_float_tensors(dims(Ht), with_embed))
    c.tensors[t.name] = random_float(dtype, t.shape, t.norm ? 1.0f : 0.0f);
  c.tensors["d2t"] = random_d2t(d2t_dtype);
  return c;
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

// Safetensors entries, wider elements first (as the safetensors package orders them), then by name.
std::vector<SafetensorsEntry> entries_of(const std::map<std::string, Src>& t) {
  std::vector<SafetensorsEntry> e;
  for (const auto& [name, s] : t) e.push_back({name, s.dtype, s.shape, s.bytes});
  std::stable_sort(e.begin(), e.end(),
                   [](const auto& a, const auto& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  return e;
}

void write_ckpt(const fs::path& dir, const Ckpt& c, int shards = 1) {
  fs::create_directories(dir);
  write_json(dir / "config.json", c.config);
  if (shards == 1) {
    write_safetensors((dir / "model.safetensors").string(), {{"format", "pt"}}, entries_of(c.tensors));
    return;
  }
  std::vector<std::map<std::string, Src>> parts(shards);
  json weight_map = json::object();
  int i = 0;
  for (const auto& [name, s] : c.tensors) {
    const int shard = i++ % shards;
    parts[shard][name] = s;
    weight_map[name] = fmt::format("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
  }
  for (int k = 0; k < shards; ++k)
    write_safetensors((dir / fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, shards)).string(), {},
                      entries_of(parts[k]));
  write_json(dir / "model.safetensors.index.json", json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}});
}

// A target model directory: config.json and its embedding among other tensors, in two shards.
void write_target(const fs::path& dir, DType dtype, Src* embed_out = nullptr) {
  Ckpt t;
  t.config = target_config();
  t.tensors["model.embed_tokens.weight"] = random_float(dtype, {V, H});
  t.tensors["model.norm.weight"] = random_float(dtype, {H}, 1.0f);
  t.tensors["lm_head.weight"] = random_float(dtype, {V, H});
  if (embed_out) *embed_out = t.tensors["model.embed_tokens.weight"];
  write_ckpt(dir, t, 2);
}

struct Scratch {
  fs::path dir;
  Scratch() : dir(fs::temp_directory_path() / fmt::format("tfe-test-convert-{}", rng()())) {
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

// The bf16 a source element rounds to: itself for BF16, RNE of the exact value for F16 and F32.
bf16_bits expected_bf16(const Src& s, int64_t i) {
  if (s.dtype == DType::BF16) {
    bf16_bits b;
    std::memcpy(&b, s.bytes.data() + 2 * i, 2);
    return b;
  }
  if (s.dtype == DType::F16) {
    uint16_t h;
    std::memcpy(&h, s.bytes.data() + 2 * i, 2);
    return float_to_bf16(f16_to_float(h));
  }
  float f;
  std::memcpy(&f, s.bytes.data() + 4 * i, 4);
  return float_to_bf16(f);
}

const std::map<std::string, std::string> kNames = {
    {"fc.weight", "fc"},
    {"embed_tokens.weight", "embed"},
    {"midlayer.input_layernorm.weight", "input_norm"},
    {"midlayer.hidden_norm.weight", "hidden_norm"},
    {"midlayer.self_attn.q_proj.weight", "wq"},
    {"midlayer.self_attn.k_proj.weight", "wk"},
    {"midlayer.self_attn.v_proj.weight", "wv"},
    {"midlayer.self_attn.o_proj.weight", "wo"},
    {"midlayer.post_attention_layernorm.weight", "post_norm"},
    {"midlayer.mlp.gate_proj.weight", "w_gate"},
    {"midlayer.mlp.up_proj.weight", "w_up"},
    {"midlayer.mlp.down_proj.weight", "w_down"},
    {"norm.weight", "final_norm"},
    {"lm_head.weight", "lm_head"},
};

void check_tensor(const HeadFile& f, const std::string& tfe_name, const Src& src) {
  CAPTURE(tfe_name);
  const auto& t = f.tensor(tfe_name);
  REQUIRE(t.dtype == DType::BF16);
  REQUIRE(t.numel() == numel(src.shape));
  const auto got = t.as<bf16_bits>();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < t.numel(); ++i) mismatches += got[i] != expected_bf16(src, i);
  CHECK(mismatches == 0);
}

void check_d2t(const HeadFile& f, const Src& src) {
  const auto got = f.tensor("d2t").as<int32_t>();
  REQUIRE(static_cast<int64_t>(got.size()) == VD);
  for (int64_t i = 0; i < VD; ++i) {
    int64_t want;
    if (src.dtype == DType::I64) {
      std::memcpy(&want, src.bytes.data() + 8 * i, 8);
    } else {
      int32_t w32;
      std::memcpy(&w32, src.bytes.data() + 4 * i, 4);
      want = w32;
    }
    CHECK(got[i] == want);
  }
}

ConvertOptions options(const fs::path& head, std::optional<fs::path> target = std::nullopt) {
  ConvertOptions o;
  o.eagle_dir = head.string();
  if (target) o.target_dir = target->string();
  return o;
}

std::string error_of(const ConvertOptions& o) {
  try {
    convert_eagle3(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("convert: f16_to_float on hand values") {
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  CHECK(f16_to_float(0x7bff) == 65504.0f);
  CHECK(f16_to_float(0x0001) == 0x1p-24f);
  CHECK(f16_to_float(0x03ff) == 1023 * 0x1p-24f);
  CHECK(f16_to_float(0x0400) == 0x1p-14f);
  CHECK(f16_to_float(0x3555) == 0x1.554p-2f);
  CHECK(std::isinf(f16_to_float(0x7c00)));
  CHECK(std::isnan(f16_to_float(0x7e00)));
  CHECK(std::signbit(f16_to_float(0x8000)));
}

TEST_CASE("convert: f16_to_float matches the binary16 definition on all 65536 codes") {
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const float mag = exp == 0x1f ? (man ? NAN : INFINITY)
                      : exp == 0  ? std::ldexp(static_cast<float>(man), -24)
                                  : std::ldexp(static_cast<float>(man + 1024), static_cast<int>(exp) - 25);
    const float want = (h & 0x8000) ? -mag : mag;
    const float got = f16_to_float(static_cast<uint16_t>(h));
    const bool same =
        std::isnan(want) ? std::isnan(got) : (std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want));
    bad += !same;
  }
  CHECK(bad == 0);
}

TEST_CASE("convert: a single-file BF16 checkpoint round-trips bit for bit, with the header from config.json") {
  Scratch s;
  // A head over a wider target (target_hidden_size 80), holding its own embedding.
  const int64_t Ht = 80;
  const auto ck = random_ckpt(DType::BF16, /*with_embed=*/true, DType::I64, Ht);
  write_ckpt(s.dir / "eagle3-tiny", ck);
  fs::create_directories(s.dir / "target");
  write_json(s.dir / "target" / "config.json", target_config(Ht));

  const auto bytes = convert_eagle3(options(s.dir / "eagle3-tiny", s.dir / "target")).serialize();
  const auto f = HeadFile::from_bytes(bytes, {.verify_sha256 = true});
  const auto& h = f.header();
  CHECK(h.name == "eagle3-tiny");
  CHECK(h.taps == std::vector<Tap>{{2, false}, {4, false}, {-1, false}});
  CHECK(h.target_hidden == Ht);
  CHECK(h.hidden == H);
  CHECK(h.heads == NH);
  CHECK(h.kv_heads == NKV);
  CHECK(h.head_dim == HD);
  CHECK(h.ffn == F);
  CHECK(h.vocab == V);
  CHECK(h.draft_vocab == VD);
  CHECK(h.window == kDefaultConvertWindow);
  CHECK(h.rope == Rope{500000.0f, true, 8.0f, 1.0f, 4.0f, 8192});
  CHECK(h.rms_eps == 1e-5f);
  CHECK(h.head_type == HeadType::dense);
  CHECK_FALSE(h.qk_norm);
  CHECK(h.fp8.empty());
  for (const auto& [src, dst] : kNames) check_tensor(f, dst, ck.tensors.at(src));
  check_d2t(f, ck.tensors.at("d2t"));
}

TEST_CASE("convert: sharded F16 with an index and the embedding from the target, RNE-equal to the source") {
  Scratch s;
  auto ck = random_ckpt(DType::F16, /*with_embed=*/false, DType::I32);
  ck.tensors["t2d"] = Src{DType::BOOL, {V}, std::vector<std::byte>(V, std::byte{1})};  // skipped, as the engines do
  write_ckpt(s.dir / "head", ck, 3);
  Src embed;
  write_target(s.dir / "target", DType::F32, &embed);

  auto o = options(s.dir / "head", s.dir / "target");
  o.window = 100;
  o.threads = 2;
  const auto bytes = convert_eagle3(o).serialize();
  const auto f = HeadFile::from_bytes(bytes, {.verify_sha256 = true});
  CHECK(f.header().window == 100);
  for (const auto& [src, dst] : kNames)
    if (dst != "embed") check_tensor(f, dst, ck.tensors.at(src));
  check_tensor(f, "embed", embed);
  check_d2t(f, ck.tensors.at("d2t"));
}

TEST_CASE("convert: q_norm and k_norm make a qk_norm head, and one without the other is refused by name") {
  Scratch s;
  auto ck = random_ckpt(DType::BF16, /*with_embed=*/true);
  ck.tensors["midlayer.self_attn.q_norm.weight"] = random_float(DType::BF16, {HD}, 1.0f);
  ck.tensors["midlayer.self_attn.k_norm.weight"] = random_float(DType::BF16, {HD}, 1.0f);
  write_ckpt(s.dir / "qk", ck);
  const auto bytes = convert_eagle3(options(s.dir / "qk")).serialize();
  const auto f = HeadFile::from_bytes(bytes, {.verify_sha256 = true});
  CHECK(f.header().qk_norm);
  check_tensor(f, "q_norm", ck.tensors.at("midlayer.self_attn.q_norm.weight"));
  check_tensor(f, "k_norm", ck.tensors.at("midlayer.self_attn.k_norm.weight"));
  for (const auto& [src, dst] : kNames) check_tensor(f, dst, ck.tensors.at(src));

  ck.tensors["midlayer.self_attn.q_norm.weight"] = random_float(DType::BF16, {HD + 1}, 1.0f);
  write_ckpt(s.dir / "qk-shape", ck);
  CHECK(error_of(options(s.dir / "qk-shape")).find("`midlayer.self_attn.q_norm.weight` has shape [17]") !=
        std::string::npos);
  ck.tensors.erase("midlayer.self_attn.q_norm.weight");
  write_ckpt(s.dir / "k-only", ck);
  CHECK(error_of(options(s.dir / "k-only"))
            .find("tensor `midlayer.self_attn.k_norm.weight` without `midlayer.self_attn.q_norm.weight`") !=
        std::string::npos);
}

TEST_CASE("convert: F32 sources round to nearest even, and --fp8 adds the forms of every linear in use") {
  Scratch s;
  auto ck = random_ckpt(DType::F32, true);
  write_ckpt(s.dir / "head", ck);
  auto o = options(s.dir / "head");
  o.fp8 = true;
  const auto bytes = convert_eagle3(o).serialize();
  const auto f = HeadFile::from_bytes(bytes);
  for (const auto& [src, dst] : kNames) check_tensor(f, dst, ck.tensors.at(src));
  const auto& h = f.header();
  CHECK(h.fp8.size() == 9);
  for (const auto& l : linears_in_use(h)) {
    CAPTURE(l);
    const auto shape = linear_shape(h, l);
    const auto q = quantize_fp8(f.tensor(l).as<bf16_bits>(), shape[0], shape[1]);
    const auto got = f.tensor(l + ".fp8").as<uint8_t>();
    CHECK(std::equal(got.begin(), got.end(), q.q.begin(), q.q.end()));
  }
}

TEST_CASE("convert: each missing tensor is refused by name") {
  Scratch s;
  const auto full = random_ckpt(DType::BF16, true);
  fs::create_directories(s.dir / "target");
  write_json(s.dir / "target" / "config.json", target_config());
  for (const auto& [name, src] : full.tensors) {
    if (name == "embed_tokens.weight") continue;  // falls back to the target: below
    CAPTURE(name);
    auto ck = full;
    ck.tensors.erase(name);
    const auto dir = s.dir / ("missing-" + name);
    write_ckpt(dir, ck);
    const auto msg = error_of(options(dir, s.dir / "target"));
    CHECK(msg.find(fmt::format("missing tensor `{}`", name)) != std::string::npos);
  }
  auto ck = full;
  ck.tensors.erase("embed_tokens.weight");
  write_ckpt(s.dir / "no-embed", ck);
  // No --target: the head needs it both for the embedding and for nothing else here.
  auto o = options(s.dir / "no-embed");
  CHECK(error_of(o).find("no `embed_tokens.weight`: pass --target") != std::string::npos);
  // A target that does not hold model.embed_tokens.weight either.
  write_ckpt(s.dir / "bare-target", Ckpt{target_config(), {{"lm_head.weight", random_float(DType::BF16, {V, H})}}});
  CHECK(error_of(options(s.dir / "no-embed", s.dir / "bare-target")).find("`model.embed_tokens.weight`") !=
        std::string::npos);
}

TEST_CASE("convert: each mis-shaped tensor is refused by name with found and expected shapes") {
  Scratch s;
  const auto full = random_ckpt(DType::BF16, true);
  for (const auto& [name, src] : full.tensors) {
    CAPTURE(name);
    auto ck = full;
    auto& t = ck.tensors[name];
    // One more row (or element): a wrong leading dimension.
    const int64_t row = numel(t.shape) / t.shape[0] * dtype_size(t.dtype);
    t.shape[0] += 1;
    t.bytes.resize(t.bytes.size() + row);  // zero row: stays inside the vocabulary for d2t
    const auto dir = s.dir / ("shape-" + name);
    write_ckpt(dir, ck);
    const auto msg = error_of(options(dir));
    CHECK(msg.find(fmt::format("tensor `{}` has shape [{}", name, t.shape[0])) != std::string::npos);
    CHECK(msg.find("config.json implies") != std::string::npos);
  }
}

TEST_CASE("convert: missing or unsupported config fields are refused by name") {
  Scratch s;
  const auto ck = random_ckpt(DType::BF16, true);
  for (const char* field :
       {"hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "rms_norm_eps", "rope_theta"}) {
    CAPTURE(field);
    auto c = ck;
    c.config.erase(field);
    const auto dir = s.dir / fmt::format("cfg-{}", field);
    write_ckpt(dir, c);
    CHECK(error_of(options(dir)).find(fmt::format("missing field `{}`", field)) != std::string::npos);
  }
  // A number no 32-bit float holds is refused as written, not read as 0 or infinity.
  auto c = ck;
  c.config["rms_norm_eps"] = 1e-300;
  write_ckpt(s.dir / "eps", c);
  CHECK(error_of(options(s.dir / "eps")).find("field `rms_norm_eps` = 1e-300 does not fit a 32-bit float") !=
        std::string::npos);
  c = ck;
  c.config["rope_scaling"].erase("low_freq_factor");
  write_ckpt(s.dir / "rope-field", c);
  CHECK(error_of(options(s.dir / "rope-field")).find("missing field `rope_scaling.low_freq_factor`") !=
        std::string::npos);
  c = ck;
  c.config["rope_scaling"]["rope_type"] = "yarn";
  write_ckpt(s.dir / "yarn", c);
  CHECK(error_of(options(s.dir / "yarn")).find("\"yarn\" is not supported") != std::string::npos);
  c = ck;
  c.config["hidden_size"] = "64";
  write_ckpt(s.dir / "typed", c);
  CHECK(error_of(options(s.dir / "typed")).find("`hidden_size` = \"64\" is not an integer") != std::string::npos);
  // Layer variants that only the config names: refused, where they would convert and draft wrong tokens.
  c = ck;
  c.config["norm_before_residual"] = false;  // the head's own form, as vLLM names it
  write_ckpt(s.dir / "after-residual", c);
  CHECK(eagle3_header(options(s.dir / "after-residual")).hidden == H);
  c.config["norm_before_residual"] = true;
  write_ckpt(s.dir / "before-residual", c);
  CHECK(error_of(options(s.dir / "before-residual")).find("norm_before_residual = true is not supported") !=
        std::string::npos);
  c.config["norm_before_residual"] = 1;
  write_ckpt(s.dir / "residual-typed", c);
  CHECK(error_of(options(s.dir / "residual-typed")).find("field `norm_before_residual` = 1 is not true or false") !=
        std::string::npos);
  c = ck;
  c.config["norm_before_fc"] = true;
  write_ckpt(s.dir / "before-fc", c);
  CHECK(error_of(options(s.dir / "before-fc")).find("norm_before_fc = true is not supported") != std::string::npos);
  c = ck;
  c.config["eagle_config"]["use_aux_hidden_state"] = false;
  write_ckpt(s.dir / "no-aux", c);
  CHECK(error_of(options(s.dir / "no-aux")).find("eagle_config.use_aux_hidden_state = false is not supported") !=
        std::string::npos);
  c = ck;
  c.config["logit_scale"] = 1.0;
  write_ckpt(s.dir / "unscaled", c);
  CHECK(eagle3_header(options(s.dir / "unscaled")).hidden == H);
  c.config["logit_scale"] = 0.5;
  write_ckpt(s.dir / "scaled", c);
  CHECK(error_of(options(s.dir / "scaled")).find("logit_scale = 0.5 is not supported") != std::string::npos);
  c = ck;
  c.config = json{{"speculators_model_type", "eagle3"}, {"transformer_layer_config", ck.config}};
  write_ckpt(s.dir / "speculators", c);
  CHECK(error_of(options(s.dir / "speculators")).find("field `speculators_model_type`: a speculators-format config") !=
        std::string::npos);
  // No tap layers in the head: the default needs the target's layer count.
  c = ck;
  c.config.erase("eagle_config");
  write_ckpt(s.dir / "no-taps", c);
  CHECK(error_of(options(s.dir / "no-taps")).find("eagle_config.eagle_aux_hidden_state_layer_ids") !=
        std::string::npos);
  fs::create_directories(s.dir / "target32");
  write_json(s.dir / "target32" / "config.json",
             json{{"num_hidden_layers", 32}, {"hidden_size", H}, {"vocab_size", V}});
  CHECK(eagle3_header(options(s.dir / "no-taps", s.dir / "target32")).taps ==
        std::vector<Tap>{{2, false}, {16, false}, {29, false}});
  // A target that disagrees with the head's tap width.
  fs::create_directories(s.dir / "wide-target");
  write_json(s.dir / "wide-target" / "config.json",
             json{{"num_hidden_layers", 32}, {"hidden_size", 4096}, {"vocab_size", V}});
  CHECK(error_of(options(s.dir / "no-taps", s.dir / "wide-target")).find("hidden_size = 4096") != std::string::npos);
}

TEST_CASE("convert: window, names, d2t range, values and file formats are checked") {
  Scratch s;
  const auto ck = random_ckpt(DType::BF16, true);
  write_ckpt(s.dir / "ok", ck);
  for (int w : {0, 512}) {
    auto o = options(s.dir / "ok");
    o.window = w;
    CHECK(error_of(o).find(fmt::format("--window = {} is outside 1..511", w)) != std::string::npos);
  }
  for (const char* extra : {"model.fc.weight", "midlayer.self_attn.q_proj.bias", "layers.0.hidden_norm.weight"}) {
    CAPTURE(extra);
    auto c = ck;
    c.tensors[extra] = random_float(DType::BF16, {H});
    const auto dir = s.dir / fmt::format("extra-{}", extra);
    write_ckpt(dir, c);
    CHECK(error_of(options(dir)).find(fmt::format("tensor `{}` is not part of an EAGLE-3 head", extra)) !=
          std::string::npos);
  }
  {
    auto c = ck;
    auto& d = c.tensors["d2t"];
    const int64_t bad = V;  // draft id 7 -> target 7 + V
    std::memcpy(d.bytes.data() + 8 * 7, &bad, 8);
    write_ckpt(s.dir / "d2t", c);
    CHECK(error_of(options(s.dir / "d2t")).find(fmt::format("d2t[7] = {}", V)) != std::string::npos);
  }
  {
    auto c = ck;
    c.tensors["midlayer.mlp.up_proj.weight"] = random_float(DType::F32, {F, H});
    const float nan = NAN;
    std::memcpy(c.tensors["midlayer.mlp.up_proj.weight"].bytes.data() + 4 * 5, &nan, 4);
    write_ckpt(s.dir / "nan", c);
    const auto msg = error_of(options(s.dir / "nan"));
    CHECK(msg.find("`midlayer.mlp.up_proj.weight`: element 5") != std::string::npos);
  }
  {
    auto c = ck;
    c.tensors["d2t"] = random_float(DType::F32, {VD});
    write_ckpt(s.dir / "d2t-float", c);
    CHECK(error_of(options(s.dir / "d2t-float")).find("F32 is not an integer type") != std::string::npos);
  }
  fs::create_directories(s.dir / "pickled");
  write_json(s.dir / "pickled" / "config.json", head_config(H));
  std::ofstream(s.dir / "pickled" / "pytorch_model.bin") << "not read";
  CHECK(error_of(options(s.dir / "pickled")).find("only safetensors are read") != std::string::npos);
  CHECK(error_of(options(s.dir / "absent")).find("is not a directory") != std::string::npos);
}

TEST_CASE("tfe-plan convert writes a head that opens and verifies, and a bad checkpoint exits non-zero") {
  Scratch s;
  write_ckpt(s.dir / "head", random_ckpt(DType::BF16, false), 2);
  write_target(s.dir / "target", DType::BF16);
  const auto out = s.dir / "head.tfe";
  const auto [rc, text] =
      test::run_command(fmt::format("{} convert {} --target {} --window 64 --fp8 -o {}", TFE_PLAN_EXE,
                                    (s.dir / "head").string(), (s.dir / "target").string(), out.string()));
  CAPTURE(text);
  REQUIRE(rc == 0);
  // The taps as the .tfe names them, beside where they came from: config.json lists 1, 3, 5.
  CHECK(text.find("taps 2, 4, final: the residual stream entering those target layers, from config.json's "
                  "eagle_config.eagle_aux_hidden_state_layer_ids + 1") != std::string::npos);
  const auto f = HeadFile::open(out.string(), {.verify_sha256 = true});
  CHECK(f.header().window == 64);
  CHECK(f.header().fp8.size() == 9);
  CHECK(std::system(fmt::format("{} convert {} -o {} 2>/dev/null", TFE_PLAN_EXE, (s.dir / "head").string(),
                                (s.dir / "x.tfe").string())
                        .c_str()) != 0);
  CHECK(!fs::exists(s.dir / "x.tfe"));
  // -o naming one of the checkpoint's own files (of the head or the target) is refused; both stay as they were.
  for (const fs::path& input : {s.dir / "head" / "config.json", s.dir / "target" / "config.json"}) {
    CAPTURE(input);
    const std::string before = tfe::test::read_text(input);
    const auto [rc, out] =
        tfe::test::run_command(fmt::format("{} convert {} --target {} -o {}", TFE_PLAN_EXE, (s.dir / "head").string(),
                                           (s.dir / "target").string(), input.string()));
    CAPTURE(out);
    CHECK(rc != 0);
    CHECK(out.find("is the command's input") != std::string::npos);
    CHECK(tfe::test::read_text(input) == before);
  }
}

TEST_CASE("convert: vLLM's top-level tap key is read as is, and disagreeing or out-of-range tap layers are refused") {
  Scratch s;
  fs::create_directories(s.dir / "target");
  write_json(s.dir / "target" / "config.json", target_config());
  auto c = random_ckpt(DType::BF16, true);
  c.config["eagle_aux_hidden_state_layer_ids"] = {2, 4, 6};  // agrees with eagle_config's {1, 3, 5} + 1
  write_ckpt(s.dir / "both", c);
  CHECK(eagle3_header(options(s.dir / "both", s.dir / "target")).taps ==
        std::vector<Tap>{{2, false}, {4, false}, {-1, false}});
  // Without the target's layer count, layer 6 stays a layer index: only the target says it is the last.
  CHECK(eagle3_header(options(s.dir / "both")).taps == std::vector<Tap>{{2, false}, {4, false}, {6, false}});
  c.config.erase("eagle_config");
  c.config["eagle_aux_hidden_state_layer_ids"] = {1, 3};
  write_ckpt(s.dir / "vllm", c);
  CHECK(eagle3_header(options(s.dir / "vllm")).taps == std::vector<Tap>{{1, false}, {3, false}});
  CHECK(eagle3_taps_source(options(s.dir / "vllm")).find("eagle_aux_hidden_state_layer_ids, which names them so") !=
        std::string::npos);
  CHECK(eagle3_taps_source(options(s.dir / "both")).find("eagle_aux_hidden_state_layer_ids, which names them so") !=
        std::string::npos);
  // Two taps: fc must then be [H, 2 * Ht]; this checkpoint's fc is for three.
  CHECK(
      error_of(options(s.dir / "vllm")).find("tensor `fc.weight` has shape [64, 192]; config.json implies [64, 128]") !=
      std::string::npos);
  c.config["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {0, 1}}};  // 1, 2 against 1, 3
  write_ckpt(s.dir / "disagree", c);
  CHECK(error_of(options(s.dir / "disagree")).find("name different taps") != std::string::npos);
  c.config.erase("eagle_config");
  c.config["eagle_aux_hidden_state_layer_ids"] = {1, 7};
  write_ckpt(s.dir / "beyond", c);
  CHECK(error_of(options(s.dir / "beyond", s.dir / "target"))
            .find("tap layer 7, beyond the target's num_hidden_layers = 6") != std::string::npos);
  // A layer id at the edge of int64 is refused by its key before SGLang's +1 could overflow.
  c.config.erase("eagle_aux_hidden_state_layer_ids");
  c.config["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {1, std::numeric_limits<int64_t>::max()}}};
  write_ckpt(s.dir / "huge", c);
  CHECK(error_of(options(s.dir / "huge"))
            .find("field `eagle_config.eagle_aux_hidden_state_layer_ids` holds layer 9223372036854775807, outside "
                  "-1048576..1048576") != std::string::npos);
  // Repeated, reordered and float layer ids are refused by the key, naming the entry.
  const std::vector<std::pair<json, std::string>> bad = {
      {json{3, 3, 3}, "= [3,3,3] is not strictly increasing (3 after 3)"},
      {json{5, 3, 1}, "is not strictly increasing (3 after 5)"},
      {json{1, 3.0, 5}, "field `eagle_config.eagle_aux_hidden_state_layer_ids`[1] = 3.0 is not an integer layer id"},
      {json{1, "3", 5}, "[1] = \"3\" is not an integer layer id"},
  };
  for (const auto& [ids, message] : bad) {
    CAPTURE(message);
    c.config["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", ids}};
    write_ckpt(s.dir / "bad-ids", c);
    const std::string error = error_of(options(s.dir / "bad-ids"));
    CAPTURE(error);
    CHECK(error.find(message) != std::string::npos);
  }
}

TEST_CASE("convert: a head over the whole vocabulary may omit d2t (identity), as the engines allow") {
  Scratch s;
  auto c = random_ckpt(DType::BF16, true);
  c.config.erase("draft_vocab_size");
  c.tensors.erase("d2t");
  c.tensors["lm_head.weight"] = random_float(DType::BF16, {V, H});
  write_ckpt(s.dir / "full-vocab", c);
  const auto bytes = convert_eagle3(options(s.dir / "full-vocab")).serialize();
  const auto f = HeadFile::from_bytes(bytes);
  CHECK(f.header().draft_vocab == V);
  const auto d2t = f.tensor("d2t").as<int32_t>();
  CHECK(std::all_of(d2t.begin(), d2t.end(), [](int32_t x) { return x == 0; }));
  check_tensor(f, "lm_head", c.tensors.at("lm_head.weight"));
}

// A checkpoint cannot make convert read a file outside its directory, and a FIFO as config.json never
// blocks: both are refused by name.
TEST_CASE("convert: a shard that leads outside the checkpoint and a FIFO config.json are refused") {
  Scratch s;
  const auto ck = random_ckpt(DType::BF16, /*with_embed=*/true, DType::I64, H);
  write_ckpt(s.dir / "outside", ck);
  fs::rename(s.dir / "outside" / "model.safetensors", s.dir / "elsewhere.safetensors");
  fs::create_symlink(s.dir / "elsewhere.safetensors", s.dir / "outside" / "model.safetensors");
  CHECK(error_of(options(s.dir / "outside")).find("leads outside the checkpoint directory") != std::string::npos);

  write_ckpt(s.dir / "fifo", ck);
  fs::remove(s.dir / "fifo" / "config.json");
  REQUIRE(::mkfifo((s.dir / "fifo" / "config.json").c_str(), 0600) == 0);
  CHECK(error_of(options(s.dir / "fifo")).find("is a FIFO; give a regular file") != std::string::npos);
}

TEST_CASE("convert: a head made for positions past its window is converted, with a warning naming both") {
  Scratch s;
  auto ck = random_ckpt(DType::BF16, true);
  write_ckpt(s.dir / "none", ck);
  CHECK(eagle3_warnings(options(s.dir / "none")).empty());  // no max_position_embeddings: nothing to say
  ck.config["max_position_embeddings"] = 2048;
  write_ckpt(s.dir / "long", ck);
  auto o = options(s.dir / "long");
  o.window = 128;
  CHECK_NOTHROW(convert_eagle3(o));
  const auto w = eagle3_warnings(o);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("max_position_embeddings = 2048, but the window is 128 rows") != std::string::npos);
  CHECK(w[0].find((s.dir / "long" / "config.json").string()) != std::string::npos);
  CHECK(w[0].find("past 129 tokens the head attends to the last 129 only") != std::string::npos);
  ck.config["max_position_embeddings"] = 129;  // the current position and the 128 before it
  write_ckpt(s.dir / "fits", ck);
  auto f = options(s.dir / "fits");
  f.window = 128;
  CHECK(eagle3_warnings(f).empty());
  ck.config["max_position_embeddings"] = 130;
  write_ckpt(s.dir / "one-past", ck);
  auto p = options(s.dir / "one-past");
  p.window = 128;
  CHECK(eagle3_warnings(p).size() == 1);
}
