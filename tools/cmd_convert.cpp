// tfe-plan convert: an EAGLE-3 head checkpoint (Hugging Face directory, safetensors) to a .tfe head.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tools/commands.h"
#include "core/files.h"
#include "head/convert.h"

namespace tfe::cli {

namespace {

struct ConvertArgs {
  ConvertOptions opt;
  std::string target;
  std::string out;
};

}  // namespace

void add_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  auto* cmd = app.add_subcommand("convert", "import an EAGLE-3 head checkpoint (config.json + safetensors)");
  cmd->add_option("EAGLE3_DIR", args->opt.eagle_dir, "directory of the EAGLE-3 head")->required();
  auto* target = cmd->add_option("--target", args->target,
                                 "directory of the target model: its config.json (num_hidden_layers for the default "
                                 "taps, cross-checks) and, when the head has none, its model.embed_tokens.weight");
  cmd->add_option("--window", args->opt.window,
                  fmt::format("attention window W, 1..{} (EAGLE-3 heads attend over the whole context, so the "
                              "default is the widest)",
                              kMaxWindow))
      ->capture_default_str();
  cmd->add_flag("--fp8", args->opt.fp8, "add the FP8 e4m3 form of every linear in use");
  cmd->add_option("-o,--output", args->out, "the .tfe file to write")->required();
  cmd->callback([args, target] {
    if (target->count()) args->opt.target_dir = args->target;
    files::check_output(args->out, "convert: -o",
                        std::vector<std::filesystem::path>{args->opt.eagle_dir, args->target});
    const auto writer = convert_eagle3(args->opt);
    for (const std::string& w : eagle3_warnings(args->opt)) fmt::print(stderr, "warning: {}\n", w);
    writer.write(args->out);
    const auto& h = writer.header();
    fmt::print("wrote {}: {} (hidden {}, {} heads / {} kv, ffn {}, vocab {} / draft {}, window {}), {} FP8 forms\n",
               args->out, shown(h.name), h.hidden, h.heads, h.kv_heads, h.ffn, h.vocab, h.draft_vocab, h.window,
               h.fp8.size());
    std::vector<std::string> taps;
    for (const Tap& t : h.taps) taps.push_back(t.layer < 0 ? std::string("final") : std::to_string(t.layer));
    fmt::print("taps {}: the residual stream entering those target layers, from {}\n", fmt::join(taps, ", "),
               eagle3_taps_source(args->opt));
  });
}

}  // namespace tfe::cli
