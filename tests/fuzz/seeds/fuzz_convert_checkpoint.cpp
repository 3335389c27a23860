// Seeds for fuzz_convert_checkpoint: tiny EAGLE-3 checkpoints (H 16, 2 query heads of 8 over 1 K/V head,
// F 24, V 64, Vd 32, taps from SGLang's key), written as fuzz_convert_checkpoint reads them (config.json,
// NUL, model.safetensors): BF16, F16 and F32 weights; d2t as I64 and I32; a head over the whole
// vocabulary without d2t; one with t2d, which convert skips; one with q_norm and k_norm (a qk_norm head).
#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/head_file.h"
#include "plan/numeric.h"
#include "seed_corpus.h"

namespace {

using nlohmann::json;
using tfe::DType;

constexpr int64_t H = 16, NH = 2, NKV = 1, HD = 8, F = 24, V = 64, VD = 32;

json config(int64_t draft_vocab) {
  return json{
      {"architectures", {"LlamaForCausalLMEagle3"}},
      {"hidden_size", H},
      {"intermediate_size", F},
      {"num_attention_heads", NH},
      {"num_key_value_heads", NKV},
      {"head_dim", HD},
      {"num_hidden_layers", 1},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"vocab_size", V},
      {"draft_vocab_size", draft_vocab},
      {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 3, 5}}}},
  };
}

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Values near `center` (0 for linears, 1 for norms) in the dtype asked for.
Tensor floats(std::mt19937& rng, const std::string& name, DType dtype, std::vector<int64_t> shape, float center) {
  std::normal_distribution<float> normal(center, 0.05f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  if (dtype == DType::F32) return {name, dtype, shape, bytes_of(v)};
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::BF16) {
      bits[i] = tfe::float_to_bf16(v[i]);
    } else {
      // binary16 by truncation: these values are normal halves (|x| in 2^-14 .. 2), so sign, rebiased
      // exponent and the top 10 mantissa bits are the encoding.
      const uint32_t u = std::bit_cast<uint32_t>(v[i]);
      const int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
      bits[i] = e <= 0 ? static_cast<uint16_t>((u >> 16) & 0x8000)
                       : static_cast<uint16_t>(((u >> 16) & 0x8000) | (e << 10) | ((u >> 13) & 0x3ff));
    }
  }
  return {name, dtype, shape, bytes_of(bits)};
}

std::vector<Tensor> checkpoint(std::mt19937& rng, DType dtype, int64_t draft_vocab, DType d2t_dtype) {
  std::vector<Tensor> t;
  auto lin = [&](const char* name, int64_t n, int64_t k) { t.push_back(floats(rng, name, dtype, {n, k}, 0.0f)); };
  auto norm = [&](const char* name) { t.push_back(floats(rng, name, dtype, {H}, 1.0f)); };
  lin("fc.weight", H, 3 * H);
  lin("embed_tokens.weight", V, H);
  norm("midlayer.input_layernorm.weight");
  norm("midlayer.hidden_norm.weight");
  lin("midlayer.self_attn.q_proj.weight", NH * HD, 2 * H);
  lin("midlayer.self_attn.k_proj.weight", NKV * HD, 2 * H);
  lin("midlayer.self_attn.v_proj.weight", NKV * HD, 2 * H);
  lin("midlayer.self_attn.o_proj.weight", H, NH * HD);
  norm("midlayer.post_attention_layernorm.weight");
  lin("midlayer.mlp.gate_proj.weight", F, H);
  lin("midlayer.mlp.up_proj.weight", F, H);
  lin("midlayer.mlp.down_proj.weight", H, F);
  norm("norm.weight");
  lin("lm_head.weight", draft_vocab, H);
  if (draft_vocab < V) {
    // d2t[i] = target id of draft id i, less i: sorted distinct target ids.
    std::vector<int64_t> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<size_t>(draft_vocab));
    std::sort(ids.begin(), ids.end());
    std::vector<int64_t> d2t(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) d2t[i] = ids[i] - static_cast<int64_t>(i);
    if (d2t_dtype == DType::I64)
      t.push_back({"d2t", DType::I64, {draft_vocab}, bytes_of(d2t)});
    else
      t.push_back({"d2t", DType::I32, {draft_vocab}, bytes_of(std::vector<int32_t>(d2t.begin(), d2t.end()))});
  }
  return t;
}

void write_seed(const std::filesystem::path& path, const json& cfg, const std::vector<Tensor>& tensors) {
  std::vector<tfe::SafetensorsEntry> entries;
  for (const auto& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes});
  const auto file = tfe::serialize_safetensors({{"format", "pt"}}, entries);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << cfg.dump() << '\0';
  out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
}

}  // namespace

int main(int argc, char** argv) {
  const auto corpus = corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path& dir = *corpus;
  std::mt19937 rng(1);
  write_seed(dir / "bf16-d2t-i64", config(VD), checkpoint(rng, DType::BF16, VD, DType::I64));
  write_seed(dir / "f16-d2t-i32", config(VD), checkpoint(rng, DType::F16, VD, DType::I32));
  write_seed(dir / "f32-d2t-i64", config(VD), checkpoint(rng, DType::F32, VD, DType::I64));
  write_seed(dir / "bf16-full-vocab", config(V), checkpoint(rng, DType::BF16, V, DType::I64));
  auto with_t2d = checkpoint(rng, DType::BF16, VD, DType::I64);
  std::vector<uint8_t> t2d(V, 0);
  with_t2d.push_back({"t2d", DType::BOOL, {V}, bytes_of(t2d)});
  write_seed(dir / "bf16-t2d", config(VD), with_t2d);
  auto with_qk_norm = checkpoint(rng, DType::BF16, VD, DType::I64);
  with_qk_norm.push_back(floats(rng, "midlayer.self_attn.q_norm.weight", DType::BF16, {HD}, 1.0f));
  with_qk_norm.push_back(floats(rng, "midlayer.self_attn.k_norm.weight", DType::BF16, {HD}, 1.0f));
  write_seed(dir / "bf16-qk-norm", config(VD), with_qk_norm);
  return 0;
}
