// Seeds for fuzz_head_file: valid heads of a few shapes (dense, two-stage, with FP8 forms, and a micro
// head whose file is mostly header, where the rules are) and truncations of one of them.
#include <string>

#include "head/presets.h"
#include "hostile_inputs.h"
#include "test_util.h"
#include "seed_corpus.h"

int main(int argc, char** argv) {
  const auto corpus = corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path& dir = *corpus;
  auto save = [&](const std::vector<std::byte>& bytes, const std::string& name) {
    std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };

  tfe::HeadHeader micro = tfe::preset_header("tiny-two-stage");
  micro.name = "micro";
  micro.target_hidden = 6;
  micro.hidden = 8;
  micro.heads = 2;
  micro.kv_heads = 1;
  micro.head_dim = 4;
  micro.ffn = 12;
  micro.vocab = 40;
  micro.draft_vocab = 10;
  micro.cand_k = 3;
  micro.lowrank = 2;
  micro.fp8 = {"wq", "target_head"};
  tfe::HeadHeader micro_dense = tfe::preset_header("tiny");
  micro_dense.name = "micro-dense";
  micro_dense.target_hidden = 4;
  micro_dense.hidden = 6;
  micro_dense.heads = 3;
  micro_dense.kv_heads = 3;
  micro_dense.head_dim = 2;
  micro_dense.ffn = 5;
  micro_dense.vocab = 20;
  micro_dense.draft_vocab = 20;
  tfe::HeadHeader tiny_fp8 = tfe::preset_header("tiny");
  tiny_fp8.fp8 = {"fc", "lm_head"};

  const auto micro_bytes = tfe::test::random_head_bytes(micro, 1);
  save(micro_bytes, "micro.tfe");
  save(tfe::test::random_head_bytes(micro_dense, 2), "micro-dense.tfe");
  save(tfe::test::random_head_bytes(tfe::preset_header("tiny"), 3), "tiny.tfe");
  save(tfe::test::random_head_bytes(tfe::preset_header("tiny-two-stage"), 4), "tiny-two-stage.tfe");
  save(tfe::test::random_head_bytes(tiny_fp8, 5), "tiny-fp8.tfe");
  for (size_t cut : {size_t{8}, size_t{64}, micro_bytes.size() / 4, micro_bytes.size() / 2, micro_bytes.size() - 1})
    save({micro_bytes.begin(), micro_bytes.begin() + static_cast<long>(cut)}, "micro.cut" + std::to_string(cut));
  // Inputs that once took minutes to refuse: 1 MiB of small JSON objects, and deep nesting.
  save(tfe::test::safetensors_image(tfe::test::many_objects_header(size_t{1} << 20)), "many-objects.tfe");
  save(tfe::test::safetensors_image(tfe::test::deep_metadata_header(10000)), "deep-header.tfe");
  return 0;
}
