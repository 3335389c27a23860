// Seeds for fuzz_convert_config: the config.json pairs the engines ship, written as fuzz_convert_config
// reads them (head config, then a NUL byte and the target's config when there is one): a llama3-style
// EAGLE-3 head with SGLang's tap key and llama3 RoPE scaling, with and without its target; vLLM's top-level
// tap key; transformers 5's nested `rope_parameters`; default taps from the target's layer count; a
// multimodal target with `text_config`.
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "eagle3_checkpoint.h"
#include "seed_corpus.h"

namespace {

using nlohmann::json;

json head_config() { return eagle3_config({64, 4, 2, 16, 96, 500, 120, 64}); }

json target_config() { return json{{"num_hidden_layers", 6}, {"hidden_size", 64}, {"vocab_size", 500}}; }

void write_seed(const std::filesystem::path& dir, const std::string& name, const json& head,
                const std::optional<json>& target) {
  std::string text = head.dump();
  if (target) text += '\0' + target->dump();
  std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

int main(int argc, char** argv) {
  const auto corpus = corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path& dir = *corpus;

  write_seed(dir, "sglang-head", head_config(), std::nullopt);
  write_seed(dir, "sglang-head-target", head_config(), target_config());

  json vllm = head_config();
  vllm.erase("eagle_config");
  vllm["eagle_aux_hidden_state_layer_ids"] = {2, 4, 6};
  write_seed(dir, "vllm-head-target", vllm, target_config());

  json nested = head_config();
  nested.erase("rope_theta");
  nested["rope_parameters"] = nested["rope_scaling"];
  nested["rope_parameters"]["rope_theta"] = 500000.0;
  nested.erase("rope_scaling");
  write_seed(dir, "rope-parameters", nested, std::nullopt);

  json default_taps = head_config();
  default_taps.erase("eagle_config");
  default_taps.erase("head_dim");
  default_taps.erase("num_key_value_heads");
  default_taps.erase("draft_vocab_size");
  default_taps["target_hidden_size"] = 128;
  json wide_target = target_config();
  wide_target["hidden_size"] = 128;
  write_seed(dir, "default-taps", default_taps, wide_target);

  write_seed(dir, "text-config", head_config(), json{{"model_type", "llava"}, {"text_config", target_config()}});
  return 0;
}
