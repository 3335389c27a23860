// bench_boundary: what a kernel boundary costs inside a CUDA graph on this device, by the way the
// consumer learns that its producer is done.
//
// A draft step is five GEMVs with small kernels between them, and a small kernel costs 1.5-4 us in place
// (BENCHMARKS.md, "Inside the graph: what each small kernel costs") for a few microseconds of work. That
// time is partly each boundary: under programmatic dependent launch a kernel's `griddepcontrol.wait`
// returns once the whole grid before it has completed and its memory is flushed. This probe separates the
// boundary from the work. Each pair is a producer (CTAS CTAs of 256 threads, each streaming KB kilobytes,
// a GEMV's shape) and a one-CTA consumer that reads one word per producer CTA (a small kernel's shape); a
// CUDA graph holds PAIRS pairs, the producers rotating over copies of their bytes that together exceed the
// L2. The consumer learns the producer is done in one of three ways:
//   plain      no dependent launch: the consumer starts after the producer grid has completed;
//   dependent  dependent launch as tfe's kernels use it: every kernel waits (`griddepcontrol.wait`) before
//              it touches an earlier kernel's output and releases its successor right after;
//   counter    dependent launch, but the consumer does not wait for the producer grid: each producer CTA
//              bumps a counter after its word (a release), and the consumer spins on the counter
//              (acquire) until every CTA has counted.
// For each it prints the time of a pair, of the producer alone in the same graph form, and their
// difference: what the consumer and its boundary cost in place. A form of handoff that is faster than
// `dependent` by a microsecond or more would be worth a microsecond at each of a step's dozen boundaries.
//
// Kernels are compiled through tfe's compiler (NVRTC) and launched as the runtime launches its own.
// Exit status 1 when a consumer's result differs from the producers' words (a handoff that read early).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kernels/registry.h"
#include "compiler/nvrtc.h"
#include "device/cuda_check.h"
#include "device/handles.h"
#include "device/kernels.h"

namespace {

using namespace tfe;

// MODE: 0 plain, 1 dependent, 2 counter (see above).
constexpr const char* kProbeSource = R"(#pragma once
#include "common.cuh"

namespace tfe {
namespace probe {
using kernels::release_dependents;
using kernels::wait_for_predecessors;

struct ProbeParams {
  const uint4* src;          // producer: CTA b streams bytes [b * bytes_per_cta, (b + 1) * bytes_per_cta)
  long long bytes_per_cta;
  unsigned* part;            // [ctas]: producer CTA b writes word b
  unsigned* counter;         // counter mode: each producer CTA adds one after its word
  unsigned* out;             // consumer: the xor of the parts
  long long ctas;            // producer CTAs
};

__device__ __forceinline__ unsigned block_xor(unsigned v) {
  __shared__ unsigned warp_part[8];
  v = __reduce_xor_sync(0xffffffffu, v);
  if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned all = 0;
  for (int w = 0; w < 8; ++w) all ^= warp_part[w];
  return all;
}

template <typename Cfg>
__global__ void __launch_bounds__(256) producer(const ProbeParams p) {
  if (Cfg::MODE > 0) wait_for_predecessors();
  const uint4* s = p.src + blockIdx.x * (p.bytes_per_cta / 16);
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < p.bytes_per_cta / 16; i += 256) {
    const uint4 v = __ldcs(s + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (Cfg::MODE > 0) release_dependents();
  acc = block_xor(acc);
  if (threadIdx.x == 0) {
    // Never zero, so that a consumer reading a word before it was written shows in its result.
    p.part[blockIdx.x] = (acc | 1u) ^ (static_cast<unsigned>(blockIdx.x) << 1);
    if (Cfg::MODE == 2) {
      __threadfence();
      atomicAdd(p.counter, 1u);
    }
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(256) consumer(const ProbeParams p) {
  if (Cfg::MODE == 1) wait_for_predecessors();
  if (Cfg::MODE == 2) {
    if (threadIdx.x == 0) {
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.counter) : "memory");
      } while (seen < static_cast<unsigned>(p.ctas));
    }
    __syncthreads();
  }
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < p.ctas; i += 256) acc ^= __ldcg(p.part + i);
  acc = block_xor(acc);
  if (threadIdx.x == 0) p.out[0] = acc;
  if (Cfg::MODE > 0) release_dependents();
}

}  // namespace probe
}  // namespace tfe
)";

constexpr const char* kModeNames[] = {"plain", "dependent", "counter"};

KernelDef probe_def(const std::string& function) {
  return KernelDef{function,
                   "boundary_probe.cuh",
                   "tfe::probe::" + function,
                   {"MODE"},
                   {{"src", ParamKind::ptr},
                    {"bytes_per_cta", ParamKind::i64},
                    {"part", ParamKind::ptr},
                    {"counter", ParamKind::ptr},
                    {"out", ParamKind::ptr},
                    {"ctas", ParamKind::i64}}};
}

struct Loaded {
  cuda::Library library;
  cudaKernel_t kernel = nullptr;
};

Loaded compile_and_load(const std::string& function, int mode, const CompileOptions& options) {
  const CompiledKernel k =
      compile_unit(make_compile_unit(KernelSpec{function, {{"MODE", mode}}}, probe_def(function)), options);
  Loaded l{cuda::load_library(k.cubin.data(), k.uri.c_str()), nullptr};
  TFE_CUDA(cudaLibraryGetKernel(&l.kernel, l.library.get(), k.lowered_name.c_str()));
  return l;
}

struct Row {
  std::string mode;
  int64_t ctas = 0, kb = 0;
  double pair_us = 0, producer_us = 0;
  bool ok = true;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_boundary: the cost of a kernel boundary inside a CUDA graph, by form of handoff"};
  std::vector<int64_t> ctas_list = {1, 132, 256, 896};
  int64_t kb = 64, pairs = 50, replays = 20;
  bool compile_only = false;
  app.add_option("--ctas", ctas_list, "producer CTAs (a list)")->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("--kb", kb, "kilobytes each producer CTA streams")->check(CLI::Range(1, 1024));
  app.add_option("--pairs", pairs, "producer-consumer pairs in one graph")->check(CLI::Range(1, 1000));
  app.add_option("--replays", replays, "timed graph replays (the best is kept)")->check(CLI::Range(1, 1000));
  app.add_flag("--compile-only", compile_only, "compile the probe kernels and stop (no GPU needed)");
  CLI11_PARSE(app, argc, argv);

  try {
    int device = 0;
    CompileOptions options;
    options.headers.push_back({"boundary_probe.cuh", kProbeSource});
    if (compile_only) {
      for (int mode = 0; mode < 3; ++mode)
        for (const char* f : {"producer", "consumer"})
          compile_unit(make_compile_unit(KernelSpec{f, {{"MODE", mode}}}, probe_def(f)), options);
      fmt::print("bench_boundary: the six probe kernels compile for {}\n", options.arch);
      return 0;
    }
    TFE_CUDA(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    TFE_CUDA(cudaGetDeviceProperties(&prop, device));
    options.arch = fmt::format("sm_{}{}", prop.major, prop.minor);
    std::vector<std::array<Loaded, 2>> kernels;
    for (int mode = 0; mode < 3; ++mode)
      kernels.push_back({compile_and_load("producer", mode, options), compile_and_load("consumer", mode, options)});

    cuda::Stream stream = cuda::create_stream();
    const int64_t max_ctas = *std::max_element(ctas_list.begin(), ctas_list.end());
    // The producers' bytes: at least three of the widest producer's and four times the L2. Producer k reads
    // the k-th slice of its size, wrapping around, so that the slices a graph cycles over exceed the L2 and
    // every producer streams from HBM, as a GEMV's weights do.
    const int64_t pool = std::max<int64_t>(3 * max_ctas * kb * 1024, 4 * static_cast<int64_t>(prop.l2CacheSize));
    cuda::DeviceMemory src = cuda::allocate_device(static_cast<size_t>(pool), "producer bytes");
    TFE_CUDA(cudaMemsetAsync(src.data(), 0x5a, static_cast<size_t>(pool), stream.get()));
    cuda::DeviceMemory parts = cuda::allocate_device(static_cast<size_t>(pairs * max_ctas * 4), "parts");
    cuda::DeviceMemory counters = cuda::allocate_device(static_cast<size_t>(pairs * 4), "counters");
    cuda::DeviceMemory outs = cuda::allocate_device(static_cast<size_t>(pairs * 4), "outs");

    std::vector<Row> rows;
    bool all_ok = true;
    for (const int64_t ctas : ctas_list) {
      for (int mode = 0; mode < 3; ++mode) {
        const int64_t slice = ctas * kb * 1024, slices = pool / slice;
        auto params = [&](int64_t k) {
          std::array<uint64_t, 6> slots = {
              reinterpret_cast<uint64_t>(src.data() + (k % slices) * slice),
              static_cast<uint64_t>(kb * 1024),
              reinterpret_cast<uint64_t>(reinterpret_cast<unsigned*>(parts.data()) + k * max_ctas),
              reinterpret_cast<uint64_t>(reinterpret_cast<unsigned*>(counters.data()) + k),
              reinterpret_cast<uint64_t>(reinterpret_cast<unsigned*>(outs.data()) + k),
              static_cast<uint64_t>(ctas)};
          return slots;
        };
        const bool dependent = mode > 0;
        auto time_graph = [&](bool with_consumer) {
          cudaGraph_t raw = nullptr;
          TFE_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
          // The counters and parts start at zero in every replay.
          TFE_CUDA(cudaMemsetAsync(counters.data(), 0, static_cast<size_t>(pairs * 4), stream.get()));
          TFE_CUDA(cudaMemsetAsync(parts.data(), 0, static_cast<size_t>(pairs * max_ctas * 4), stream.get()));
          for (int64_t k = 0; k < pairs; ++k) {
            auto slots = params(k);
            LaunchShape producer_shape;
            producer_shape.block = 256;
            // The first producer follows the memsets, not a kernel: a plain launch.
            TFE_CUDA(cuda::launch_kernel(kernels[mode][0].kernel, dim3(static_cast<unsigned>(ctas)), producer_shape,
                                         slots.data(), stream.get(), dependent && k > 0));
            if (with_consumer) {
              LaunchShape consumer_shape;
              consumer_shape.block = 256;
              TFE_CUDA(cuda::launch_kernel(kernels[mode][1].kernel, dim3(1), consumer_shape, slots.data(), stream.get(),
                                           dependent));
            }
          }
          TFE_CUDA(cudaStreamEndCapture(stream.get(), &raw));
          cuda::Graph graph(raw);
          cudaGraphExec_t raw_exec = nullptr;
          TFE_CUDA(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
          cuda::GraphExec exec(raw_exec);
          cuda::Event start = cuda::create_event(true), stop = cuda::create_event(true);
          for (int w = 0; w < 3; ++w) TFE_CUDA(cudaGraphLaunch(exec.get(), stream.get()));
          float best = 1e30f;
          for (int64_t r = 0; r < replays; ++r) {
            TFE_CUDA(cudaEventRecord(start.get(), stream.get()));
            TFE_CUDA(cudaGraphLaunch(exec.get(), stream.get()));
            TFE_CUDA(cudaEventRecord(stop.get(), stream.get()));
            TFE_CUDA(cudaEventSynchronize(stop.get()));
            float ms = 0;
            TFE_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
            best = std::min(best, ms);
          }
          return 1e3 * best / static_cast<double>(pairs);
        };
        Row row;
        row.mode = kModeNames[mode];
        row.ctas = ctas;
        row.kb = kb;
        row.producer_us = time_graph(false);
        row.pair_us = time_graph(true);
        // Every consumer's xor against the xor of its producer's words, from the last replay.
        std::vector<unsigned> part_host(static_cast<size_t>(pairs * max_ctas)), out_host(static_cast<size_t>(pairs));
        TFE_CUDA(cudaMemcpy(part_host.data(), parts.data(), part_host.size() * 4, cudaMemcpyDeviceToHost));
        TFE_CUDA(cudaMemcpy(out_host.data(), outs.data(), out_host.size() * 4, cudaMemcpyDeviceToHost));
        for (int64_t k = 0; k < pairs; ++k) {
          unsigned want = 0;
          for (int64_t b = 0; b < ctas; ++b) want ^= part_host[static_cast<size_t>(k * max_ctas + b)];
          row.ok = row.ok && want == out_host[static_cast<size_t>(k)];
        }
        all_ok = all_ok && row.ok;
        rows.push_back(row);
      }
    }

    fmt::print("bench_boundary on {}: {} pairs a graph, best of {} replays, us per pair\n", prop.name, pairs, replays);
    fmt::print("{:>6} {:>5} {:>10} {:>12} {:>10} {:>18} {:>6}\n", "ctas", "KB", "handoff", "producer", "pair",
               "consumer in place", "check");
    for (const Row& r : rows)
      fmt::print("{:6} {:5} {:>10} {:12.2f} {:10.2f} {:18.2f} {:>6}\n", r.ctas, r.kb, r.mode, r.producer_us, r.pair_us,
                 r.pair_us - r.producer_us, r.ok ? "ok" : "FAILED");
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_boundary: {}\n", e.what());
    return 1;
  }
}
