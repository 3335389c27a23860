// The head header: every shape and switch of a draft head (docs/head.md, "Shapes"), and the tensor
// table those shapes imply. One struct is read from a .tfe file, made by presets and by `convert`,
// validated once, and handed to the planner and the CPU reference.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tfe/dtype.h>

namespace tfe {

// Version of the .tfe metadata layout. A reader refuses other versions.
inline constexpr int kHeadFormatVersion = 1;

// Limits of the format (docs/head.md and the kernels' launch shapes).
inline constexpr int kMaxWindow = 511;
inline constexpr int kMaxCandK = 512;
inline constexpr int kMaxTaps = 16;

enum class HeadType : uint8_t { dense, two_stage };
std::string_view head_type_name(HeadType t);

struct Tap {
  int layer = -1;     // target layer index; -1 means `final` (last hidden state before the final norm)
  bool norm = false;  // tap_norm: RMSNorm this tap (weights tap_norm.<i>) before fc
  bool operator==(const Tap&) const = default;
};

// Rotary embedding. llama3 scaling is applied to inv_freq when `llama3` is set.
struct Rope {
  float theta = 500000.0f;
  bool llama3 = false;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_positions = 8192;
  bool operator==(const Rope&) const = default;
};

struct HeadHeader {
  int format_version = kHeadFormatVersion;
  std::string name;  // free text: preset or checkpoint name
  std::vector<Tap> taps;
  int64_t target_hidden = 0;  // Ht
  int64_t hidden = 0;         // H
  int64_t heads = 0;          // nh
  int64_t kv_heads = 0;       // nkv
  int64_t head_dim = 0;       // hd
  int64_t ffn = 0;            // F
  int64_t vocab = 0;          // V
  int64_t draft_vocab = 0;    // Vd
  int window = 0;             // W
  Rope rope;
  float rms_eps = 1e-5f;
  bool qk_norm = false;
  HeadType head_type = HeadType::dense;
  int cand_k = 0;       // two_stage only
  int64_t lowrank = 0;  // two_stage only: r
  // Linears (see kLinears) that carry an FP8 e4m3 form `<name>.fp8` + `<name>.scale`.
  std::vector<std::string> fp8;

  bool has_fp8(std::string_view linear) const;
  bool operator==(const HeadHeader&) const = default;
};

// One tensor the header implies: its name in the file, dtype and shape.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool operator==(const TensorSpec&) const = default;
};

// The linears of a head, in file order. A linear `w` of shape [N, K] may carry an FP8 form:
// `w.fp8` F8_E4M3 [N, K] and `w.scale` F32 [N] (docs/head.md, "FP8").
inline constexpr std::string_view kLinears[] = {"fc",   "wq",     "wk",      "wv",   "wo",   "w_gate",
                                                "w_up", "w_down", "lm_head", "lr_a", "lr_b", "target_head"};
bool is_linear(std::string_view name);
// Linears the head's type uses (dense: lm_head; two_stage: lr_a, lr_b, target_head).
std::vector<std::string> linears_in_use(const HeadHeader& h);

// Checks every field against the format's limits; throws tfe::Error naming the field, value and limit.
void validate(const HeadHeader& h);

// Every tensor a head with this header must hold, bf16 forms first, then FP8 forms in kLinears order.
std::vector<TensorSpec> expected_tensors(const HeadHeader& h);
// The bf16 shape [N, K] of a linear.
std::vector<int64_t> linear_shape(const HeadHeader& h, std::string_view linear);

// Per-draft-step bytes read from HBM: the layer's and vocabulary head's weights (bf16 or FP8 forms),
// the K/V window, and activations of `rows` rows. Used by `inspect`, the planner and the benchmarks.
struct StepBytes {
  int64_t weights = 0;
  int64_t kv = 0;
  int64_t activations = 0;
  int64_t total() const { return weights + kv + activations; }
};
StepBytes step_bytes(const HeadHeader& h, int rows, bool fp8);

}  // namespace tfe
