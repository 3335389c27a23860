// tfe-bench's run: every part in order on the GPU (device, copy bandwidth, call floor, open, prefix, capture,
// drafts with graphs, extend, the drafts and their checks, the same with graphs off), and --reference on the
// CPU.
#include <cuda_profiler_api.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tfe/head_file.h>
#include <tfe/reference.h>

#include "bench/tfe_bench.h"
#include "core/error.h"
#include "core/files.h"
#include "device/cuda_check.h"
#include "reference/ops.h"

namespace tfe::bench {

int run_reference(const Options& o, const std::vector<int>& streams) {
  if (o.drafts_out.empty()) tfe::fail("--reference writes --drafts-out and nothing else: give --drafts-out");
  const tfe::HeadFile file = tfe::HeadFile::open(o.head);
  const tfe::HeadHeader& h = file.header();
  tfe::ReferenceOptions ro;
  ro.max_slots = streams.back();
  ro.max_steps = 8;
  ro.fp8 = tfe::fp8_mode_from_name(o.fp8);
  tfe::Reference ref(file, ro);
  const Prefix prefix = make_prefix(h, streams.back(), h.window + 1, o.seed);
  const auto t0 = Clock::now();
  extend_prefix(ref, prefix);
  const tfe::DraftResult d = ref.draft(first_slots(streams.back()), ro.max_steps);
  std::vector<std::string> fp8;
  for (const auto& l : tfe::linears_in_use(h))
    if (ref.uses_fp8(l)) fp8.push_back(l);
  write_drafts(o.drafts_out, prefix, d,
               {{"tfe.source", "tfe-bench --reference: CPU reference"},
                {"tfe.head_sha256", file.header_sha256()},
                {"tfe.seed", std::to_string(o.seed)},
                {"tfe.fp8", std::string(tfe::fp8_mode_name(ro.fp8))},
                {"tfe.fp8_linears", fmt::format("{}", fmt::join(fp8, ","))},
                {"tfe.ring_rows", std::to_string(ref.ring_rows())}});
  fmt::print("{}: {} slots x {} rows, {} steps through the CPU reference in {:.0f} ms; slot 0 drafts {}\n",
             o.drafts_out, prefix.slots, prefix.rows, d.steps, ms_since(t0),
             fmt::join(std::span<const int32_t>(d.tokens).first(static_cast<size_t>(d.steps)), " "));
  return 0;
}

int run(const Options& o) {
  json out;
  json errors = json::object();
  Parts parts(errors);
  out["tool"] = "tfe-bench";
  out["head"] = o.head;

  const std::vector<int> streams = parse_list("--streams", o.streams, 1, 16);
  const std::vector<int> steps = parse_list("--steps", o.steps, 1, 16);
  if (o.iters < 1 || o.warmup < 0 || o.extend_iters < 1)
    tfe::fail("--iters {} / --warmup {} / --extend-iters {}: need iters >= 1, warmup >= 0, extend-iters >= 1", o.iters,
              o.warmup, o.extend_iters);
  const int max_streams = streams.back();

  parts.run("device", [&] {
    cudaDeviceProp prop{};
    TFE_CUDA(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    TFE_CUDA(cudaDriverGetVersion(&driver));
    TFE_CUDA(cudaRuntimeGetVersion(&runtime));
    out["device"] = {{"name", prop.name},
                     {"sm", fmt::format("sm_{}{}", prop.major, prop.minor)},
                     {"memory_gib", static_cast<double>(prop.totalGlobalMem) / double(1 << 30)},
                     {"driver", driver},
                     {"runtime", runtime}};
  });

  double bandwidth_gbps = 0;
  parts.run("copy bandwidth", [&] {
    const CopyBandwidth c = copy_bandwidth(o.copy_gib, 10);
    bandwidth_gbps = c.gbps;
    out["copy_bandwidth"] = {
        {"gbps", c.gbps}, {"bytes_per_copy", c.bytes}, {"ms", to_json(c.ms)}, {"counts", "bytes read + bytes written"}};
  });

  parts.run("call floor", [&] {
    // The sizes one draft call of the largest bucket moves: four int32 tables a stream up, and a token
    // and a confidence a stream and step down (runtime/runtime.cpp, Runtime::draft), at 16 steps, the
    // most a plan takes: 1 KB or less either way, well below what a copy's latency would notice.
    const auto up = static_cast<size_t>(4 * max_streams) * sizeof(int32_t);
    const auto down = static_cast<size_t>(max_streams * 16) * (sizeof(int32_t) + sizeof(float));
    const CallFloor f = call_floor(up, down, 200);
    out["call_floor"] = {{"empty_graph_launch_us", to_json(f.launch)},
                         {"copy_upload_us", to_json(f.upload)},
                         {"copy_download_us", to_json(f.download)},
                         {"launch_with_copies_us", to_json(f.with_copies)},
                         {"upload_bytes", up},
                         {"download_bytes", down}};
  });

  tfe::OpenOptions open;
  open.artifact_dir = o.artifact;
  if (o.artifact.empty()) {
    tfe::PlanOptions p = o.plan;
    p.fp8 = tfe::fp8_mode_from_name(o.fp8);
    open.plan = p;
  }
  tfe::testing::Hooks hooks;
  hooks.capture = tfe::testing::Hooks::Capture::lazy;
  using Dependent = tfe::testing::Hooks::DependentLaunch;
  hooks.dependent_launch = o.dependent_launch == "all"   ? Dependent::all
                           : o.dependent_launch == "off" ? Dependent::off
                                                         : Dependent::plan;
  hooks.knock_out = o.knock_out;
  hooks.tuning = o.tuning;
  hooks.l2_resident_weight_bytes = static_cast<size_t>(o.l2_resident_mb) << 20;
  if (!o.knock_out.empty())
    fmt::print(
        "knock-out: {} left out of every draft pass; the drafts are wrong, the times are what the rest "
        "costs\n",
        fmt::join(o.knock_out, ", "));

  std::optional<tfe::Runtime> rt;
  parts.run("open", [&] {
    const auto t0 = Clock::now();
    rt.emplace(tfe::testing::open(o.head, open, hooks));
    out["open_ms"] = ms_since(t0);
    out["open_capture"] = "lazy";
    out["dependent_launch"] = o.dependent_launch;
    out["knock_out"] = o.knock_out;
    out["l2_resident_mb"] = o.l2_resident_mb;
    out["l2_set_aside_bytes"] = rt->stats().l2_set_aside;
    if (o.l2_resident_mb > 0)
      fmt::print(
          "L2: {:.1f} MiB set aside for weights kept from one step to the next (asked {} MiB); the floor "
          "still counts every weight byte from HBM\n",
          static_cast<double>(rt->stats().l2_set_aside) / (1 << 20), o.l2_resident_mb);
    const tfe::Tuning& t = tfe::testing::plan(*rt).tuning;
    out["dependent_streams"] = t.dependent_streams;
    out["dependent_streams_fp8"] = t.dependent_streams_fp8;
    out["dependent_safe_nodes"] = t.dependent_safe_nodes;
    out["rope_in_wqkv"] = t.rope_in_wqkv;
    out["gemv_cluster"] = t.gemv_cluster;
    out["tiled_weights"] = t.tiled_weights;
    out["attention_split"] = std::string(tfe::attention_split_name(tfe::testing::plan(*rt).options.attention_split));
  });
  if (!rt) {
    out["errors"] = errors;
    if (!o.json_out.empty()) tfe::files::write_atomic(o.json_out, out.dump(2) + "\n", "--json");
    return 1;
  }

  // Copies: the first runtime is destroyed before the second opens, and the report still needs them.
  const tfe::Plan plan = tfe::testing::plan(*rt);
  const tfe::HeadHeader& h = plan.header;
  const std::vector<std::string> fp8_in_use = fp8_linears(plan);
  out["preset"] = h.name;
  out["head_type"] = std::string(tfe::head_type_name(h.head_type));
  out["fp8_mode"] = std::string(tfe::fp8_mode_name(plan.options.fp8));
  out["fp8"] = plan.fp8;
  out["fp8_linears"] = fp8_in_use;
  out["dtype"] = plan.fp8 ? "fp8" : "bf16";
  out["window"] = h.window;
  out["ring_rows"] = rt->ring_rows();
  out["buckets"] = plan.options.buckets;
  out["max_steps"] = plan.options.max_steps;
  out["weight_bytes"] = rt->stats().weight_bytes;
  out["graphs"] = rt->graphs_enabled();

  const int max_bucket = plan.options.buckets.back();
  if (max_streams > max_bucket || max_streams + 1 > plan.options.max_slots)
    tfe::fail(
        "--streams {} exceeds the plan: largest bucket {}, max_slots {} (one more slot is used for extend timing)",
        max_streams, max_bucket, plan.options.max_slots);
  for (int s : steps)
    if (s > plan.options.max_steps) tfe::fail("--steps {} exceeds the plan's max_steps {}", s, plan.options.max_steps);

  // The window's W + 1 keys, all real: every draft step attends a full window.
  const int64_t prefix_rows = h.window + 1;
  out["prefix_rows"] = prefix_rows;
  Prefix prefix;
  parts.run("inputs", [&] { prefix = make_prefix(h, max_streams, prefix_rows, o.seed); });
  bool prefilled = parts.run("prefix extend", [&] { extend_prefix(*rt, prefix); });

  // Graph capture, key by key: the first draft of a key captures (and replays once), the second replays.
  if (prefilled && rt->graphs_enabled() && !o.profile) {
    parts.run("capture", [&] {
      const uint64_t before = rt->stats().captures;
      double first_ms = 0, capture_ms = 0;
      json keys = json::array();
      for (int b : plan.options.buckets) {
        if (b > max_streams) break;  // the prefix fills max_streams slots
        const std::vector<int> slots = first_slots(b);
        for (int s = 1; s <= plan.options.max_steps; ++s) {
          const double first = time_draft_us(*rt, slots, s) * 1e-3;
          const double second = time_draft_us(*rt, slots, s) * 1e-3;
          first_ms += first;
          capture_ms += first - second;
          keys.push_back({{"streams", b}, {"steps", s}, {"first_ms", first}, {"replay_ms", second}});
        }
      }
      out["capture"] = {{"graphs", rt->stats().captures - before},
                        {"capture_ms", capture_ms},
                        {"first_drafts_ms", first_ms},
                        {"how", "sum over keys of (first draft - second draft): capture and instantiation"},
                        {"keys", keys}};
    });
  }

  if (o.profile) {
    if (!prefilled) return 1;
    for (int b : streams) {
      const std::vector<int> slots = first_slots(b);
      for (int i = 0; i < 3; ++i) (void)rt->draft(slots, 1);  // capture and warm outside the profiled range
      TFE_CUDA(cudaProfilerStart());
      (void)rt->draft(slots, 1);
      TFE_CUDA(cudaProfilerStop());
    }
    return 0;
  }

  std::vector<DraftRow> rows;
  for (int b : streams)
    for (int s : steps) {
      DraftRow r;
      r.streams = b;
      r.steps = s;
      const tfe::StepBytes sb = tfe::step_bytes(h, b, plan.fp8);
      r.step_bytes = sb.total();
      r.floor_us = bandwidth_gbps > 0 ? static_cast<double>(sb.total()) / (bandwidth_gbps * 1e9) * 1e6 : 0.0;
      rows.push_back(r);
    }

  if (prefilled) {
    parts.run("draft (graphs)", [&] {
      for (auto& r : rows) r.graph = time_draft(*rt, first_slots(r.streams), r.steps, o.warmup, o.iters);
    });
  }

  // Extend of one slot beyond the prefix slots; positions continue call after call.
  if (prefilled) {
    parts.run("extend", [&] {
      const int slot = max_streams;
      const int64_t width = prefix.row_width;
      Draws d(o.seed + 1);
      int64_t pos = 0;
      json ext = json::array();
      const int64_t ring = rt->ring_rows();
      for (int64_t want : {int64_t{1}, int64_t{16}, int64_t{512}}) {
        const int64_t n = std::min(want, ring);
        std::vector<tfe::bf16_bits> taps(static_cast<size_t>(n * width));
        d.fill(taps);
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (auto& t : tokens) t = d.token(h.vocab);
        std::vector<double> us;
        for (int i = 0; i < o.extend_iters + 2; ++i) {  // two untimed warm-up calls
          const tfe::ExtendRequest q{slot, pos, n, taps, tokens};
          const auto t0 = Clock::now();
          rt->extend({&q, 1});
          rt->synchronize();
          if (i >= 2) us.push_back(ms_since(t0) * 1e3);
          pos += n;
        }
        json e = {{"rows", n}, {"us", to_json(stats_of(us))}};
        if (n != want)
          e["note"] = fmt::format("{} rows asked; the ring holds {} rows, the most one extend takes", want, ring);
        ext.push_back(std::move(e));
      }
      out["extend"] = ext;
    });
  }

  // Drafts for the fixed input set, and tfe's own consistency: every bucket drafts the same tokens for
  // the same slots.
  json checks = json::object();
  std::vector<int32_t> graph_tokens;
  if (prefilled) {
    parts.run("drafts", [&] {
      const int S = plan.options.max_steps < 8 ? plan.options.max_steps : 8;
      const std::vector<int> slots = first_slots(max_streams);
      const tfe::DraftResult d = rt->draft(slots, S);
      graph_tokens = d.tokens;
      // Where a bucket's drafts leave the largest bucket's: each slot's first step that differs (the steps
      // after it draft from another token), with both tokens and confidences, to judge whether it is a
      // near-tie that another order of fp32 sums moved.
      json differences = json::array();
      for (int b : streams) {
        const tfe::DraftResult db = rt->draft(first_slots(b), S);
        for (int i = 0; i < b; ++i)
          for (int s = 1; s <= S; ++s)
            if (db.token(i, s) != d.token(i, s)) {
              differences.push_back({{"streams", b},
                                     {"slot", i},
                                     {"step", s},
                                     {"token", db.token(i, s)},
                                     {"confidence", db.confidence(i, s)},
                                     {"token_at_max_streams", d.token(i, s)},
                                     {"confidence_at_max_streams", d.confidence(i, s)}});
              break;
            }
      }
      checks["drafts_same_in_every_bucket"] = differences.empty();
      if (!differences.empty()) out["bucket_draft_differences"] = std::move(differences);
      if (o.drafts_out.empty()) return;
      write_drafts(o.drafts_out, prefix, d,
                   {{"tfe.source",
                     rt->graphs_enabled() ? "tfe-bench: GPU runtime, graph replay" : "tfe-bench: GPU runtime, eager"},
                    {"tfe.head_sha256", plan.head_sha256},
                    {"tfe.seed", std::to_string(o.seed)},
                    {"tfe.fp8", std::string(tfe::fp8_mode_name(plan.options.fp8))},
                    {"tfe.fp8_linears", fmt::format("{}", fmt::join(fp8_in_use, ","))},
                    {"tfe.ring_rows", std::to_string(rt->ring_rows())}});
      out["drafts_out"] = o.drafts_out;
    });
  }
  out["stats_graph_runtime"] = {{"replays", rt->stats().replays},
                                {"captures", rt->stats().captures},
                                {"graph_updates", rt->stats().graph_updates},
                                {"extend_chunks", rt->stats().extend_chunks}};
  rt.reset();  // frees the first runtime's device memory before the second opens

  // The same passes launched node by node: what the graphs save.
  if (o.eager) {
    std::optional<tfe::Runtime> eager;
    tfe::OpenOptions eo = open;
    eo.graphs = false;
    parts.run("open (eager)", [&] {
      const auto t0 = Clock::now();
      eager.emplace(tfe::testing::open(o.head, eo, hooks));
      out["open_eager_ms"] = ms_since(t0);
    });
    if (eager && parts.run("prefix extend (eager)", [&] { extend_prefix(*eager, prefix); })) {
      parts.run("draft (eager)", [&] {
        for (auto& r : rows) r.eager = time_draft(*eager, first_slots(r.streams), r.steps, o.warmup, o.iters);
      });
      parts.run("eager drafts", [&] {
        if (graph_tokens.empty()) return;
        const int S = plan.options.max_steps < 8 ? plan.options.max_steps : 8;
        const tfe::DraftResult d = eager->draft(first_slots(max_streams), S);
        checks["eager_equals_graph"] = d.tokens == graph_tokens;
      });
    }
  }
  out["checks"] = checks;

  report(o, Measured{h, plan.fp8, streams, rows, bandwidth_gbps, prefix_rows, max_streams}, checks, errors, out);
  return parts.any_failed() ? 1 : 0;
}

}  // namespace tfe::bench
