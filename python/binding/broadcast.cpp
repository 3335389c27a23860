// tfe.DraftBroadcast: rank 0's drafts to every rank through NCCL (<tfe/broadcast.h>). Built where NCCL is.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <tfe/broadcast.h>

#include "arrays.h"
#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

namespace {

struct PyBroadcast {
  std::unique_ptr<tfe::DraftBroadcast> bc;
  int device = 0;
  std::mutex mu;
};

}  // namespace

void bind_broadcast(nb::module_& m) {
  m.def(
      "nccl_unique_id",
      [] {
        const ncclUniqueId id = tfe::DraftBroadcast::unique_id();
        return nb::bytes(id.internal, sizeof id.internal);
      },
      "Rank 0's NCCL unique id (bytes) for DraftBroadcast; hand it to every rank (torch.distributed."
      "broadcast_object_list).");
  nb::class_<PyBroadcast>(m, "DraftBroadcast",
                          "Drafts from rank 0 to every rank through NCCL (include/tfe/broadcast.h).")
      .def(
          "__init__",
          [](PyBroadcast* self, nb::bytes id, nb::handle ranks, nb::handle rank, nb::handle max_streams,
             nb::handle max_steps, nb::handle device, nb::handle timeout) {
            ncclUniqueId uid{};
            if (id.size() != sizeof uid.internal)
              fail("unique_id: {} bytes; an NCCL unique id is {} (tfe.nccl_unique_id())", id.size(),
                   sizeof uid.internal);
            std::memcpy(uid.internal, id.c_str(), sizeof uid.internal);
            tfe::BroadcastOptions o;
            o.max_streams = as_int32(max_streams, "max_streams");
            o.max_steps = as_int32(max_steps, "max_steps");
            o.device = as_int32(device, "device");
            const double seconds = nb::cast<double>(timeout);
            if (!(seconds > 0) || seconds > 86400) fail("timeout: {} s is outside (0, 86400]", seconds);
            o.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
            const int n = as_int32(ranks, "ranks"), r = as_int32(rank, "rank");
            require_cuda_device(o.device);
            std::unique_ptr<tfe::DraftBroadcast> bc;
            {
              nb::gil_scoped_release release;
              bc = std::make_unique<tfe::DraftBroadcast>(tfe::DraftBroadcast::create(uid, n, r, o));
            }
            new (self) PyBroadcast{std::move(bc), o.device, {}};
          },
          "unique_id"_a, "ranks"_a.none(), "rank"_a.none(), nb::kw_only(), "max_streams"_a.none(), "max_steps"_a.none(),
          "device"_a.none() = 0, "timeout"_a.none() = 60.0)
      .def_prop_ro("rank", [](PyBroadcast& b) { return b.bc->rank(); })
      .def_prop_ro("ranks", [](PyBroadcast& b) { return b.bc->ranks(); })
      .def(
          "send",
          [](PyBroadcast& b, PyRuntime& r, nb::handle stream) {
            const auto [o, device] = r.read([](tfe::Runtime& rt) {
              return std::pair{rt.device_outputs(), rt.device()};
            });
            const std::optional<cudaStream_t> s = call_stream(stream, device);
            const cudaStream_t st = s ? *s : r.read([](tfe::Runtime& rt) { return rt.stream(); });
            {
              nb::gil_scoped_release release;
              const std::lock_guard lock(b.mu);
              b.bc->send(o, st);
            }
            return device_draft_result(r, o, device);
          },
          "runtime"_a, nb::kw_only(), "stream"_a.none() = nb::none(),
          "Rank 0: broadcasts the runtime's last draft (device_outputs) to every rank; returns it.")
      .def(
          "receive",
          [](PyBroadcast& b, nb::handle rows, nb::handle steps, nb::handle stream) {
            const int n = as_int32(rows, "rows"), k = as_int32(steps, "steps");
            const std::optional<cudaStream_t> s = call_stream(stream, b.device);
            tfe::DeviceDraftOutputs o;
            {
              nb::gil_scoped_release release;
              const std::lock_guard lock(b.mu);
              o = b.bc->receive(n, k, s.value_or(cudaStreamPerThread));
            }
            const size_t shape[2] = {static_cast<size_t>(o.rows), static_cast<size_t>(o.steps)};
            const int64_t strides[2] = {o.row_stride, 1};
            nb::object owner = nb::find(&b);
            auto view = [&](const void* data, dl::dtype d) {
              return nb::ndarray<>(const_cast<void*>(data), 2, shape, owner, strides, d, nb::device::cuda::value,
                                   b.device)
                  .cast();
            };
            return g_draft_result(view(o.tokens, nb::dtype<int32_t>()), view(o.confidences, nb::dtype<float>()));
          },
          "rows"_a.none(), "steps"_a.none(), nb::kw_only(), "stream"_a.none() = nb::none(),
          "Other ranks: receives rows x steps from rank 0; device arrays, valid until the next receive. `stream`:\n"
          "None is CUDA's per-thread default stream; an engine passes its own (torch.cuda.current_stream()).")
      .def(
          "wait",
          [](PyBroadcast& b, nb::handle stream) {
            const std::optional<cudaStream_t> s = call_stream(stream, b.device);
            nb::gil_scoped_release release;
            const std::lock_guard lock(b.mu);
            b.bc->wait(s.value_or(cudaStreamPerThread));
          },
          nb::kw_only(), "stream"_a.none() = nb::none(),
          "Waits for the stream within the timeout; raises tfe.CudaError (and aborts the communicator) past it.");
}

}  // namespace tfe::py
