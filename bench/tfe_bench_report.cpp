// tfe-bench's report: the line over steps per streams, the draft rows in the JSON, the table, --json and --csv.
#include <string>

#include <fmt/format.h>

#include "bench/tfe_bench.h"
#include "core/files.h"
#include "reference/ops.h"

namespace tfe::bench {

void report(const Options& o, const Measured& m, const json& checks, const json& errors, json& out) {
  const tfe::HeadHeader& h = m.header;
  const std::vector<int>& streams = m.streams;
  const std::vector<DraftRow>& rows = m.rows;
  const double bandwidth_gbps = m.bandwidth_gbps;
  const int64_t prefix_rows = m.prefix_rows;
  const int max_streams = m.max_streams;
  // Per streams: the fixed cost of a call and the marginal cost of a step, from the line over steps.
  json lines = json::array();
  for (int b : streams) {
    std::vector<double> x, yg, ye;
    for (const auto& r : rows)
      if (r.streams == b && r.graph) {
        x.push_back(r.steps);
        yg.push_back(r.graph->median);
        if (r.eager) ye.push_back(r.eager->median);
      }
    if (x.size() < 2) continue;
    const auto [g0, g1] = fit_line(x, yg);
    json l = {{"streams", b}, {"graph_call_fixed_us", g0}, {"graph_step_us", g1}};
    const tfe::StepBytes sb = tfe::step_bytes(h, b, m.fp8);
    if (bandwidth_gbps > 0) {
      const double floor = static_cast<double>(sb.total()) / (bandwidth_gbps * 1e9) * 1e6;
      l["floor_us"] = floor;
      l["graph_step_ratio"] = g1 / floor;
    }
    if (ye.size() == x.size()) {
      const auto [e0, e1] = fit_line(x, ye);
      l["eager_call_fixed_us"] = e0;
      l["eager_step_us"] = e1;
    }
    lines.push_back(std::move(l));
  }
  out["per_streams"] = lines;

  json draft = json::array();
  for (const auto& r : rows) {
    json j = {
        {"streams", r.streams}, {"steps", r.steps}, {"step_bytes", r.step_bytes}, {"floor_us_per_step", r.floor_us}};
    if (r.graph) {
      j["graph_call_us"] = to_json(*r.graph);
      j["graph_us_per_step"] = r.graph->median / r.steps;
      if (r.floor_us > 0) j["ratio"] = r.graph->median / r.steps / r.floor_us;
    }
    if (r.eager) {
      j["eager_call_us"] = to_json(*r.eager);
      j["eager_us_per_step"] = r.eager->median / r.steps;
    }
    draft.push_back(std::move(j));
  }
  out["draft"] = draft;
  out["errors"] = errors;

  // The table.
  fmt::print("\n{} ({}, {}), copy bandwidth {:.0f} GB/s, prefix {} rows/slot, ring {} rows\n", h.name,
             out["dtype"].get<std::string>(), out["fp8_mode"].get<std::string>(), bandwidth_gbps, prefix_rows,
             out["ring_rows"].get<int>());
  if (out.contains("open_ms"))
    fmt::print("open {:.1f} ms (lazy capture); capture of every graph {} ms; open with graphs off {} ms\n",
               out["open_ms"].get<double>(),
               out.contains("capture") ? fmt::format("{:.1f}", out["capture"]["capture_ms"].get<double>()) : "-",
               out.contains("open_eager_ms") ? fmt::format("{:.1f}", out["open_eager_ms"].get<double>()) : "-");
  fmt::print("{:>7} {:>5} {:>12} {:>10} {:>10} {:>7} {:>12} {:>11}\n", "streams", "steps", "graph us", "us/step",
             "floor us", "ratio", "eager us/st", "eager/graph");
  for (const auto& r : rows) {
    const auto cell = [](const std::optional<Stats>& s, double div) {
      return s ? fmt::format("{:.1f}", s->median / div) : std::string("-");
    };
    const std::string ratio =
        r.graph && r.floor_us > 0 ? fmt::format("{:.2f}", r.graph->median / r.steps / r.floor_us) : std::string("-");
    const std::string speedup =
        r.graph && r.eager ? fmt::format("{:.2f}", r.eager->median / r.graph->median) : std::string("-");
    fmt::print("{:>7} {:>5} {:>12} {:>10} {:>10.1f} {:>7} {:>12} {:>11}\n", r.streams, r.steps, cell(r.graph, 1),
               cell(r.graph, r.steps), r.floor_us, ratio, cell(r.eager, r.steps), speedup);
  }
  for (const auto& l : lines)
    fmt::print("streams {:>2}: graph call = {:.1f} us + {:.1f} us/step{}\n", l["streams"].get<int>(),
               l["graph_call_fixed_us"].get<double>(), l["graph_step_us"].get<double>(),
               l.contains("graph_step_ratio")
                   ? fmt::format(" (marginal step / floor = {:.2f})", l["graph_step_ratio"].get<double>())
                   : std::string());
  if (out.contains("call_floor")) {
    const json& f = out["call_floor"];
    fmt::print(
        "a call without kernels (an empty graph's launch and wait): {:.1f} us; with a copy-engine upload "
        "and two downloads, which a call does not make: {:.1f} us (each alone with its wait: upload {:.1f}, "
        "downloads {:.1f})\n",
        f["empty_graph_launch_us"]["median"].get<double>(), f["launch_with_copies_us"]["median"].get<double>(),
        f["copy_upload_us"]["median"].get<double>(), f["copy_download_us"]["median"].get<double>());
  }
  if (out.contains("extend"))
    for (const auto& e : out["extend"])
      fmt::print("extend {:>4} rows: {:.1f} us{}\n", e["rows"].get<int64_t>(), e["us"]["median"].get<double>(),
                 e.contains("note") ? " (" + e["note"].get<std::string>() + ")" : std::string());
  if (!checks.empty()) fmt::print("checks: {}\n", checks.dump());
  if (out.contains("bucket_draft_differences"))
    for (const auto& e : out["bucket_draft_differences"])
      fmt::print("  bucket {} slot {} step {}: token {} (conf {:.4f}), at {} streams {} (conf {:.4f})\n",
                 e["streams"].get<int>(), e["slot"].get<int>(), e["step"].get<int>(), e["token"].get<int>(),
                 e["confidence"].get<double>(), max_streams, e["token_at_max_streams"].get<int>(),
                 e["confidence_at_max_streams"].get<double>());
  std::fflush(stdout);

  if (!o.json_out.empty()) tfe::files::write_atomic(o.json_out, out.dump(2) + "\n", "--json");
  if (!o.csv_out.empty()) {
    std::string f;
    f += "preset,dtype,streams,steps,graph_us,graph_us_per_step,eager_us,eager_us_per_step,floor_us_per_step,ratio,"
         "step_bytes\n";
    for (const auto& r : rows) {
      auto num = [](bool have, double v) { return have ? fmt::format("{:.3f}", v) : std::string(); };
      f += fmt::format(
          "{},{},{},{},{},{},{},{},{:.3f},{},{}\n", h.name, out["dtype"].get<std::string>(), r.streams, r.steps,
          num(bool(r.graph), r.graph ? r.graph->median : 0),
          num(bool(r.graph), r.graph ? r.graph->median / r.steps : 0),
          num(bool(r.eager), r.eager ? r.eager->median : 0),
          num(bool(r.eager), r.eager ? r.eager->median / r.steps : 0), r.floor_us,
          num(r.graph && r.floor_us > 0, r.graph && r.floor_us > 0 ? r.graph->median / r.steps / r.floor_us : 0),
          r.step_bytes);
    }
    tfe::files::write_atomic(o.csv_out, f, "--csv");
  }
}

}  // namespace tfe::bench
