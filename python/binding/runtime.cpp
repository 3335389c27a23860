// tfe.Runtime: one draft head on one GPU (<tfe/runtime.h>).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <tfe/runtime.h>

#include "arrays.h"
#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

// Without a device the runtime cannot open; say so before anything else, as a device failure.
void require_cuda_device(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    // Without a driver the runtime library reports cudaErrorInsufficientDriver too: say both.
    throw tfe::CudaError(fmt::format(
        "tfe.Runtime needs a CUDA device and found none: cudaGetDeviceCount reports {} ({}), as it does where "
        "there is no NVIDIA driver or one older than CUDA {}.{}; tfe.Reference runs a head on the CPU",
        cudaGetErrorName(e), cudaGetErrorString(e), CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10));
  }
  if (count == 0)
    throw tfe::CudaError("tfe.Runtime needs a CUDA device and found none; tfe.Reference runs a head on the CPU");
  if (device < 0 || device >= count) fail("device: {} is outside 0..{} ({} CUDA devices)", device, count - 1, count);
}

namespace {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// stream: None (the runtime makes its own), a raw cudaStream_t as an int, or an object with .cuda_stream
// (torch.cuda.Stream) or .ptr (cupy.cuda.Stream).
cudaStream_t stream_arg(nb::handle s, int device) {
  if (s.is_none()) return nullptr;
  std::string what = "stream";
  nb::handle value = s;
  nb::object attr;
  if (!PyIndex_Check(s.ptr()) || PyBool_Check(s.ptr())) {
    if (nb::hasattr(s, "cuda_stream")) {
      attr = s.attr("cuda_stream");
      what = "stream.cuda_stream";
    } else if (nb::hasattr(s, "ptr")) {
      attr = s.attr("ptr");
      what = "stream.ptr";
    } else {
      type_error(
          fmt::format("stream: expected None, an int handle, or a stream with .cuda_stream (torch) or .ptr "
                      "(CuPy), got {}",
                      py_type(s)));
    }
    value = attr;
    if (nb::hasattr(s, "device")) {
      // torch.cuda.Stream.device: the stream belongs to one device, which must be the runtime's.
      nb::object dev = s.attr("device");
      if (nb::hasattr(dev, "index") && !dev.attr("index").is_none()) {
        const int64_t index = as_int(dev.attr("index"), "stream.device.index");
        if (index != device) fail("stream: on cuda:{}, but the runtime opens device {}", index, device);
      }
    }
  }
  const int64_t handle = as_int(value, what, 0);
  // 0 is the null stream (torch's and CuPy's default), which C++ spells cudaStreamLegacy: a null
  // cudaStream_t in OpenOptions would mean "the runtime's own".
  if (handle == 0) return cudaStreamLegacy;
  return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(handle));
}

nb::dict stats_dict(const tfe::RuntimeStats& s) {
  nb::dict d;
  d["replays"] = s.replays;
  d["eager_passes"] = s.eager_passes;
  d["extend_chunks"] = s.extend_chunks;
  d["captures"] = s.captures;
  d["graph_updates"] = s.graph_updates;
  d["bytes_uploaded"] = s.bytes_uploaded;
  d["bytes_downloaded"] = s.bytes_downloaded;
  d["weight_bytes"] = s.weight_bytes;
  d["l2_set_aside"] = s.l2_set_aside;
  return d;
}

// A checked extend on the runtime, in the form its first request has (one_form refuses a mix).
void extend_runtime(PyRuntime& r, std::vector<AnyRequest>&& any, std::optional<cudaStream_t> s) {
  if (!any.empty() && std::holds_alternative<tfe::DeviceExtendRequest>(any[0])) {
    const auto requests = one_form<tfe::DeviceExtendRequest>(std::move(any));
    r.run([&](tfe::Runtime& rt) { rt.extend(requests, s); });
  } else {
    const auto requests = one_form<tfe::ExtendRequest>(std::move(any));
    r.run([&](tfe::Runtime& rt) { rt.extend(requests, s); });
  }
}

}  // namespace

// A call's stream: None is the runtime's own (nullopt), else as stream_arg reads it.
std::optional<cudaStream_t> call_stream(nb::handle s, int device) {
  if (s.is_none()) return std::nullopt;
  return stream_arg(s, device);
}

// Views of a draft's outputs in the runtime's arena, [rows, steps] with their row stride: the Runtime object
// stays alive while they do. Not flagged read-only, which some consumers' from_dlpack refuses; the next
// draft overwrites them anyway.
nb::object device_draft_result(PyRuntime& r, const tfe::DeviceDraftOutputs& o, int device) {
  const size_t shape[2] = {static_cast<size_t>(o.rows), static_cast<size_t>(o.steps)};
  const int64_t strides[2] = {o.row_stride, 1};
  nb::object owner = nb::find(&r);
  auto view = [&](const void* data, dl::dtype d) {
    return nb::ndarray<>(const_cast<void*>(data), 2, shape, owner, strides, d, nb::device::cuda::value, device).cast();
  };
  return g_draft_result(view(o.tokens, nb::dtype<int32_t>()), view(o.confidences, nb::dtype<float>()));
}

void bind_runtime(nb::module_& m) {
  m.def("cuda_device_count", &cuda_device_count, "CUDA devices visible to this process (0 without a driver).");

  nb::class_<PyRuntime>(m, "Runtime", "One draft head on one GPU (tfe::Runtime).")
      .def(
          "__init__",
          [](PyRuntime* self, nb::handle head, nb::handle artifact, nb::handle stream, nb::handle device,
             nb::handle plan, nb::handle graphs, nb::handle verify, nb::handle recompile, nb::handle log_every,
             nb::handle log_path, nb::handle log_label, nb::handle tap_dump, nb::handle tap_dump_max_rows,
             nb::handle self_check, const nb::kwargs& kw) {
            tfe::OpenOptions o;
            if (kw.contains("arch"))
              type_error("Runtime() takes no arch: the runtime plans for its device's architecture");
            o.plan = plan_options_from(plan, kw, "Runtime");
            if (!artifact.is_none()) o.artifact_dir = as_path(artifact, "artifact").string();
            o.device = as_int32(device, "device");
            o.stream = stream_arg(stream, o.device);
            o.graphs = as_bool(graphs, "graphs");
            o.verify_sha256 = as_bool(verify, "verify");
            o.recompile_mismatched_artifact = as_bool(recompile, "recompile_mismatched_artifact");
            o.accept_log.every =
                static_cast<int>(as_int(log_every, "accept_log_every", 0, std::numeric_limits<int>::max()));
            o.accept_log.path = log_path.is_none() ? std::string() : as_path(log_path, "accept_log_path").string();
            o.accept_log.label = as_str(log_label, "accept_log_label");
            o.tap_dump.path = tap_dump.is_none() ? std::string() : as_path(tap_dump, "tap_dump").string();
            o.tap_dump.max_rows =
                as_int(tap_dump_max_rows, "tap_dump_max_rows", 1, std::numeric_limits<int32_t>::max());
            o.self_check = as_bool(self_check, "self_check");
            std::shared_ptr<const tfe::HeadFile> file;
            std::string path;
            if (nb::isinstance<PyHead>(head))
              file = nb::cast<PyHead&>(head).file;
            else
              path = as_path(head, "head").string();
            std::unique_ptr<tfe::Runtime> rt;
            try {
              nb::gil_scoped_release release;
              rt = std::make_unique<tfe::Runtime>(file ? tfe::Runtime::open(*file, o) : tfe::Runtime::open(path, o));
            } catch (const tfe::CudaError&) {
              // Runtime::open applies the environment and refuses the options before it looks for the
              // device; a device it did not find is then said the Python way.
              require_cuda_device(o.device);
              throw;
            }
            new (self) PyRuntime{std::move(rt), {}, {}};
          },
          "head"_a.none(), "artifact"_a.none() = nb::none(), nb::kw_only(), "stream"_a.none() = nb::none(),
          "device"_a.none() = 0, "plan"_a.none() = nb::none(), "graphs"_a.none() = true, "verify"_a.none() = false,
          "recompile_mismatched_artifact"_a.none() = false, "accept_log_every"_a.none() = 0,
          "accept_log_path"_a.none() = "", "accept_log_label"_a.none() = "", "tap_dump"_a.none() = "",
          "tap_dump_max_rows"_a.none() = tfe::TapDumpOptions{}.max_rows, "self_check"_a.none() = false, "options"_a,
          nb::sig("def __init__(self, head: str | os.PathLike[str] | HeadFile, artifact: str | os.PathLike[str] | None "
                  "= None, *, stream: object = None, device: int = 0, plan: PlanOptions | None = None, "
                  "graphs: bool = True, verify: bool = False, recompile_mismatched_artifact: bool = False, "
                  "accept_log_every: int = 0, "
                  "accept_log_path: str | os.PathLike[str] = '', accept_log_label: str = '', "
                  "tap_dump: str | os.PathLike[str] = '', tap_dump_max_rows: int = 65536, self_check: bool = False, "
                  "max_slots: int = ..., max_steps: int = ..., **options: object) -> None"),
          "Opens the head on a GPU. max_slots, max_steps and the other plan options (tfe.plan_option_names())\n"
          "not given come from the artifact, else the defaults (PlanOptions).")
      .def(
          "extend",
          [](PyRuntime& r, nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens, nb::handle stream) {
            std::vector<Array> arrays;
            const auto [width, device] = r.read([](tfe::Runtime& rt) {
              return std::pair{row_width(rt.header()), rt.device()};
            });
            auto any = extend_args(a, first_pos, taps, tokens, width, arrays, device);
            extend_runtime(r, std::move(any), call_stream(stream, device));
          },
          "requests"_a.none(), "first_pos"_a.none() = nb::none(), "taps"_a.none() = nb::none(),
          "tokens"_a.none() = nb::none(), nb::kw_only(), "stream"_a.none() = nb::none(),
          nb::sig("def extend(self, requests: int | Sequence[tuple[int, int, object, object]], first_pos: int | None "
                  "= None, taps: object = None, tokens: object = None, *, stream: object = None) -> None"),
          "Absorbs real rows: taps [rows, taps * target_hidden] bfloat16 and tokens [rows] int32, both on the host\n"
          "or both on the runtime's device (no copy to the host; rows of device taps may be any stride apart).\n"
          "Enqueued on `stream` (None: the runtime's stream); device tensors must be ready in that stream's order.")
      .def(
          "extend_batch",
          [](PyRuntime& r, nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
             nb::handle tokens, nb::handle starts, nb::handle stream) {
            std::vector<Array> arrays;
            const auto [width, device] = r.read([](tfe::Runtime& rt) {
              return std::pair{row_width(rt.header()), rt.device()};
            });
            auto any = check_batch(slots, first_pos, counts, taps, tokens, starts, width, arrays, device);
            extend_runtime(r, std::move(any), call_stream(stream, device));
          },
          "slots"_a.none(), "first_pos"_a.none(), "counts"_a.none(), "taps"_a.none(), "tokens"_a.none(), nb::kw_only(),
          "starts"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
          nb::sig("def extend_batch(self, slots: Sequence[int] | object, first_pos: Sequence[int] | object, "
                  "counts: Sequence[int] | object, taps: object, tokens: object, *, "
                  "starts: Sequence[int] | None = None, stream: object = None) -> None"),
          "extend for several slots from one pair of arrays (host or device), as an engine holds the rows after\n"
          "verification: request i is slots[i] at first_pos[i], taking counts[i] rows from row starts[i] (default:\n"
          "right after the previous request's rows). slots, first_pos, counts and starts are host ints. Two array\n"
          "imports a call instead of two a slot: the cheap form from Python.")
      .def(
          "draft",
          [](PyRuntime& r, nb::handle slots, nb::handle steps, nb::handle first_ranks) {
            const std::vector<int> s = check_slots(slots);
            const int n = as_int32(steps, "steps");
            const std::vector<int> ranks = host_first_ranks(first_ranks, "draft");
            return draft_result(r.run([&](tfe::Runtime& rt) { return rt.draft(s, n, ranks); }));
          },
          "slots"_a.none(), "steps"_a.none(), nb::kw_only(), "first_ranks"_a.none() = nb::none(),
          nb::sig("def draft(self, slots: Sequence[int] | object, steps: int, *, "
                  "first_ranks: Sequence[int] | None = None) -> DraftResult"),
          "One graph replay: `steps` tokens after each slot's last row, (tokens, confidences) numpy [slots, steps].\n"
          "first_ranks (a runtime opened with the plan option first_ranks): per slot, the rank of step 1's token\n"
          "(0: the best .. 7), the branches of a draft tree, as Reference.draft's.")
      .def(
          "reset",
          [](PyRuntime& r, nb::handle slot, nb::handle stream) {
            const int s = as_int32(slot, "slot");
            const std::optional<cudaStream_t> st =
                call_stream(stream, r.read([](tfe::Runtime& rt) { return rt.device(); }));
            r.run([&](tfe::Runtime& rt) { rt.reset(s, st); });
          },
          "slot"_a.none(), nb::kw_only(), "stream"_a.none() = nb::none(),
          nb::sig("def reset(self, slot: int, *, stream: object = None) -> None"),
          "Empties the slot: its next extend starts a new sequence.")
      .def(
          "draft_async",
          [](PyRuntime& r, nb::handle slots, nb::handle steps, nb::handle tokens, nb::handle confidences,
             nb::handle stream, nb::handle first_ranks) {
            const int n_steps = as_int32(steps, "steps");
            const int device = r.read([](tfe::Runtime& rt) { return rt.device(); });
            const std::optional<cudaStream_t> s = call_stream(stream, device);
            std::vector<Array> arrays;
            // Slot ids on the device: read there at every replay of a capture. Otherwise a host list.
            const int32_t* device_ids = nullptr;
            int n = 0;
            std::vector<int> host_ids;
            Array ids;
            if (nb::try_cast(slots, ids) && on_cuda(ids)) {
              check_place(ids, "slots", "draft_async", device);
              if (!is(ids.dtype(), dl::dtype_code::Int, 32))
                fail("slots: expected int32 on the device, got {}", dtype_text(ids.dtype()));
              check_ndim(ids, "slots", 1, "[streams]");
              check_layout(ids, "slots");
              device_ids = static_cast<const int32_t*>(ids.data());
              n = static_cast<int>(ids.shape(0));
              arrays.push_back(ids);
            } else {
              host_ids = check_slots(slots);
              n = static_cast<int>(host_ids.size());
            }
            // First ranks where the ids are: on the device with device ids, else a host list.
            const int32_t* device_ranks = nullptr;
            std::vector<int> host_ranks;
            if (device_ids && !first_ranks.is_none()) {
              Array ranks;
              if (!nb::try_cast(first_ranks, ranks) || !on_cuda(ranks))
                fail("first_ranks: expected an int32 CUDA tensor, as the slots are on the device");
              check_place(ranks, "first_ranks", "draft_async", device);
              if (!is(ranks.dtype(), dl::dtype_code::Int, 32))
                fail("first_ranks: expected int32 on the device, got {}", dtype_text(ranks.dtype()));
              check_ndim(ranks, "first_ranks", 1, "[streams]");
              check_layout(ranks, "first_ranks");
              if (static_cast<int>(ranks.shape(0)) != n)
                fail("first_ranks: {} ranks for {} slots (one a slot)", ranks.shape(0), n);
              device_ranks = static_cast<const int32_t*>(ranks.data());
              arrays.push_back(ranks);
            } else if (!device_ids) {
              host_ranks = host_first_ranks(first_ranks, "draft_async");
            }
            tfe::DraftTargets t;
            if (!tokens.is_none())
              t.tokens = static_cast<int32_t*>(check_target(tokens, "tokens", n, n_steps, nb::dtype<int32_t>(), "int32",
                                                            device, t.row_stride, arrays));
            if (!confidences.is_none())
              t.confidences = static_cast<float*>(check_target(
                  confidences, "confidences", n, n_steps, nb::dtype<float>(), "float32", device, t.row_stride, arrays));
            const tfe::DeviceDraftOutputs o = r.run([&](tfe::Runtime& rt) {
              return device_ids ? rt.draft_async(device_ids, n, n_steps, t, s, device_ranks)
                                : rt.draft_async(host_ids, n_steps, t, s, host_ranks);
            });
            return device_draft_result(r, o, device);
          },
          "slots"_a.none(), "steps"_a.none(), nb::kw_only(), "tokens"_a.none() = nb::none(),
          "confidences"_a.none() = nb::none(), "stream"_a.none() = nb::none(), "first_ranks"_a.none() = nb::none(),
          nb::sig("def draft_async(self, slots: Sequence[int] | object, steps: int, *, tokens: object = None, "
                  "confidences: object = None, stream: object = None, "
                  "first_ranks: Sequence[int] | object = None) -> DraftResult"),
          "Enqueues a draft and returns at once: (tokens, confidences) as device arrays [slots, steps] (DLPack,\n"
          "torch.from_dlpack takes them), valid until the next draft. `slots`: a list of ints, or an int32 CUDA\n"
          "tensor whose ids are read on the device (the form a torch.cuda.graph capture can record; the ids may\n"
          "change between replays). `tokens`/`confidences`: CUDA tensors [slots, >= steps] the outputs are also\n"
          "copied into. Enqueued on `stream` (None: the runtime's stream; inside a capture, pass\n"
          "torch.cuda.current_stream()). `first_ranks`: as draft's, a list with host slots or an int32 CUDA\n"
          "tensor [slots] with device slots (read on the device, checked there).")
      .def_prop_ro(
          "draft_slots",
          [](PyRuntime& r) {
            const auto [p, rows, device] = r.read([](tfe::Runtime& rt) {
              return std::tuple{rt.draft_slots(), rt.plan_options().buckets.back(), rt.device()};
            });
            const size_t shape[1] = {static_cast<size_t>(rows)};
            return nb::ndarray<>(p, 1, shape, nb::find(&r), nullptr, nb::dtype<int32_t>(), nb::device::cuda::value,
                                 device)
                .cast();
          },
          "The runtime's own slot-id buffer on the device [largest bucket] int32: write ids here and pass it (or a\n"
          "slice) to draft_async.")
      .def(
          "device_outputs",
          [](PyRuntime& r) {
            const auto [o, device] = r.read([](tfe::Runtime& rt) {
              return std::pair{rt.device_outputs(), rt.device()};
            });
            if (!o.tokens || o.rows < 1) fail("device_outputs: no draft has run yet");
            return device_draft_result(r, o, device);
          },
          "The last draft's tokens and confidences on the device, as DLPack arrays (torch.from_dlpack takes them):\n"
          "[slots, steps] with a row stride of max_steps, written in the runtime's stream order, valid until the\n"
          "next draft.")
      .def("synchronize", [](PyRuntime& r) { r.run([](tfe::Runtime& rt) { rt.synchronize(); }); })
      .def(
          "record_accepted",
          [](PyRuntime& r, nb::handle kept, nb::handle steps) {
            const std::vector<int> k = accepted_arg(kept);
            const int n = as_int32(steps, "steps");
            r.read([&](tfe::Runtime& rt) { rt.record_accepted(k, n); });
          },
          "kept"_a.none(), "steps"_a.none(),
          nb::sig("def record_accepted(self, kept: Sequence[int] | object, steps: int) -> None"),
          "After the target verified a round: kept[i] of the `steps` tokens drafted for the i-th slot of that\n"
          "round's draft were accepted. Counted in accept_totals() and written to the accept log.")
      .def(
          "write_tap_dump", [](PyRuntime& r) { r.run([](tfe::Runtime& rt) { rt.write_tap_dump(); }); },
          "Writes the tap dump's safetensors file now, with every row kept so far (it is written again at close).")
      .def("accept_totals",
           [](PyRuntime& r) { return accept_counts_dict(r.read([](tfe::Runtime& rt) { return rt.accept_totals(); })); })
      .def("stats",
           [](PyRuntime& r) {
             return r.read([&](tfe::Runtime& rt) {
               nb::dict d = stats_dict(rt.stats());
               d["library_ns"] = r.library_ns;  // under the lock that run() counts under
               d["library_calls"] = r.library_calls;
               return d;
             });
           })
      .def_prop_ro("plan_options",
                   [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return rt.plan_options(); }); })
      .def_prop_ro("header",
                   [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return header_dict(rt.header()); }); })
      .def_prop_ro("fp8_in_use", [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return rt.fp8_in_use(); }); })
      .def_prop_ro("ring_rows", [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return rt.ring_rows(); }); })
      .def_prop_ro("device", [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return rt.device(); }); })
      .def_prop_ro("stream",
                   [](PyRuntime& r) {
                     return r.read([](tfe::Runtime& rt) {
                       // The handle Python code passes for the null stream (see stream_arg).
                       return rt.stream() == cudaStreamLegacy ? uintptr_t{0} : reinterpret_cast<uintptr_t>(rt.stream());
                     });
                   })
      .def_prop_ro("graphs_enabled",
                   [](PyRuntime& r) { return r.read([](tfe::Runtime& rt) { return rt.graphs_enabled(); }); })
      .def_prop_ro("closed",
                   [](PyRuntime& r) {
                     const std::lock_guard lock(r.mu);
                     return !r.rt;
                   })
      .def("close", &PyRuntime::close, "Releases the device memory, graphs and stream now; later calls are refused.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__", [](PyRuntime& r, nb::handle, nb::handle, nb::handle) { r.close(); }, nb::arg().none(),
          nb::arg().none(), nb::arg().none());
}

}  // namespace tfe::py
