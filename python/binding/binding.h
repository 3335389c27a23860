// What the files of the binding share (python/binding/module.cpp says how errors map): reading Python
// values, the plan options' table, head arguments, the runtime's Python object and each file's bind_*().
// Arrays and DLPack are in arrays.h. Only the public headers (include/tfe) are included.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <tfe/accept_log.h>
#include <tfe/deploy.h>
#include <tfe/error.h>
#include <tfe/runtime.h>

namespace nb = nanobind;

namespace tfe::py {

// Throws tfe::Error (tfe.Error in Python) with a fmt-formatted message, each text argument as
// tfe::printable shows it, since any of them may come from input.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  auto shown = [](const auto& arg) -> decltype(auto) {
    if constexpr (std::is_convertible_v<decltype(arg), std::string_view>)
      return tfe::printable(std::string_view(arg));
    else
      return (arg);
  };
  const auto shown_args = std::tuple<decltype(shown(args))...>(shown(args)...);
  throw tfe::Error(std::apply(
      [&](const auto&... a) { return fmt::vformat(fmt::string_view(f), fmt::make_format_args(a...)); }, shown_args));
}

// ---------------------------------------------------------------------------------------------------------
// Python values (values.cpp)

[[noreturn]] void type_error(const std::string& what);
std::string py_type(nb::handle h);
// An int (or anything with __index__, such as a numpy integer) in [lo, hi]; bool is refused.
int64_t as_int(nb::handle h, const std::string& name, int64_t lo = std::numeric_limits<int64_t>::min(),
               int64_t hi = std::numeric_limits<int64_t>::max());
int as_int32(nb::handle h, const std::string& name);
bool as_bool(nb::handle h, const std::string& name);
std::string as_str(nb::handle h, const std::string& name);
std::filesystem::path as_path(nb::handle h, const std::string& name);
tfe::Fp8Mode as_fp8(nb::handle h, const std::string& name);
// A list or tuple (not a str, not an array): the items as handles.
std::optional<std::vector<nb::handle>> as_sequence(nb::handle h);
nb::object json_to_python(const std::string& text);
// The header as the head file stores it (`tfe.header` of __metadata__): the same names in Python.
nb::object header_dict(const tfe::HeadHeader& h);

// Plan options: one table of names for PlanOptions(**kw), compile, plan_yaml and Runtime.
const std::vector<std::string>& plan_option_names();
// `plan` (a PlanOptions or None) with the keyword arguments on top, validated as the planner will.
// nullopt when neither is given (the runtime then takes an artifact's options or the defaults).
std::optional<tfe::PlanOptions> plan_options_from(nb::handle plan, const nb::kwargs& kw, const std::string& call);

// The module's namedtuples (module.cpp).
extern nb::handle g_draft_result;  // collections.namedtuple DraftResult(tokens, confidences)
extern nb::handle g_tensor_info;   // collections.namedtuple TensorInfo(name, dtype, shape, nbytes)

// ---------------------------------------------------------------------------------------------------------
// Heads (head_file.cpp)

struct PyHead {
  std::shared_ptr<const tfe::HeadFile> file;
  std::string path;
};

struct PyPreset {
  std::string name;
  bool fp8 = false;
};

// A head argument: a tfe.HeadFile, or a path opened now.
std::shared_ptr<const tfe::HeadFile> head_arg(nb::handle h, const std::string& name, bool verify);

inline int64_t row_width(const tfe::HeadHeader& h) { return static_cast<int64_t>(h.taps.size()) * h.target_hidden; }

// ---------------------------------------------------------------------------------------------------------
// The accept log (accept_log.cpp)

// The accept log's counts (<tfe/accept_log.h>): lists indexed by window position - 1.
nb::dict accept_counts_dict(const tfe::AcceptCounts& c);
// record_accepted's kept: a list, tuple or range of ints (or anything iterable of ints, e.g. a numpy array).
std::vector<int> accepted_arg(nb::handle h);

// ---------------------------------------------------------------------------------------------------------
// Reference and Runtime: one thread at a time each. Calls run without the GIL, under the object's mutex,
// after every Python argument has been read.

struct PyRuntime {
  std::unique_ptr<tfe::Runtime> rt;
  std::string broken;  // the first CUDA failure: the C++ runtime refuses every later call, and so does this
  std::mutex mu;       // held by every call; a call that runs without the GIL releases it before taking the GIL
  // Time inside the library's calls made through run(), without the Python door around them: what stats()
  // reports as library_ns and library_calls, so that a caller can tell the door's cost from the library's.
  uint64_t library_ns = 0;
  uint64_t library_calls = 0;

  void check_usable() const {
    if (!broken.empty())
      throw tfe::CudaError(
          fmt::format("runtime: unusable after an earlier device failure ({}); close it and open a new one", broken));
  }
  // Reads the runtime with the GIL held (properties, stats).
  template <typename F>
  auto read(F&& f) -> decltype(f(std::declval<tfe::Runtime&>())) {
    check_usable();
    const std::lock_guard lock(mu);
    if (!rt) fail("runtime: closed");
    return f(*rt);
  }
  // Runs a call without the GIL; a CUDA failure marks the runtime unusable.
  template <typename F>
  auto run(F&& f) -> decltype(f(std::declval<tfe::Runtime&>())) {
    check_usable();
    try {
      nb::gil_scoped_release release;
      const std::lock_guard lock(mu);
      if (!rt) fail("runtime: closed");
      const auto t0 = std::chrono::steady_clock::now();
      struct Account {  // counted on return and on a throw alike
        PyRuntime& r;
        std::chrono::steady_clock::time_point t0;
        ~Account() {
          r.library_ns += static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
          ++r.library_calls;
        }
      } account{*this, t0};
      return f(*rt);
    } catch (const tfe::CudaError& e) {
      broken = e.what();
      throw;
    }
  }
  // Closing waits for the stream with the GIL held, so that no property read races the release.
  void close() {
    const std::lock_guard lock(mu);
    rt.reset();
  }
};

// Without a device the runtime cannot open; say so before anything else, as a device failure (runtime.cpp).
void require_cuda_device(int device);
// A call's stream: None is the runtime's own (nullopt), else a raw handle or a stream object's.
std::optional<cudaStream_t> call_stream(nb::handle s, int device);
// Views of a draft's outputs in the runtime's arena; the Runtime object stays alive while they do.
nb::object device_draft_result(PyRuntime& r, const tfe::DeviceDraftOutputs& o, int device);

// ---------------------------------------------------------------------------------------------------------
// Each file's classes and functions, added to the module in this order.

void bind_plan_options(nb::module_& m);  // values.cpp
void bind_heads(nb::module_& m);         // head_file.cpp
void bind_reference(nb::module_& m);     // reference.cpp
void bind_accept_log(nb::module_& m);    // accept_log.cpp
void bind_runtime(nb::module_& m);       // runtime.cpp
#ifdef TFE_HAVE_NCCL
void bind_broadcast(nb::module_& m);  // broadcast.cpp
#endif

}  // namespace tfe::py
