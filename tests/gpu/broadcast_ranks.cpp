// tfe_broadcast_ranks: the drafts-to-every-rank checks (include/tfe/broadcast.h), one process per GPU.
//
// The parent forks one child per rank before any CUDA call. Rank 0 opens a tfe::Runtime on a random tiny
// head and, per round, extends, drafts (draft_async) and sends; the other ranks open nothing but a
// DraftBroadcast and receive. Every rank copies each round's tokens and confidences to the host and writes
// them to its pipe; the parent checks that every rank got rank 0's bytes. Modes:
//   (default)       --rounds rounds, direct calls;
//   --capture       the same with rank 0's draft + send and the others' receive recorded once into each
//                   rank's own CUDA graph and replayed every round;
//   --kill-rank R   rank R exits at round --kill-after without a word; every surviving rank's wait() must
//                   throw within its timeout (--timeout-ms), naming it, instead of hanging;
//   --measure       no checks: rank 0 prints, at 1, 4 and 16 slots, the median draft and broadcast times
//                   (CUDA events around each on its stream, --rounds rounds).
// Exit status: 0 all checks passed; 1 a check failed; 77 fewer GPUs than --ranks (skipped, never passed).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <tfe/broadcast.h>
#include <tfe/runtime.h>

#include "core/error.h"
#include "head/presets.h"
#include "head/random_head.h"

namespace {

struct Options {
  int ranks = 2;
  int rounds = 20;
  int slots = 4;
  int steps = 4;
  bool capture = false;
  int kill_rank = -1;
  int kill_after = 5;
  int timeout_ms = 5000;
  bool measure = false;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw tfe::CudaError(fmt::format("{}: {}", what, cudaGetErrorName(e)));
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = write(fd, b, n);
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = read(fd, b, n);
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// One rank's whole life: rank 0 writes the unique id into every other rank's pipe of `id_pipes`.
// Writes, per round, [rows * steps] int32 then float32 to `results`; returns the exit status.
int rank_main(const Options& o, int rank, const std::vector<int>& id_pipes, int results) {
  check(cudaSetDevice(rank), "cudaSetDevice");
  ncclUniqueId id{};
  if (rank == 0) {
    id = tfe::DraftBroadcast::unique_id();
    for (int r = 1; r < o.ranks; ++r)
      if (!write_all(id_pipes[static_cast<size_t>(r)], &id, sizeof id)) return 1;
  } else if (!read_all(id_pipes[static_cast<size_t>(rank)], &id, sizeof id)) {
    return 1;
  }
  tfe::PlanOptions plan;
  plan.buckets = {1, 4, 16};
  plan.max_steps = o.steps;
  plan.max_slots = 16;
  tfe::BroadcastOptions bo{.max_streams = plan.buckets.back(),
                           .max_steps = plan.max_steps,
                           .device = rank,
                           .timeout = std::chrono::milliseconds(o.timeout_ms)};
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  tfe::DraftBroadcast bc = tfe::DraftBroadcast::create(id, o.ranks, rank, bo);

  std::optional<tfe::Runtime> rt;
  std::mt19937_64 rng(17);
  const tfe::HeadHeader h = tfe::preset_header("tiny");
  const int64_t width = static_cast<int64_t>(h.taps.size()) * h.target_hidden;
  std::vector<int> slots(static_cast<size_t>(o.slots));
  for (int s = 0; s < o.slots; ++s) slots[static_cast<size_t>(s)] = s;
  auto rows_of = [&](int slot, int64_t first, int64_t n, std::vector<tfe::bf16_bits>& taps,
                     std::vector<int32_t>& tokens) {
    taps.resize(static_cast<size_t>(n * width));
    tokens.resize(static_cast<size_t>(n));
    for (auto& t : taps) t = static_cast<tfe::bf16_bits>(0x3c00 + rng() % 512);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(h.vocab));
    return tfe::ExtendRequest{slot, first, n, taps, tokens};
  };
  std::vector<std::vector<tfe::bf16_bits>> taps(slots.size());
  std::vector<std::vector<int32_t>> tokens(slots.size());
  std::vector<std::byte> head_bytes;  // the head file, in memory, outlives the runtime's open
  if (rank == 0) {
    head_bytes = tfe::random_head(h, 5, false).serialize();
    tfe::OpenOptions oo;
    oo.plan = plan;
    oo.stream = stream;
    rt.emplace(tfe::Runtime::open(tfe::HeadFile::from_bytes(head_bytes), oo));
    std::vector<tfe::ExtendRequest> prefix;
    for (int s : slots)
      prefix.push_back(rows_of(s, 0, 3 + s, taps[static_cast<size_t>(s)], tokens[static_cast<size_t>(s)]));
    rt->extend(prefix);
  }
  int32_t* ids = nullptr;
  check(cudaMalloc(&ids, slots.size() * 4), "cudaMalloc ids");
  check(cudaMemcpy(ids, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice), "copy ids");

  if (o.measure) {
    cudaEvent_t e[3];
    for (auto& x : e) check(cudaEventCreate(&x), "cudaEventCreate");
    for (int n : {1, 4, 16}) {
      if (n > o.slots) break;
      std::vector<float> draft_us, send_us;
      for (int i = 0; i < o.rounds + 10; ++i) {
        if (rank == 0) {
          check(cudaEventRecord(e[0], stream), "record");
          const tfe::DeviceDraftOutputs d = rt->draft_async(ids, n, o.steps, {}, stream);
          check(cudaEventRecord(e[1], stream), "record");
          bc.send(d, stream);
          check(cudaEventRecord(e[2], stream), "record");
        } else {
          bc.receive(n, o.steps, stream);
        }
        bc.wait(stream);
        if (rank != 0 || i < 10) continue;  // 10 rounds of warm-up (captures, NCCL's first use)
        float a = 0, b = 0;
        check(cudaEventElapsedTime(&a, e[0], e[1]), "elapsed");
        check(cudaEventElapsedTime(&b, e[1], e[2]), "elapsed");
        draft_us.push_back(a * 1000);
        send_us.push_back(b * 1000);
      }
      if (rank == 0) {
        std::sort(draft_us.begin(), draft_us.end());
        std::sort(send_us.begin(), send_us.end());
        const float d = draft_us[draft_us.size() / 2], s = send_us[send_us.size() / 2];
        std::printf(
            "{\"ranks\": %d, \"slots\": %d, \"steps\": %d, \"draft_us\": %.1f, \"broadcast_us\": %.1f, "
            "\"broadcast_over_draft\": %.3f}\n",
            o.ranks, n, o.steps, d, s, s / d);
        std::fflush(stdout);
      }
    }
    return 0;
  }

  auto pass = [&](cudaStream_t s) {
    if (rank == 0) return bc.send(rt->draft_async(ids, o.slots, o.steps, {}, s), s);
    return bc.receive(o.slots, o.steps, s);
  };
  cudaGraphExec_t exec = nullptr;
  tfe::DeviceDraftOutputs out{};
  if (o.capture) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    out = pass(stream);
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(stream, &g), "end capture");
    check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
    cudaGraphDestroy(g);
  }
  const size_t entries = static_cast<size_t>(o.slots) * static_cast<size_t>(o.steps);
  std::vector<int32_t> got_tokens(entries);
  std::vector<float> got_confs(entries);
  for (int round = 0; round < o.rounds; ++round) {
    if (rank == o.kill_rank && round == o.kill_after) _exit(9);
    try {
      if (o.capture)
        check(cudaGraphLaunch(exec, stream), "graph launch");
      else
        out = pass(stream);
      bc.wait(stream);
    } catch (const tfe::Error& e) {
      std::fprintf(stderr, "rank %d round %d: %s\n", rank, round, e.what());
      return o.kill_rank >= 0 ? 3 : 1;  // 3: the failure a killed rank must cause
    }
    check(cudaMemcpy2D(got_tokens.data(), o.steps * 4, out.tokens, out.row_stride * 4, o.steps * 4, o.slots,
                       cudaMemcpyDeviceToHost),
          "read tokens");
    check(cudaMemcpy2D(got_confs.data(), o.steps * 4, out.confidences, out.row_stride * 4, o.steps * 4, o.slots,
                       cudaMemcpyDeviceToHost),
          "read confidences");
    if (!write_all(results, got_tokens.data(), entries * 4) || !write_all(results, got_confs.data(), entries * 4))
      return 1;
    if (rank == 0) {
      std::vector<tfe::ExtendRequest> next;
      for (int s : slots)
        next.push_back(rows_of(s, rt->slots().last_pos(s) + 1, 1 + (round + s) % 3, taps[static_cast<size_t>(s)],
                               tokens[static_cast<size_t>(s)]));
      rt->extend(next);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"tfe_broadcast_ranks: drafts from rank 0 to every rank, one process per GPU"};
  app.add_option("--ranks", o.ranks, "processes, one GPU each")->check(CLI::Range(1, 8));
  app.add_option("--rounds", o.rounds)->check(CLI::PositiveNumber);
  app.add_flag("--capture", o.capture, "record draft + send / receive into each rank's own graph");
  app.add_option("--kill-rank", o.kill_rank, "this rank exits without a word at round --kill-after");
  app.add_option("--kill-after", o.kill_after);
  app.add_option("--timeout-ms", o.timeout_ms, "each rank's wait() bound")->check(CLI::PositiveNumber);
  app.add_flag("--measure", o.measure, "rank 0 prints draft and broadcast times at 1, 4 and 16 slots");
  app.add_option("--slots", o.slots, "sequences (--measure: the most measured)")->check(CLI::Range(1, 16));
  CLI11_PARSE(app, argc, argv);

  // Counting devices initializes CUDA in this process, which a forked child must not inherit: ask a child.
  int devices = 0;
  {
    int p[2];
    if (pipe(p) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
      _exit(write_all(p[1], &n, sizeof n) ? 0 : 1);
    }
    close(p[1]);
    if (!read_all(p[0], &devices, sizeof devices)) devices = 0;
    close(p[0]);
    waitpid(pid, nullptr, 0);
  }
  if (devices < o.ranks) {
    std::printf("skipped: %d ranks need %d GPUs, %d found\n", o.ranks, o.ranks, devices);
    return 77;
  }

  std::vector<int> id_read(static_cast<size_t>(o.ranks), -1), id_write(id_read), out_read(id_read), out_write(id_read);
  for (int r = 0; r < o.ranks; ++r) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) return 1;
    id_read[static_cast<size_t>(r)] = a[0];
    id_write[static_cast<size_t>(r)] = a[1];
    out_read[static_cast<size_t>(r)] = b[0];
    out_write[static_cast<size_t>(r)] = b[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<int> ids = r == 0 ? id_write : id_read;  // rank 0 writes every id; the others read their own
      int status = 1;
      try {
        status = rank_main(o, r, ids, out_write[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      _exit(status);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < o.ranks; ++r) close(out_write[static_cast<size_t>(r)]);

  if (o.measure) {
    int bad = 0;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return bad == 0 ? 0 : 1;
  }
  const size_t bytes = static_cast<size_t>(o.slots) * static_cast<size_t>(o.steps) * 8;
  int failures = 0, rounds_checked = 0;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<char> zero(bytes), other(bytes);
    if (!read_all(out_read[0], zero.data(), bytes)) break;
    bool all = true;
    for (int r = 1; r < o.ranks; ++r) {
      if (!read_all(out_read[static_cast<size_t>(r)], other.data(), bytes)) {
        all = false;
        break;
      }
      if (std::memcmp(zero.data(), other.data(), bytes) != 0) {
        std::fprintf(stderr, "round %d: rank %d received other bytes than rank 0 sent\n", round, r);
        ++failures;
      }
    }
    if (!all) break;
    ++rounds_checked;
  }
  int killed_ok = 0, bad_exit = 0;
  for (int r = 0; r < o.ranks; ++r) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (o.kill_rank >= 0) {
      if (r == o.kill_rank) continue;
      if (code == 3)
        ++killed_ok;
      else
        ++bad_exit, std::fprintf(stderr, "rank %d exited %d; a surviving rank must report the lost rank\n", r, code);
    } else if (code != 0) {
      ++bad_exit;
      std::fprintf(stderr, "rank %d exited %d\n", r, code);
    }
  }
  if (o.kill_rank >= 0) {
    std::printf("killed rank %d at round %d: %d of %d surviving ranks reported it within %d ms\n", o.kill_rank,
                o.kill_after, killed_ok, o.ranks - 1, o.timeout_ms);
    return killed_ok == o.ranks - 1 && bad_exit == 0 ? 0 : 1;
  }
  std::printf("%d ranks, %d rounds%s: %d rounds equal on every rank, %d mismatches\n", o.ranks, rounds_checked,
              o.capture ? " (captured)" : "", rounds_checked, failures);
  return failures == 0 && bad_exit == 0 && rounds_checked == o.rounds ? 0 : 1;
}
