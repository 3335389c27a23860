// Import of an EAGLE-3 head checkpoint (`tfe-plan convert`), read as SGLang, vLLM and the EAGLE repository
// load it: a Hugging Face directory with config.json and safetensors (one file, several, or shards listed
// by model.safetensors.index.json). Only safetensors are read; pickled checkpoints (pytorch_model.bin)
// are refused, since loading them means running their code.
//
// Tensor names accepted, exactly (no prefix is stripped), and the .tfe tensor each becomes:
//   fc.weight -> fc                                   embed_tokens.weight -> embed
//   midlayer.input_layernorm.weight -> input_norm      midlayer.hidden_norm.weight -> hidden_norm
//   midlayer.self_attn.{q,k,v,o}_proj.weight -> wq, wk, wv, wo
//   midlayer.self_attn.{q,k}_norm.weight -> q_norm, k_norm (both or neither; both make the head's qk_norm)
//   midlayer.post_attention_layernorm.weight -> post_norm
//   midlayer.mlp.{gate,up,down}_proj.weight -> w_gate, w_up, w_down
//   norm.weight -> final_norm                         lm_head.weight -> lm_head
//   d2t (I64 or I32) -> d2t                           t2d (d2t's inverse, a mask) -> skipped, as the engines do
// Any other name (a bias, a `model.` prefix, a second layer) is refused by name: the head would not be
// the one the checkpoint describes. When the head holds no embed_tokens.weight, the target's
// `model.embed_tokens.weight` is read from --target (EAGLE-3 shares the target's embedding).
// Floating tensors may be BF16, F16 or F32; each is rounded once to bf16 (nearest even).
//
// Layer variants with no tensor of their own are refused by their config field, since they would convert
// cleanly and draft wrong tokens or confidences: norm_before_residual = true (vLLM), norm_before_fc or
// fc_norm = true, eagle_config.use_aux_hidden_state = false (ModelOpt: no taps), logit_scale other than 1,
// and the speculators layout (`speculators_model_type`, `transformer_layer_config`), whose default is
// norm_before_residual = true.
//
// Taps: tap layer i is the residual stream entering target layer i (layer L, after the last, is `final`).
// EAGLE-3's default taps are (2, L/2, L-3) in this convention; `eagle_config.eagle_aux_hidden_state_layer_ids`
// (SGLang's and SpecForge's key) names the layer whose output is tapped, so layer id + 1; a top-level
// `eagle_aux_hidden_state_layer_ids` (vLLM's key) is already in this convention.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tfe/head_file.h>
#include <tfe/header.h>

namespace tfe {

// Default attention window of a converted head: the largest the format allows. EAGLE-3 heads are trained
// with full causal attention over the context, so the widest window is the closest to what the head
// learned; a smaller one trades acceptance for K/V bytes and is the user's choice (--window).
inline constexpr int kDefaultConvertWindow = kMaxWindow;

struct ConvertOptions {
  std::string eagle_dir;                  // config.json + safetensors of the EAGLE-3 head
  std::optional<std::string> target_dir;  // the target model: config.json (+ safetensors for the embedding)
  int window = kDefaultConvertWindow;     // 1 .. kMaxWindow
  bool fp8 = false;                       // add FP8 forms of every linear in use
  int threads = 0;                        // 0: one per hardware thread
};

// The header an EAGLE-3 checkpoint's configs describe (config.json of the head and, when given, of the
// target); throws naming the file and the missing or unsupported field. qk_norm is left false: only the
// tensors say it (convert_eagle3 sets it).
HeadHeader eagle3_header(const ConvertOptions& opt);

// What a conversion allows but a deployer should know, one sentence each, naming the field and the numbers:
// a head whose config.json says it was made for positions past the window it is given.
std::vector<std::string> eagle3_warnings(const ConvertOptions& opt);

// Where the header's taps come from, for a reader comparing them with config.json: SGLang's
// `eagle_config.eagle_aux_hidden_state_layer_ids` names the layer whose output is tapped, one below the
// layer whose input the .tfe tap names.
std::string eagle3_taps_source(const ConvertOptions& opt);

// The whole conversion: header, every tensor checked by name, dtype and shape, FP8 forms on request.
HeadWriter convert_eagle3(const ConvertOptions& opt);

// IEEE binary16 to fp32 (exact: every half is a float).
float f16_to_float(uint16_t h);

}  // namespace tfe
