// The shape of a tiny EAGLE-3 checkpoint as SGLang, vLLM and the EAGLE repository save it: its config.json
// and the names and shapes of its floating tensors. The convert tests and the convert fuzzers' seeds fill
// the values their own way.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct Eagle3Dims {
  int64_t hidden, heads, kv_heads, head_dim, ffn, vocab, draft_vocab;
  int64_t target_hidden;  // written as target_hidden_size where it differs from hidden
};

// A llama3-style head config: SwiGLU, llama3 RoPE scaling, and SGLang's tap key naming layers 1, 3 and 5
// (taps 2, 4 and 6 in the .tfe convention).
inline nlohmann::json eagle3_config(const Eagle3Dims& d) {
  nlohmann::json j{
      {"architectures", {"LlamaForCausalLMEagle3"}},
      {"hidden_size", d.hidden},
      {"intermediate_size", d.ffn},
      {"num_attention_heads", d.heads},
      {"num_key_value_heads", d.kv_heads},
      {"head_dim", d.head_dim},
      {"num_hidden_layers", 1},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 8.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 8192}}},
      {"vocab_size", d.vocab},
      {"draft_vocab_size", d.draft_vocab},
      {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 3, 5}}}},
  };
  if (d.target_hidden != d.hidden) j["target_hidden_size"] = d.target_hidden;
  return j;
}

struct Eagle3Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool norm;  // a norm weight (values near 1) rather than a linear (near 0)
};

// The floating tensors of a three-tap head, in checkpoint names; the embedding only `with_embed` (a head
// may share the target's).
inline std::vector<Eagle3Tensor> eagle3_float_tensors(const Eagle3Dims& d, bool with_embed) {
  const int64_t H = d.hidden;
  std::vector<Eagle3Tensor> t{{"fc.weight", {H, 3 * d.target_hidden}, false}};
  if (with_embed) t.push_back({"embed_tokens.weight", {d.vocab, H}, false});
  t.insert(t.end(), {
                        {"midlayer.input_layernorm.weight", {H}, true},
                        {"midlayer.hidden_norm.weight", {H}, true},
                        {"midlayer.self_attn.q_proj.weight", {d.heads * d.head_dim, 2 * H}, false},
                        {"midlayer.self_attn.k_proj.weight", {d.kv_heads * d.head_dim, 2 * H}, false},
                        {"midlayer.self_attn.v_proj.weight", {d.kv_heads * d.head_dim, 2 * H}, false},
                        {"midlayer.self_attn.o_proj.weight", {H, d.heads * d.head_dim}, false},
                        {"midlayer.post_attention_layernorm.weight", {H}, true},
                        {"midlayer.mlp.gate_proj.weight", {d.ffn, H}, false},
                        {"midlayer.mlp.up_proj.weight", {d.ffn, H}, false},
                        {"midlayer.mlp.down_proj.weight", {H, d.ffn}, false},
                        {"norm.weight", {H}, true},
                        {"lm_head.weight", {d.draft_vocab, H}, false},
                    });
  return t;
}
