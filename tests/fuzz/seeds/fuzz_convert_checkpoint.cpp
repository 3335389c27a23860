// Seeds for fuzz_convert_checkpoint: tiny EAGLE-3 checkpoints (H 16, 2 query heads of 8 over 1 K/V head,
// F 24, V 64, Vd 32; tests/eagle3_checkpoint.h), written as fuzz_convert_checkpoint reads them (config.json,
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

#include <tfe/head_file.h>
#include "core/numeric.h"
#include "eagle3_checkpoint.h"
#include "seed_corpus.h"

namespace {

using nlohmann::json;
using tfe::DType;

constexpr int64_t H = 16, NH = 2, NKV = 1, HD = 8, F = 24, V = 64, VD = 32;

Eagle3Dims dims(int64_t draft_vocab) { return {H, NH, NKV, HD, F, V, draft_vocab, H}; }

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
      // F16 bit patterns drawn directly (there is no encoder to trust here): norms 1 + m/1024, linears a
      // random sign and mantissa at exponents 2^-10 .. 2^0.
      const uint32_t r = rng();
      bits[i] = center != 0.0f
                    ? static_cast<uint16_t>(0x3c00 | (r & 0x3ff))
                    : static_cast<uint16_t>((r & 0x8000) | ((5 + (r >> 16) % 11) << 10) | ((r >> 20) & 0x3ff));
    }
  }
  return {name, dtype, shape, bytes_of(bits)};
}

std::vector<Tensor> checkpoint(std::mt19937& rng, DType dtype, int64_t draft_vocab, DType d2t_dtype) {
  std::vector<Tensor> t;
  for (const auto& e : eagle3_float_tensors(dims(draft_vocab), /*with_embed=*/true))
    t.push_back(floats(rng, e.name, dtype, e.shape, e.norm ? 1.0f : 0.0f));
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
  write_seed(dir / "bf16-d2t-i64", eagle3_config(dims(VD)), checkpoint(rng, DType::BF16, VD, DType::I64));
  write_seed(dir / "f16-d2t-i32", eagle3_config(dims(VD)), checkpoint(rng, DType::F16, VD, DType::I32));
  write_seed(dir / "f32-d2t-i64", eagle3_config(dims(VD)), checkpoint(rng, DType::F32, VD, DType::I64));
  write_seed(dir / "bf16-full-vocab", eagle3_config(dims(V)), checkpoint(rng, DType::BF16, V, DType::I64));
  auto with_t2d = checkpoint(rng, DType::BF16, VD, DType::I64);
  std::vector<uint8_t> t2d(V, 0);
  with_t2d.push_back({"t2d", DType::BOOL, {V}, bytes_of(t2d)});
  write_seed(dir / "bf16-t2d", eagle3_config(dims(VD)), with_t2d);
  auto with_qk_norm = checkpoint(rng, DType::BF16, VD, DType::I64);
  with_qk_norm.push_back(floats(rng, "midlayer.self_attn.q_norm.weight", DType::BF16, {HD}, 1.0f));
  with_qk_norm.push_back(floats(rng, "midlayer.self_attn.k_norm.weight", DType::BF16, {HD}, 1.0f));
  write_seed(dir / "bf16-qk-norm", eagle3_config(dims(VD)), with_qk_norm);
  return 0;
}
