// tfe-plan inspect: what a .tfe holds (header, tensor table, parameter counts) and what one draft step
// reads from HBM, so that a head's cost is known before it is planned; or, given an artifact directory,
// that artifact verified on the CPU.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "tools/commands.h"
#include "core/error.h"
#include <tfe/deploy.h>
#include <tfe/head_file.h>

namespace tfe::cli {

namespace {

struct InspectArgs {
  std::string path;
  bool verify = false;
  std::string head;              // an artifact's head, checked against its manifest
  double bandwidth_tbps = 4.25;  // H200 HBM3e peak
  int rows = 1;
};

constexpr double kMB = 1e6;

std::string tap_text(const Tap& t) {
  return fmt::format("{}{}", t.layer == -1 ? std::string("final") : std::to_string(t.layer), t.norm ? " (norm)" : "");
}

std::string rope_text(const Rope& r) {
  if (!r.llama3) return fmt::format("theta {}", r.theta);
  return fmt::format(
      "theta {}, llama3 scaling: factor {}, low_freq_factor {}, high_freq_factor {}, "
      "original_max_positions {}",
      r.theta, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_positions);
}

void print_header(const HeadFile& head) {
  const HeadHeader& h = head.header();
  auto row = [](std::string_view key, const auto& value) { fmt::print("  {:<16} {}\n", key, value); };
  std::vector<std::string> taps;
  for (const auto& t : h.taps) taps.push_back(tap_text(t));
  fmt::print("header\n");
  row("header sha256", head.header_sha256());
  row("format_version", h.format_version);
  row("name", h.name.empty() ? "(none)" : shown(h.name));
  row("head_type", head_type_name(h.head_type));
  row("taps", fmt::format("{}", fmt::join(taps, ", ")));
  row("target_hidden", h.target_hidden);
  row("hidden", h.hidden);
  row("heads", h.heads);
  row("kv_heads", h.kv_heads);
  row("head_dim", h.head_dim);
  row("ffn", h.ffn);
  row("vocab", h.vocab);
  row("draft_vocab", h.draft_vocab);
  row("window", h.window);
  row("rope", rope_text(h.rope));
  row("rms_eps", h.rms_eps);
  row("qk_norm", h.qk_norm ? "yes" : "no");
  if (h.head_type == HeadType::two_stage) {
    row("cand_k", h.cand_k);
    row("lowrank", h.lowrank);
  }
  row("fp8", h.fp8.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(h.fp8, ", ")));
}

void print_tensors(const HeadFile& head) {
  const auto& tensors = head.file().tensors();
  const auto header = head.file().header_bytes();
  size_t name_width = 4;
  for (const auto& t : tensors) name_width = std::max(name_width, shown(t.name).size());
  fmt::print("\ntensors ({})\n", tensors.size());
  fmt::print("  {:<{}}  {:<8} {:<14} {:>10} {:>12}\n", "name", name_width, "dtype", "shape", "MB", "offset");
  for (const auto& t : tensors) {
    // File offset: where `xxd -s` or another reader finds the bytes.
    const auto offset = static_cast<int64_t>(t.data - header.data()) + 8;
    fmt::print("  {:<{}}  {:<8} {:<14} {:>10.3f} {:>12}\n", shown(t.name), name_width, dtype_name(t.dtype),
               fmt::format("[{}]", fmt::join(t.shape, ", ")), t.bytes / kMB, offset);
  }
}

void print_parameters(const HeadFile& head) {
  int64_t bf16 = 0, fp8 = 0, scales = 0, bf16_bytes = 0, fp8_bytes = 0;
  for (const auto& t : head.file().tensors()) {
    if (t.dtype == DType::BF16) {
      bf16 += t.numel();
      bf16_bytes += t.bytes;
    } else if (t.dtype == DType::F8_E4M3) {
      fp8 += t.numel();
      fp8_bytes += t.bytes;
    } else if (t.dtype == DType::F32) {
      scales += t.numel();
      fp8_bytes += t.bytes;
    }
  }
  fmt::print("\nparameters\n");
  fmt::print("  {:<12} {:>14} ({:.3f} M, {:.3f} MB)\n", "bf16 forms", bf16, bf16 / 1e6, bf16_bytes / kMB);
  if (fp8 > 0)
    fmt::print("  {:<12} {:>14} ({:.3f} M, + {} F32 scales, {:.3f} MB)\n", "FP8 forms", fp8, fp8 / 1e6, scales,
               fp8_bytes / kMB);
  fmt::print("  {:<12} {:>14} entries (I32)\n", "d2t", head.header().draft_vocab);
}

void print_step(const HeadHeader& h, const InspectArgs& a) {
  fmt::print("\nper draft step ({} row{}, HBM at {} TB/s)\n", a.rows, a.rows == 1 ? "" : "s", a.bandwidth_tbps);
  fmt::print("  {:<6} {:>12} {:>12} {:>12} {:>12} {:>10}\n", "form", "weights MB", "K/V MB", "act MB", "total MB",
             "time us");
  auto line = [&](std::string_view form, bool fp8) {
    const StepBytes b = step_bytes(h, a.rows, fp8);
    const double us = static_cast<double>(b.total()) / (a.bandwidth_tbps * 1e12) * 1e6;
    fmt::print("  {:<6} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>10.2f}\n", form, b.weights / kMB, b.kv / kMB,
               b.activations / kMB, b.total() / kMB, us);
  };
  line("bf16", false);
  if (!h.fp8.empty()) line("fp8", true);
}

// An artifact directory: verified whole on the CPU (<tfe/deploy.h> verify_artifact).
void run_artifact(const InspectArgs& a) {
  const ArtifactInfo info = verify_artifact(a.path, a.head);
  auto row = [](std::string_view key, const auto& value) { fmt::print("  {:<16} {}\n", key, value); };
  fmt::print("{}\n\nartifact\n", a.path);
  row("arch", info.arch);
  row("nvrtc", info.nvrtc_version);
  row("head sha256", info.head_sha256.empty() ? std::string("(a preset)") : info.head_sha256);
  row("kernels", fmt::format("{} CUBINs, {:.3f} MB", info.kernels, static_cast<double>(info.cubin_bytes) / kMB));
  fmt::print("\nverified: manifest, plan.yaml and {} CUBINs match their sha256{}\n", info.kernels,
             a.head.empty() ? "" : fmt::format("; compiled for {}", a.head));
}

void run(const InspectArgs& a) {
  if (std::filesystem::is_directory(a.path)) return run_artifact(a);
  if (!a.head.empty()) fail("inspect: --head checks an artifact directory; {} is a head file", a.path);
  if (!std::isfinite(a.bandwidth_tbps))
    fail("inspect: --bandwidth {} must be a finite number of TB/s", a.bandwidth_tbps);
  const HeadFile head = HeadFile::open(a.path, {.verify_sha256 = a.verify});
  fmt::print("{}\n\n", a.path);
  print_header(head);
  print_tensors(head);
  print_parameters(head);
  print_step(head.header(), a);
  if (a.verify) fmt::print("\nsha256: all {} tensors match\n", head.file().tensors().size());
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "print a head's header, tensors, parameters and per-step HBM bytes");
  cmd->add_option("path", args->path,
                  ".tfe head file, or an artifact directory (tfe-plan compile -o), verified whole on the CPU")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_flag("--verify", args->verify, "hash every tensor and compare with the recorded sha256");
  cmd->add_option("--head", args->head, "for an artifact: the .tfe head it must have been compiled for");
  cmd->add_option("--bandwidth", args->bandwidth_tbps, "HBM bandwidth in TB/s for the step time")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rows", args->rows, "rows (slots) drafted per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->callback([args] { run(*args); });
}

}  // namespace tfe::cli
