#include "head/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/limits.h"
#include "core/files.h"
#include "head/strict_json.h"
#include "head/fp8.h"
#include "core/numeric.h"

namespace tfe {

namespace fs = std::filesystem;
using nlohmann::json;

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  // Normal: rebias the exponent (15 -> 127) and widen the mantissa; inf and NaN keep an all-ones exponent.
  const uint32_t e32 = exp == 0x1f ? 0xffu : exp + (127 - 15);
  return std::bit_cast<float>(sign | e32 << 23 | man << 13);
}

namespace {

// ---------------------------------------------------------------------------------------------------
// config.json

// A config or index file: a regular file (never a FIFO that would block), of a size no config reaches.
constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;
constexpr int kMaxConfigDepth = 32;

json read_json(const fs::path& path) {
  const std::string text = files::read_regular(path, "config", kMaxConfigBytes);
  json j = parse_strict_json(text, path.string(), kMaxConfigDepth);
  if (!j.is_object()) fail("{}: the top level is a JSON {}, not an object", path.string(), j.type_name());
  return j;
}

// A checkpoint file must lie inside the checkpoint directory: a symlink that leads out of it is refused,
// so that a checkpoint cannot make convert read an arbitrary file.
void check_inside(const fs::path& dir, const fs::path& file) {
  std::error_code ec;
  const fs::path real_dir = fs::weakly_canonical(dir, ec);
  const fs::path real_file = fs::weakly_canonical(file, ec);
  if (ec) fail("{}: cannot resolve: {}", file.string(), ec.message());
  const auto [d, f] = std::mismatch(real_dir.begin(), real_dir.end(), real_file.begin(), real_file.end());
  if (d != real_dir.end())
    fail("{} leads outside the checkpoint directory {} (to {}); copy the file in instead of linking it", file.string(),
         dir.string(), real_file.string());
}

// One config file and the fields read from it; every message names the file and the field.
struct Config {
  fs::path path;
  json j;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("{}: missing field `{}`", path.string(), key);
    return integer_of(j.at(key), key);
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return has(key) ? integer_of(j.at(key), key) : fallback;
  }
  int64_t integer_of(const json& v, std::string_view key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 0x1p53)
      return static_cast<int64_t>(v.get<double>());
    fail("{}: field `{}` = {} is not an integer", path.string(), key, v.dump());
  }
  // A boolean field; `fallback` where it is absent.
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j.at(key);
    if (!v.is_boolean()) fail("{}: field `{}` = {} is not true or false", path.string(), key, v.dump());
    return v.get<bool>();
  }
  double number(const json& obj, const char* key, std::string_view where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) fail("{}: missing field `{}{}`", path.string(), where, key);
    const json& v = obj.at(key);
    if (!v.is_number()) fail("{}: field `{}{}` = {} is not a number", path.string(), where, key, v.dump());
    return v.get<double>();
  }
  // A number the header keeps as a 32-bit float: refused where no float stands for it (1e-300 is not 0).
  float float32(const json& obj, const char* key, std::string_view where) const {
    const double d = number(obj, key, where);
    const std::optional<float> f = float32_of(d);
    if (!f) fail("{}: field `{}{}` = {} does not fit a 32-bit float ({})", path.string(), where, key, d, kFloat32Range);
    return *f;
  }
};

// A multimodal target keeps its language model's fields under `text_config`.
Config text_config(Config c) {
  if (!c.has("num_hidden_layers") && c.j.contains("text_config") && c.j["text_config"].is_object())
    return {c.path, c.j["text_config"]};
  return c;
}

Rope read_rope(const Config& c) {
  Rope r;
  // transformers >= 5 nests theta and scaling in `rope_parameters`; earlier versions keep them at the top.
  const bool nested = !c.has("rope_theta") && c.j.contains("rope_parameters") && c.j["rope_parameters"].is_object();
  const json& params = nested ? c.j["rope_parameters"] : c.j;
  const std::string where = nested ? "rope_parameters." : "";
  r.theta = c.float32(params, "rope_theta", where);
  const json* scaling = nested ? &params : (c.has("rope_scaling") ? &c.j["rope_scaling"] : nullptr);
  if (!scaling) return r;
  const std::string swhere = nested ? where : "rope_scaling.";
  if (!scaling->is_object()) fail("{}: field `rope_scaling` = {} is not an object", c.path.string(), scaling->dump());
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (scaling->contains(key) && (*scaling)[key].is_string()) {
      type = (*scaling)[key].get<std::string>();
      break;
    }
  if (type == "default") return r;
  if (type != "llama3")
    fail("{}: `{}rope_type` = \"{}\" is not supported (supported: default, llama3)", c.path.string(), swhere, type);
  r.llama3 = true;
  r.factor = c.float32(*scaling, "factor", swhere);
  r.low_freq_factor = c.float32(*scaling, "low_freq_factor", swhere);
  r.high_freq_factor = c.float32(*scaling, "high_freq_factor", swhere);
  const double orig = c.number(*scaling, "original_max_position_embeddings", swhere);
  if (orig != std::nearbyint(orig) || orig < 1 || orig > 1e9)
    fail("{}: `{}original_max_position_embeddings` = {} is not a positive integer", c.path.string(), swhere, orig);
  r.original_max_positions = static_cast<int>(orig);
  return r;
}

// No target has this many layers; the bound keeps a tap index inside an int.
constexpr int64_t kMaxLayer = int64_t{1} << 20;

// A list of layer ids: JSON integers (a float such as 1.0 is refused: the engines index layers by it),
// strictly increasing (a repeated or reordered layer is a mistake, not a head), each within +-kMaxLayer so
// that shifting it to the .tfe convention cannot overflow (the taps' own rules, which name the key, come
// after).
std::vector<int64_t> layer_ids(const Config& c, const json& v, std::string_view key) {
  if (!v.is_array() || v.empty()) fail("{}: field `{}` = {} is not a non-empty list", c.path.string(), key, v.dump());
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      fail("{}: field `{}`[{}] = {} is not an integer layer id", c.path.string(), key, i, v[i].dump());
    const int64_t id = v[i].get<int64_t>();
    if (id < -kMaxLayer || id > kMaxLayer)
      fail("{}: field `{}` holds layer {}, outside -{}..{}", c.path.string(), key, id, kMaxLayer, kMaxLayer);
    if (!out.empty() && id <= out.back())
      fail("{}: field `{}` = {} is not strictly increasing ({} after {}); each tap names a different layer, in order",
           c.path.string(), key, v.dump(), id, out.back());
    out.push_back(id);
  }
  return out;
}

// Taps in the .tfe convention: the residual stream entering target layer i; i == L (after the last
// layer, before the final norm) is `final`.
std::vector<Tap> read_taps(const Config& head, const std::optional<Config>& target) {
  std::optional<std::vector<int64_t>> taps;
  std::string source;
  if (head.j.contains("eagle_config") && head.j["eagle_config"].is_object() &&
      head.j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    // SGLang's and SpecForge's key names the layer whose output is tapped: the stream entering the next.
    taps = layer_ids(head, head.j["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
                     "eagle_config.eagle_aux_hidden_state_layer_ids");
    for (auto& t : *taps) t += 1;
    source = "eagle_config.eagle_aux_hidden_state_layer_ids";
  }
  if (head.has("eagle_aux_hidden_state_layer_ids")) {
    // vLLM's key is already in this convention.
    auto top = layer_ids(head, head.j["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids");
    if (taps && *taps != top)
      fail(
          "{}: eagle_config.eagle_aux_hidden_state_layer_ids (+1, as SGLang reads it) = [{}] and "
          "eagle_aux_hidden_state_layer_ids = [{}] name different taps",
          head.path.string(), fmt::join(*taps, ", "), fmt::join(top, ", "));
    taps = std::move(top);
    source = "eagle_aux_hidden_state_layer_ids";
  }
  std::optional<int64_t> layers;
  if (target) layers = target->integer("num_hidden_layers");
  if (!taps) {
    if (!layers)
      fail(
          "{}: no field `eagle_config.eagle_aux_hidden_state_layer_ids`; EAGLE-3's default taps (2, L/2, L-3) need "
          "the target's num_hidden_layers L: pass --target",
          head.path.string());
    if (*layers < 4)
      fail("{}: num_hidden_layers = {} is too few for EAGLE-3's default taps (2, L/2, L-3)", target->path.string(),
           *layers);
    taps = std::vector<int64_t>{2, *layers / 2, *layers - 3};
    source = "EAGLE-3's default (2, L/2, L-3)";
  }
  if (taps->size() > static_cast<size_t>(kMaxTaps))
    fail("{}: {} names {} taps; at most {} are supported", head.path.string(), source, taps->size(), kMaxTaps);
  std::vector<Tap> out;
  for (int64_t t : *taps) {
    if (t < 0) fail("{}: {} gives tap layer {}, which is negative", head.path.string(), source, t);
    if (layers && t > *layers)
      fail("{}: {} gives tap layer {}, beyond the target's num_hidden_layers = {}", head.path.string(), source, t,
           *layers);
    if (t > kMaxLayer) fail("{}: {} gives tap layer {}, beyond {}", head.path.string(), source, t, kMaxLayer);
    out.push_back({layers && t == *layers ? -1 : static_cast<int>(t), false});
  }
  return out;
}

// EAGLE-3 layers that differ from the head's math without a tensor of their own, so that only the config
// tells them apart. The head adds g itself (not hidden_norm(g)) to the attention output, and feeds the taps
// to fc as they are (or each through its own tap_norm); a checkpoint trained otherwise would convert
// cleanly and draft wrong tokens, so it is refused.
void refuse_other_layer_variants(const Config& c) {
  for (const char* key : {"speculators_model_type", "transformer_layer_config"})
    if (c.has(key))
      fail(
          "{}: field `{}`: a speculators-format config, whose eagle3 layer adds hidden_norm(g) to the attention "
          "output unless norm_before_residual is false; only the Hugging Face layout (SGLang, vLLM, the EAGLE "
          "repository: hidden_size and the rest at the top level) is read",
          c.path.string(), key);
  if (c.flag_or("norm_before_residual", false))
    fail(
        "{}: norm_before_residual = true is not supported: this head adds g, not hidden_norm(g), to the attention "
        "output",
        c.path.string());
  for (const char* key : {"norm_before_fc", "fc_norm"})
    if (c.flag_or(key, false))
      fail(
          "{}: {} = true is not supported: this head feeds the taps to fc as they are, or each through its own "
          "tap_norm, not through one norm over their concatenation",
          c.path.string(), key);
  // ModelOpt's form of an EAGLE head that reads the target's last hidden state alone, not taps into fc.
  if (c.j.contains("eagle_config") && c.j["eagle_config"].is_object()) {
    const Config eagle{c.path, c.j["eagle_config"]};
    if (!eagle.flag_or("use_aux_hidden_state", true))
      fail(
          "{}: eagle_config.use_aux_hidden_state = false is not supported: this head reads taps through fc, not the "
          "target's last hidden state alone",
          c.path.string());
  }
  // vLLM scales the logits by it; the head's confidence is the softmax of the unscaled logits.
  if (c.has("logit_scale") && c.number(c.j, "logit_scale", "") != 1.0)
    fail("{}: logit_scale = {} is not supported: this head's logits are unscaled (1)", c.path.string(),
         c.j.at("logit_scale").dump());
}

HeadHeader header_from_configs(const Config& c, const std::optional<Config>& target, const std::string& name,
                               int window) {
  refuse_other_layer_variants(c);
  if (c.has("hidden_act") && c.j.at("hidden_act") != "silu")
    fail("{}: hidden_act = {} is not supported (the head's MLP is SwiGLU: silu)", c.path.string(),
         c.j.at("hidden_act").dump());
  if (c.has("num_hidden_layers") && c.integer("num_hidden_layers") != 1)
    fail("{}: num_hidden_layers = {}; an EAGLE-3 head has exactly one layer", c.path.string(),
         c.integer("num_hidden_layers"));
  HeadHeader h;
  h.name = name;
  h.hidden = c.integer("hidden_size");
  h.ffn = c.integer("intermediate_size");
  h.heads = c.integer("num_attention_heads");
  // As Hugging Face's Llama config does: no num_key_value_heads means one K/V head per query head.
  h.kv_heads = c.integer_or("num_key_value_heads", h.heads);
  if (c.has("head_dim")) {
    h.head_dim = c.integer("head_dim");
  } else {
    if (h.heads < 1 || h.hidden % h.heads != 0)
      fail("{}: no field `head_dim`, and hidden_size = {} is not a multiple of num_attention_heads = {}",
           c.path.string(), h.hidden, h.heads);
    h.head_dim = h.hidden / h.heads;
  }
  h.vocab = c.integer("vocab_size");
  h.draft_vocab = c.integer_or("draft_vocab_size", h.vocab);
  h.target_hidden = c.integer_or("target_hidden_size", h.hidden);
  h.rms_eps = c.float32(c.j, "rms_norm_eps", "");
  h.rope = read_rope(c);
  h.taps = read_taps(c, target);
  if (window < 1 || window > kMaxWindow) fail("--window = {} is outside 1..{}", window, kMaxWindow);
  h.window = window;
  h.qk_norm = false;
  h.head_type = HeadType::dense;

  if (target) {
    const Config& t = *target;
    if (t.integer("hidden_size") != h.target_hidden)
      fail("{}: hidden_size = {}, but the head's {} = {} (the width of one tap row)", t.path.string(),
           t.integer("hidden_size"), c.has("target_hidden_size") ? "target_hidden_size" : "hidden_size",
           h.target_hidden);
    if (t.integer("vocab_size") != h.vocab)
      fail("{}: vocab_size = {}, but the head's vocab_size = {}", t.path.string(), t.integer("vocab_size"), h.vocab);
  }
  try {
    validate(h);
  } catch (const Error& e) {
    fail("{}: {}", c.path.string(), e.what());
  }
  return h;
}

std::string head_name(const fs::path& dir) {
  auto p = dir;
  if (!p.has_filename()) p = p.parent_path();  // a trailing slash
  return fs::absolute(p).lexically_normal().filename().string();
}

// ---------------------------------------------------------------------------------------------------
// Safetensors checkpoints: one file, several, or shards named by model.safetensors.index.json.

class Checkpoint {
 public:
  static Checkpoint open(const fs::path& dir) {
    Checkpoint ck;
    ck.dir_ = dir;
    if (!fs::is_directory(dir)) fail("{} is not a directory", dir.string());
    const auto index_path = dir / "model.safetensors.index.json";
    std::vector<fs::path> files;
    std::optional<json> weight_map;
    if (fs::exists(index_path)) {
      const json index = read_json(index_path);
      if (!index.contains("weight_map") || !index["weight_map"].is_object())
        fail("{}: missing object `weight_map`", index_path.string());
      weight_map = index["weight_map"];
      std::set<std::string> names;
      for (const auto& [tensor, file] : weight_map->items()) {
        if (!file.is_string()) fail("{}: weight_map[\"{}\"] is not a file name", index_path.string(), tensor);
        const auto f = file.get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "..")
          fail("{}: weight_map[\"{}\"] = \"{}\" is not a file of this directory", index_path.string(), tensor, f);
        names.insert(f);
      }
      for (const auto& n : names) files.push_back(dir / n);
    } else {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
      std::sort(files.begin(), files.end());
    }
    if (files.empty()) {
      for (const char* pickled : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth"})
        if (fs::exists(dir / pickled))
          fail(
              "{} holds {} but no *.safetensors: only safetensors are read (a pickled checkpoint runs code when "
              "loaded); save it with safetensors first",
              dir.string(), pickled);
      fail("{} holds no *.safetensors file", dir.string());
    }
    for (const auto& f : files) {
      check_inside(dir, f);
      ck.files_.push_back(SafetensorsFile::open(f.string()));
      const size_t fi = ck.files_.size() - 1;
      for (const auto& t : ck.files_.back().tensors()) {
        auto [it, fresh] = ck.where_.emplace(t.name, fi);
        if (!fresh)
          fail("tensor `{}` is in both {} and {}", t.name, ck.files_[it->second].path(), ck.files_[fi].path());
      }
    }
    if (weight_map)
      for (const auto& [tensor, file] : weight_map->items()) {
        auto it = ck.where_.find(tensor);
        if (it == ck.where_.end() || fs::path(ck.files_[it->second].path()).filename() != file.get<std::string>())
          fail("{}: weight_map puts `{}` in {}, which does not hold it", index_path.string(), tensor,
               file.get<std::string>());
      }
    return ck;
  }

  const TensorView* find(std::string_view name) const {
    auto it = where_.find(std::string(name));
    return it == where_.end() ? nullptr : files_[it->second].find(name);
  }
  std::string file_of(std::string_view name) const {
    auto it = where_.find(std::string(name));
    return it == where_.end() ? dir_.string() : files_[it->second].path();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : where_) n.push_back(k);
    return n;
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

// EAGLE-3 checkpoint name -> .tfe name (convert.h lists them).
const std::vector<std::pair<std::string, std::string>>& eagle3_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"fc.weight", "fc"},
      {"embed_tokens.weight", "embed"},
      {"midlayer.input_layernorm.weight", "input_norm"},
      {"midlayer.hidden_norm.weight", "hidden_norm"},
      {"midlayer.self_attn.q_proj.weight", "wq"},
      {"midlayer.self_attn.k_proj.weight", "wk"},
      {"midlayer.self_attn.v_proj.weight", "wv"},
      {"midlayer.self_attn.o_proj.weight", "wo"},
      {"midlayer.self_attn.q_norm.weight", "q_norm"},
      {"midlayer.self_attn.k_norm.weight", "k_norm"},
      {"midlayer.post_attention_layernorm.weight", "post_norm"},
      {"midlayer.mlp.gate_proj.weight", "w_gate"},
      {"midlayer.mlp.up_proj.weight", "w_up"},
      {"midlayer.mlp.down_proj.weight", "w_down"},
      {"norm.weight", "final_norm"},
      {"lm_head.weight", "lm_head"},
      {"d2t", "d2t"},
  };
  return names;
}
constexpr std::string_view kSkipped = "t2d";
constexpr std::string_view kTargetEmbed = "model.embed_tokens.weight";
constexpr std::string_view kQNorm = "midlayer.self_attn.q_norm.weight";
constexpr std::string_view kKNorm = "midlayer.self_attn.k_norm.weight";

// Element i of a checkpoint tensor. A checkpoint written by another tool need not align its tensors to their
// element size (the .tfe writer does), so elements are copied out rather than read in place.
template <typename T>
T element(const TensorView& t, int64_t i) {
  T v;
  std::memcpy(&v, t.data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Rounds a BF16 / F16 / F32 tensor to bf16 (nearest even, once) and refuses a non-finite value.
std::vector<std::byte> to_bf16(const TensorView& t, const std::string& where) {
  const int64_t n = t.numel();
  std::vector<std::byte> out(static_cast<size_t>(n) * 2);
  auto* dst = reinterpret_cast<bf16_bits*>(out.data());
  auto convert = [&](auto&& value_at) {
    for (int64_t i = 0; i < n; ++i) {
      const float f = value_at(i);
      const bf16_bits b = float_to_bf16(f);
      if (!std::isfinite(bf16_to_float(b)))
        fail("{}: element {} = {} is {} in bf16", where, i, f, std::isfinite(f) ? "out of range" : "not finite");
      dst[i] = b;
    }
  };
  switch (t.dtype) {
    case DType::BF16:
      convert([&](int64_t i) { return bf16_to_float(element<bf16_bits>(t, i)); });
      break;
    case DType::F16:
      convert([&](int64_t i) { return f16_to_float(element<uint16_t>(t, i)); });
      break;
    case DType::F32:
      convert([&](int64_t i) { return element<float>(t, i); });
      break;
    default:
      fail("{}: dtype {} is not a floating type (BF16, F16 or F32)", where, dtype_name(t.dtype));
  }
  return out;
}

// d2t (I64 or I32) -> int32, each target id = draft id + d2t[id] inside the vocabulary.
std::vector<std::byte> to_d2t(const TensorView& t, int64_t vocab, const std::string& where) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  auto check = [&](int64_t i, int64_t off) {
    // |off| <= vocab first, so that i + off cannot overflow.
    if (off < -vocab || off > vocab || i + off < 0 || i + off >= vocab)
      fail("{}: d2t[{}] = {} maps draft id {} outside the vocabulary 0..{}", where, i, off, i, vocab - 1);
    out[i] = static_cast<int32_t>(off);  // |off| < vocab <= 2^24: fits
  };
  const int64_t n = t.numel();
  if (t.dtype == DType::I64) {
    for (int64_t i = 0; i < n; ++i) check(i, element<int64_t>(t, i));
  } else if (t.dtype == DType::I32) {
    for (int64_t i = 0; i < n; ++i) check(i, element<int32_t>(t, i));
  } else {
    fail("{}: dtype {} is not an integer type (I64 or I32)", where, dtype_name(t.dtype));
  }
  std::vector<std::byte> bytes(out.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  return bytes;
}

}  // namespace

HeadHeader eagle3_header(const ConvertOptions& opt) {
  const fs::path dir(opt.eagle_dir);
  if (!fs::is_directory(dir)) fail("{} is not a directory", dir.string());
  const Config head{dir / "config.json", read_json(dir / "config.json")};
  std::optional<Config> target;
  if (opt.target_dir) {
    const fs::path tdir(*opt.target_dir);
    if (!fs::is_directory(tdir)) fail("--target {} is not a directory", tdir.string());
    target = text_config({tdir / "config.json", read_json(tdir / "config.json")});
  }
  return header_from_configs(head, target, head_name(dir), opt.window);
}

std::vector<std::string> eagle3_warnings(const ConvertOptions& opt) {
  const fs::path dir(opt.eagle_dir);
  const Config head{dir / "config.json", read_json(dir / "config.json")};
  std::vector<std::string> out;
  // EAGLE-3's training writes the sequence length it trained on here. A window of W rows attends to the
  // current position and the W before it; past W + 1 tokens the head sees only the last W + 1 of a context
  // it was trained to see whole.
  if (head.has("max_position_embeddings")) {
    const int64_t trained = head.integer("max_position_embeddings");
    const int64_t seen = int64_t{opt.window} + 1;
    if (trained > seen)
      out.push_back(fmt::format(
          "{}: max_position_embeddings = {}, but the window is {} rows: past {} tokens the head attends to the "
          "last {} only, fewer than the context its config names, and acceptance may drop there (the window is "
          "at most {})",
          head.path.string(), trained, opt.window, seen, seen, kMaxWindow));
  }
  return out;
}

std::string eagle3_taps_source(const ConvertOptions& opt) {
  const fs::path dir(opt.eagle_dir);
  const Config head{dir / "config.json", read_json(dir / "config.json")};
  // read_taps's order: the top-level key wins (and must agree with eagle_config's).
  if (head.has("eagle_aux_hidden_state_layer_ids"))
    return "config.json's eagle_aux_hidden_state_layer_ids, which names them so (vLLM's convention)";
  if (head.j.contains("eagle_config") && head.j["eagle_config"].is_object() &&
      head.j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"))
    return "config.json's eagle_config.eagle_aux_hidden_state_layer_ids + 1: that field names the layer whose "
           "output is tapped, the one before (SGLang's convention)";
  return "EAGLE-3's default 2, L/2, L-3 for the target's num_hidden_layers L";
}

HeadWriter convert_eagle3(const ConvertOptions& opt) {
  check_threads(opt.threads, "convert");
  HeadHeader h = eagle3_header(opt);
  const Checkpoint ck = Checkpoint::open(opt.eagle_dir);
  // A head that norms each q and k head (Qwen3-style, as some SpecForge heads do) says so by its tensors
  // alone: the head's qk_norm.
  const bool q_norm = ck.find(kQNorm) != nullptr, k_norm = ck.find(kKNorm) != nullptr;
  if (q_norm != k_norm)
    fail("{}: tensor `{}` without `{}`: qk_norm norms both q and k", ck.file_of(q_norm ? kQNorm : kKNorm),
         q_norm ? kQNorm : kKNorm, q_norm ? kKNorm : kQNorm);
  h.qk_norm = q_norm;
  if (opt.fp8) mark_fp8_forms(h);

  std::set<std::string> accepted{std::string(kSkipped)};
  for (const auto& [src, dst] : eagle3_names()) accepted.insert(src);
  for (const auto& name : ck.names())
    if (!accepted.count(name)) {
      std::string list;
      for (const auto& [src, dst] : eagle3_names()) list += (list.empty() ? "" : ", ") + src;
      fail("{}: tensor `{}` is not part of an EAGLE-3 head (accepted: {}, and t2d)", ck.file_of(name), name, list);
    }

  const auto expected = expected_tensors(h);
  std::optional<Checkpoint> target;
  std::vector<HeadTensor> tensors;
  for (const auto& [src, dst] : eagle3_names()) {
    // The header decides which tensors the head has (q_norm and k_norm only with qk_norm).
    const auto spec_it = std::find_if(expected.begin(), expected.end(),
                                      [&tfe_name = dst](const TensorSpec& s) { return s.name == tfe_name; });
    if (spec_it == expected.end()) continue;
    const TensorSpec& spec = *spec_it;
    const Checkpoint* from = &ck;
    std::string name = src;
    const TensorView* t = ck.find(src);
    if (!t && dst == "embed") {
      // EAGLE-3 shares the target's input embedding; most heads do not store a copy.
      if (!opt.target_dir)
        fail("{} holds no `embed_tokens.weight`: pass --target, the target model whose `{}` the head shares",
             opt.eagle_dir, kTargetEmbed);
      target = Checkpoint::open(*opt.target_dir);
      from = &*target;
      name = kTargetEmbed;
      t = target->find(name);
      if (!t)
        fail("{} holds no `embed_tokens.weight`, and --target {} holds no `{}` either", opt.eagle_dir, *opt.target_dir,
             kTargetEmbed);
    }
    if (!t && dst == "d2t" && h.draft_vocab == h.vocab) {
      // A head over the whole vocabulary: draft id = target id, as the engines assume without d2t.
      tensors.push_back({dst, DType::I32, spec.shape, std::vector<std::byte>(h.draft_vocab * sizeof(int32_t))});
      continue;
    }
    if (!t)
      fail("{}: missing tensor `{}` (the head's {}, expected shape {})", opt.eagle_dir, src, dst,
           shape_str(spec.shape));
    const std::string where = fmt::format("{}: tensor `{}`", from->file_of(name), name);
    if (t->shape != spec.shape)
      fail("{} has shape {}; config.json implies {} for the head's {}", where, shape_str(t->shape),
           shape_str(spec.shape), dst);
    auto bytes = dst == "d2t" ? to_d2t(*t, h.vocab, where) : to_bf16(*t, where);
    tensors.push_back({dst, spec.dtype, spec.shape, std::move(bytes)});
  }
  return assemble_head(h, std::move(tensors), opt.threads);
}

}  // namespace tfe
