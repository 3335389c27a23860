// tfe._tfe: the Python binding of tfe (nanobind). Arrays arrive through DLPack or the buffer protocol
// (torch, CuPy, JAX, numpy) without a copy. Every argument is checked here before the library sees it:
// a wrong type, dtype, shape, device, stride or alignment is refused naming the argument, the expected and
// the actual, so that the library never reads past what an array holds. Errors map by C++ type:
//   tfe::CudaError (a CUDA or cuBLASLt call failed; device state unknown)  -> tfe.CudaError (RuntimeError)
//   tfe::Error (a refused call; nothing changed), and the checks below      -> tfe.Error (ValueError)
//   a Python value of the wrong type (a str for an int)                     -> TypeError
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tfe/deploy.h>
#include <tfe/runtime.h>
#ifdef TFE_HAVE_NCCL
#include <tfe/broadcast.h>
#endif

#include "core/error.h"
#include "core/limits.h"
#include "plan/plan.h"
#include <tfe/reference.h>
#include "runtime/accept_log.h"
#include "runtime/self_check.h"
#include "runtime/tap_dump.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using tfe::fail;

// ---------------------------------------------------------------------------------------------------------
// Python values

[[noreturn]] void type_error(const std::string& what) { throw nb::type_error(what.c_str()); }

std::string py_type(nb::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// An int (or anything with __index__, such as a numpy integer) in [lo, hi]; bool is refused, since a
// flag passed where a count belongs is a mistake.
int64_t as_int(nb::handle h, const std::string& name, int64_t lo = std::numeric_limits<int64_t>::min(),
               int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    type_error(fmt::format("{}: expected an int, got {}", name, py_type(h)));
  nb::object index = nb::steal(PyNumber_Index(h.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) fail("{}: {} is outside {}..{}", name, nb::str(index).c_str(), lo, hi);
  return v;
}

int as_int32(nb::handle h, const std::string& name) {
  return static_cast<int>(as_int(h, name, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

bool as_bool(nb::handle h, const std::string& name) {
  if (!PyBool_Check(h.ptr())) type_error(fmt::format("{}: expected a bool, got {}", name, py_type(h)));
  return h.ptr() == Py_True;
}

std::string as_str(nb::handle h, const std::string& name) {
  if (!nb::isinstance<nb::str>(h)) type_error(fmt::format("{}: expected a str, got {}", name, py_type(h)));
  return nb::cast<std::string>(h);
}

std::filesystem::path as_path(nb::handle h, const std::string& name) {
  std::filesystem::path p;
  if (nb::isinstance<nb::str>(h) || nb::hasattr(h, "__fspath__")) {
    // A NUL byte would otherwise read as "not a path": no file name holds one, so it is named as such.
    nb::object text = nb::steal(PyOS_FSPath(h.ptr()));
    if (!text.is_valid()) throw nb::python_error();
    std::string s;
    if (nb::isinstance<nb::str>(text) && nb::try_cast(text, s))
      if (const size_t at = s.find('\0'); at != std::string::npos)
        fail("{}: {:?} holds a NUL byte at offset {}; no file name can", name, s, at);
    if (nb::try_cast(h, p)) return p;
  }
  type_error(fmt::format("{}: expected a path (str or os.PathLike), got {}", name, py_type(h)));
}

tfe::Fp8Mode as_fp8(nb::handle h, const std::string& name) {
  const std::string s = as_str(h, name);
  if (s != "auto" && s != "off" && s != "require") fail("{}: `{}` is not one of auto, off, require", name, s);
  return tfe::fp8_mode_from_name(s);
}

// A list or tuple (not a str, not an array): the items as handles.
std::optional<std::vector<nb::handle>> as_sequence(nb::handle h) {
  if (!nb::isinstance<nb::list>(h) && !nb::isinstance<nb::tuple>(h) && !PyRange_Check(h.ptr())) return std::nullopt;
  std::vector<nb::handle> out;
  for (nb::handle item : h) out.push_back(item);
  return out;
}

nb::object json_to_python(const std::string& text) { return nb::module_::import_("json").attr("loads")(text); }

// The header as the head file stores it (`tfe.header` of __metadata__): the same names in Python.
nb::object header_dict(const tfe::HeadHeader& h) { return json_to_python(tfe::header_to_metadata(h).at("tfe.header")); }

// ---------------------------------------------------------------------------------------------------------
// Arrays

using Array = nb::ndarray<nb::ro>;
namespace dl = nb::dlpack;

std::string dtype_text(dl::dtype d) {
  std::string base;
  switch (static_cast<dl::dtype_code>(d.code)) {
    case dl::dtype_code::Int:
      base = fmt::format("int{}", d.bits);
      break;
    case dl::dtype_code::UInt:
      base = fmt::format("uint{}", d.bits);
      break;
    case dl::dtype_code::Float:
      base = fmt::format("float{}", d.bits);
      break;
    case dl::dtype_code::Bfloat:
      base = fmt::format("bfloat{}", d.bits);
      break;
    case dl::dtype_code::Complex:
      base = fmt::format("complex{}", d.bits);
      break;
    case dl::dtype_code::Bool:
      base = "bool";
      break;
    default:
      base = fmt::format("dtype code {} of {} bits", d.code, d.bits);
      break;
  }
  return d.lanes == 1 ? base : fmt::format("{}x{}", base, d.lanes);
}

bool is(dl::dtype d, dl::dtype_code code, int bits) {
  return d.code == static_cast<uint8_t>(code) && d.bits == bits && d.lanes == 1;
}

std::string device_text(const Array& a) {
  const int id = a.device_id();
  switch (a.device_type()) {
    case nb::device::cpu::value:
      return "cpu";
    case nb::device::cuda::value:
      return fmt::format("cuda:{}", id);
    case nb::device::cuda_host::value:
      return "cuda_host (pinned host memory)";
    case nb::device::cuda_managed::value:
      return fmt::format("cuda_managed:{}", id);
    case nb::device::rocm::value:
      return fmt::format("rocm:{}", id);
    case nb::device::metal::value:
      return "metal";
    default:
      return fmt::format("DLPack device type {}:{}", a.device_type(), id);
  }
}

std::string shape_text(const Array& a) {
  std::vector<size_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// torch tensors read through their own accessors, without DLPack: torch's __dlpack__ costs about 5 us a
// tensor, most of what a call from Python adds (BENCHMARKS.md, "An engine round from Python"). Only a
// plain strided tensor that needs no grad, on the CPU or a CUDA device, of a dtype listed here is read this
// way; anything else goes through DLPack like any other producer, with its refusals and messages.
struct TorchTypes {
  PyTypeObject* tensor = nullptr;
  nb::handle strided;
  std::vector<std::pair<nb::handle, dl::dtype>> dtypes;
  // Interned attribute names, looked up once.
  nb::handle data_ptr, shape, stride, dtype, device, type, index, requires_grad, layout, cuda, cpu;
};

// The torch types once torch is imported (a tensor cannot exist before); null until then. Held for the
// process's life, as the module's other types are.
const TorchTypes* torch_types() {
  static TorchTypes* types = nullptr;
  if (types) return types;
  PyObject* modules = PySys_GetObject("modules");  // borrowed
  PyObject* torch = modules ? PyDict_GetItemString(modules, "torch") : nullptr;
  if (!torch) return nullptr;
  nb::handle t(torch);
  if (!nb::hasattr(t, "Tensor") || !nb::hasattr(t, "strided")) return nullptr;  // torch still importing
  auto* k = new TorchTypes;
  k->tensor = reinterpret_cast<PyTypeObject*>(t.attr("Tensor").inc_ref().ptr());
  k->strided = t.attr("strided").inc_ref();
  const std::pair<const char*, dl::dtype> known[] = {
      {"bfloat16", nb::dtype<uint16_t>()}, {"float16", nb::dtype<uint16_t>()}, {"float32", nb::dtype<float>()},
      {"float64", nb::dtype<double>()},    {"int8", nb::dtype<int8_t>()},      {"uint8", nb::dtype<uint8_t>()},
      {"int16", nb::dtype<int16_t>()},     {"uint16", nb::dtype<uint16_t>()},  {"int32", nb::dtype<int32_t>()},
      {"int64", nb::dtype<int64_t>()}};
  for (auto [name, d] : known) {
    if (!nb::hasattr(t, name)) continue;
    if (std::string_view(name) == "bfloat16") d = dl::dtype{static_cast<uint8_t>(dl::dtype_code::Bfloat), 16, 1};
    if (std::string_view(name) == "float16") d = dl::dtype{static_cast<uint8_t>(dl::dtype_code::Float), 16, 1};
    k->dtypes.emplace_back(t.attr(name).inc_ref(), d);
  }
  auto intern = [](const char* s) { return nb::handle(PyUnicode_InternFromString(s)); };
  k->data_ptr = intern("data_ptr");
  k->shape = intern("shape");
  k->stride = intern("stride");
  k->dtype = intern("dtype");
  k->device = intern("device");
  k->type = intern("type");
  k->index = intern("index");
  k->requires_grad = intern("requires_grad");
  k->layout = intern("layout");
  k->cuda = intern("cuda");
  k->cpu = intern("cpu");
  types = k;
  return types;
}

std::optional<Array> torch_array(nb::handle h) {
  const TorchTypes* k = torch_types();
  if (!k || !PyObject_TypeCheck(h.ptr(), k->tensor)) return std::nullopt;
  auto get = [&](nb::handle name) { return nb::steal(PyObject_GetAttr(h.ptr(), name.ptr())); };
  auto call = [&](nb::handle name) { return nb::steal(PyObject_CallMethodNoArgs(h.ptr(), name.ptr())); };
  // No complex dtype is listed, so no tensor read here carries a conjugate or negative bit.
  nb::object grad = get(k->requires_grad), layout = get(k->layout);
  if (!grad.is_valid() || !layout.is_valid()) throw nb::python_error();
  if (grad.ptr() != Py_False || !layout.is(k->strided)) return std::nullopt;
  nb::object dtype = get(k->dtype);
  if (!dtype.is_valid()) throw nb::python_error();
  const dl::dtype* d = nullptr;
  for (const auto& [object, code] : k->dtypes)
    if (dtype.is(object)) d = &code;
  if (!d) return std::nullopt;
  nb::object device = get(k->device);
  if (!device.is_valid()) throw nb::python_error();
  nb::object type = nb::steal(PyObject_GetAttr(device.ptr(), k->type.ptr()));
  if (!type.is_valid()) throw nb::python_error();
  int device_type = 0, device_id = 0;
  if (PyUnicode_Compare(type.ptr(), k->cuda.ptr()) == 0) {
    nb::object index = nb::steal(PyObject_GetAttr(device.ptr(), k->index.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    device_type = nb::device::cuda::value;
    device_id = index.is_none() ? 0 : nb::cast<int>(index);
  } else if (PyUnicode_Compare(type.ptr(), k->cpu.ptr()) == 0) {
    device_type = nb::device::cpu::value;
  } else {
    return std::nullopt;
  }
  nb::object shape = get(k->shape), strides = call(k->stride), data = call(k->data_ptr);
  if (!shape.is_valid() || !strides.is_valid() || !data.is_valid()) throw nb::python_error();
  const size_t ndim = nb::len(shape);
  if (ndim > 8 || nb::len(strides) != ndim) return std::nullopt;
  size_t dims[8];
  int64_t steps[8];
  for (size_t i = 0; i < ndim; ++i) {
    dims[i] = nb::cast<size_t>(shape[i]);
    steps[i] = nb::cast<int64_t>(strides[i]);
  }
  auto* p = reinterpret_cast<void*>(static_cast<uintptr_t>(nb::cast<uint64_t>(data)));
  // The tensor owns the memory: the array holds it.
  return Array(p, ndim, dims, h, steps, *d, device_type, device_id);
}

Array as_array(nb::handle h, const std::string& name, std::string_view expected) {
  if (auto t = torch_array(h)) return *std::move(t);
  Array a;
  if (!nb::try_cast(h, a))
    fail("{}: expected an array of {} (numpy, torch, or any object with __dlpack__ or the buffer protocol), got {}{}",
         name, expected, py_type(h),
         nb::hasattr(h, "requires_grad") ? " (a torch tensor that requires grad needs .detach())" : "");
  return a;
}

bool on_host(const Array& a) {
  return a.device_type() == nb::device::cpu::value || a.device_type() == nb::device::cuda_host::value;
}
bool on_cuda(const Array& a) {
  return a.device_type() == nb::device::cuda::value || a.device_type() == nb::device::cuda_managed::value;
}

// Where a checked array's data may be read from. `device` < 0: the host only (the CPU reference, the
// blocking draft's slots); otherwise also CUDA memory of that device.
void check_place(const Array& a, const std::string& name, std::string_view call, int device = -1) {
  if (on_host(a)) return;
  if (on_cuda(a)) {
    if (device < 0)
      fail("{}: a tensor on {}; {} takes host memory: pass a CPU tensor (e.g. .cpu())", name, device_text(a), call);
    if (a.device_type() == nb::device::cuda::value && a.device_id() != device)
      fail("{}: a tensor on {}, but the runtime runs on cuda:{}", name, device_text(a), device);
    return;
  }
  fail("{}: on {}; {} takes host (cpu) or CUDA memory", name, device_text(a), call);
}
void check_host(const Array& a, const std::string& name, std::string_view call) { check_place(a, name, call); }

// Row-major with no gaps, and aligned for its element type: the library reads it as one flat span.
void check_layout(const Array& a, const std::string& name) {
  // An empty array has no element to read: its strides say nothing (numpy gives [0, 288] strides [0, 0]),
  // and the caller's own check names what is missing ("a span of 0 rows").
  if (a.size() == 0) return;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      std::vector<int64_t> st(a.ndim());
      for (size_t j = 0; j < a.ndim(); ++j) st[j] = a.stride(j);
      fail(
          "{}: not C-contiguous (shape {}, strides [{}] in elements); pass a contiguous copy "
          "(numpy.ascontiguousarray, .contiguous())",
          name, shape_text(a), fmt::join(st, ", "));
    }
    expect *= static_cast<int64_t>(a.shape(i));
  }
  const size_t item = a.itemsize();
  if (a.size() > 0 && item > 0 && reinterpret_cast<uintptr_t>(a.data()) % item != 0)
    fail("{}: its data at {} is not aligned to its {}-byte elements", name, a.data(), item);
}

void check_ndim(const Array& a, const std::string& name, size_t ndim, std::string_view shape) {
  if (a.ndim() != ndim)
    fail("{}: expected {} dimension{} {}, got shape {}", name, ndim, ndim == 1 ? "" : "s", shape, shape_text(a));
}

// taps: [rows, T * Ht] bf16. torch's bfloat16 arrives as DLPack bfloat16; numpy has no bf16, so uint16
// arrays holding the bits (e.g. torch_tensor.view(torch.uint16).numpy()) are taken too. On the host the
// rows are packed; on the device (`device` >= 0) a row's values are packed and rows may be any stride apart
// (a slice of a wider hidden-state buffer).
Array check_taps(nb::handle h, const std::string& name, int64_t row_width, std::string_view call, int device = -1) {
  Array a = as_array(h, name, "bfloat16");
  check_place(a, name, call, device);
  if (!is(a.dtype(), dl::dtype_code::Bfloat, 16) && !is(a.dtype(), dl::dtype_code::UInt, 16))
    fail("{}: expected bfloat16 (or uint16 holding bf16 bits), got {}", name, dtype_text(a.dtype()));
  check_ndim(a, name, 2, fmt::format("[rows, taps * target_hidden = {}]", row_width));
  if (static_cast<int64_t>(a.shape(1)) != row_width)
    fail("{}: expected shape [rows, {}] (taps * target_hidden), got {}", name, row_width, shape_text(a));
  if (on_host(a)) {
    check_layout(a, name);
  } else {
    if (a.shape(1) > 1 && a.stride(1) != 1)
      fail("{}: a row's values must be contiguous (stride 1), got strides [{}, {}] in elements", name, a.stride(0),
           a.stride(1));
    if (a.shape(0) > 1 && a.stride(0) < row_width)
      fail("{}: rows {} elements apart overlap rows of {} values", name, a.stride(0), row_width);
    if (reinterpret_cast<uintptr_t>(a.data()) % 2 != 0)
      fail("{}: its data at {} is not 2-byte aligned", name, a.data());
  }
  return a;
}

Array check_tokens(nb::handle h, const std::string& name, std::string_view call, int device = -1) {
  Array a = as_array(h, name, "int32");
  check_place(a, name, call, device);
  if (!is(a.dtype(), dl::dtype_code::Int, 32)) fail("{}: expected int32, got {}", name, dtype_text(a.dtype()));
  check_ndim(a, name, 1, "[rows]");
  check_layout(a, name);
  return a;
}

using AnyRequest = std::variant<tfe::ExtendRequest, tfe::DeviceExtendRequest>;

// One extend request, checked; `arrays` keeps what its spans point into alive until the call returns.
// `device` >= 0: taps and tokens may both be CUDA memory of that device (the runtime's device form).
// Taps and tokens of the same rows, in the same place (both host or both device); kept alive in `arrays`.
std::pair<Array, Array> check_rows(nb::handle taps, nb::handle tokens, const std::string& prefix, int64_t row_width,
                                   std::string_view call, std::vector<Array>& arrays, int device) {
  Array t = check_taps(taps, prefix + "taps", row_width, call, device);
  Array k = check_tokens(tokens, prefix + "tokens", call, device);
  if (t.shape(0) != k.shape(0))
    fail("{}taps has {} rows but {}tokens has {} entries (one token per row)", prefix, t.shape(0), prefix, k.shape(0));
  if (on_host(t) != on_host(k))
    fail("{}taps is on {} but {}tokens on {}: give both on the device or both on the host", prefix, device_text(t),
         prefix, device_text(k));
  arrays.push_back(t);
  arrays.push_back(k);
  return {std::move(t), std::move(k)};
}

AnyRequest check_request(nb::handle slot, nb::handle first_pos, nb::handle taps, nb::handle tokens,
                         const std::string& prefix, int64_t row_width, std::vector<Array>& arrays, int device = -1) {
  const int32_t s = as_int32(slot, prefix + "slot");
  const int64_t first = as_int(first_pos, prefix + "first_pos");
  const auto [t, k] = check_rows(taps, tokens, prefix, row_width, "extend", arrays, device);
  const auto rows = static_cast<int64_t>(t.shape(0));
  if (on_host(t))
    return tfe::ExtendRequest{s,
                              first,
                              rows,
                              {static_cast<const tfe::bf16_bits*>(t.data()), t.size()},
                              {static_cast<const int32_t*>(k.data()), k.size()}};
  return tfe::DeviceExtendRequest{s,
                                  first,
                                  rows,
                                  static_cast<const tfe::bf16_bits*>(t.data()),
                                  rows > 1 ? static_cast<int64_t>(t.stride(0)) : row_width,
                                  static_cast<const int32_t*>(k.data())};
}

// extend(slot, first_pos, taps, tokens) or extend([(slot, first_pos, taps, tokens), ...]), in one form.
template <typename Request>
std::vector<Request> one_form(std::vector<AnyRequest>&& any) {
  std::vector<Request> out;
  for (size_t i = 0; i < any.size(); ++i) {
    if (!std::holds_alternative<Request>(any[i]))
      fail(
          "requests[{}]: on the {}, but requests[0] is on the {}; one extend call takes host rows or device rows, "
          "not both",
          i, std::holds_alternative<tfe::ExtendRequest>(any[i]) ? "host" : "device",
          std::holds_alternative<tfe::ExtendRequest>(any[0]) ? "host" : "device");
    out.push_back(std::get<Request>(any[i]));
  }
  return out;
}

std::vector<AnyRequest> check_any_extend(nb::handle requests, int64_t row_width, std::vector<Array>& arrays,
                                         int device) {
  const auto items = as_sequence(requests);
  if (!items)
    type_error(fmt::format("requests: expected a list of (slot, first_pos, taps, tokens), got {}", py_type(requests)));
  // One request alone, extend(tfe.ExtendRequest(...)): a tuple whose first item is a slot, not a request.
  if (!items->empty() && PyIndex_Check((*items)[0].ptr())) {
    if (items->size() != 4)
      type_error(
          fmt::format("requests: expected a (slot, first_pos, taps, tokens) tuple, got {} items", items->size()));
    return {check_request((*items)[0], (*items)[1], (*items)[2], (*items)[3], "", row_width, arrays, device)};
  }
  std::vector<AnyRequest> out;
  for (size_t i = 0; i < items->size(); ++i) {
    const std::string prefix = fmt::format("requests[{}].", i);
    const auto fields = as_sequence((*items)[i]);
    if (!fields || fields->size() != 4)
      type_error(fmt::format("requests[{}]: expected a (slot, first_pos, taps, tokens) tuple, got {}", i,
                             fields ? fmt::format("{} items", fields->size()) : py_type((*items)[i])));
    out.push_back(
        check_request((*fields)[0], (*fields)[1], (*fields)[2], (*fields)[3], prefix, row_width, arrays, device));
  }
  return out;
}

// A list, tuple or range of ints, or a 1-D integer array on the host, each within lo..hi.
std::vector<int64_t> host_ints(nb::handle h, const std::string& name, std::string_view call, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  if (const auto items = as_sequence(h)) {
    out.reserve(items->size());
    for (size_t i = 0; i < items->size(); ++i)
      out.push_back(as_int((*items)[i], fmt::format("{}[{}]", name, i), lo, hi));
    return out;
  }
  const Array a = as_array(h, name, "integers (or a list of ints)");
  check_host(a, name, call);
  const dl::dtype d = a.dtype();
  const bool sint = d.code == static_cast<uint8_t>(dl::dtype_code::Int);
  const bool uint = d.code == static_cast<uint8_t>(dl::dtype_code::UInt);
  if ((!sint && !uint) || d.lanes != 1 || (d.bits != 8 && d.bits != 16 && d.bits != 32 && d.bits != 64))
    fail("{}: expected integers, got {}", name, dtype_text(d));
  check_ndim(a, name, 1, "[n]");
  check_layout(a, name);
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto* p = static_cast<const std::byte*>(a.data()) + i * a.itemsize();
    int64_t v = 0;
    if (d.bits == 8)
      v = sint ? int64_t(*reinterpret_cast<const int8_t*>(p)) : int64_t(*reinterpret_cast<const uint8_t*>(p));
    if (d.bits == 16)
      v = sint ? int64_t(*reinterpret_cast<const int16_t*>(p)) : int64_t(*reinterpret_cast<const uint16_t*>(p));
    if (d.bits == 32)
      v = sint ? int64_t(*reinterpret_cast<const int32_t*>(p)) : int64_t(*reinterpret_cast<const uint32_t*>(p));
    if (d.bits == 64) {
      if (uint && *reinterpret_cast<const uint64_t*>(p) > static_cast<uint64_t>(hi))
        fail("{}[{}]: {} is outside {}..{}", name, i, *reinterpret_cast<const uint64_t*>(p), lo, hi);
      v = *reinterpret_cast<const int64_t*>(p);
    }
    if (v < lo || v > hi) fail("{}[{}]: {} is outside {}..{}", name, i, v, lo, hi);
    out.push_back(v);
  }
  return out;
}

// draft's slots: a list, tuple or range of ints, or a 1-D integer array on the host.
std::vector<int> check_slots(nb::handle h) {
  const std::vector<int64_t> v =
      host_ints(h, "slots", "draft", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  return {v.begin(), v.end()};
}

// extend_batch: request i is slots[i] at first_pos[i], taking counts[i] rows of the shared taps and tokens
// from row starts[i] (default: the rows of the requests before it, in order). One array pair for every slot
// is what an engine holds after verification, and it crosses the DLPack boundary twice instead of twice a
// slot.
std::vector<AnyRequest> check_batch(nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
                                    nb::handle tokens, nb::handle starts, int64_t row_width, std::vector<Array>& arrays,
                                    int device = -1) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> s = host_ints(slots, "slots", "extend_batch", std::numeric_limits<int>::min(), kIntMax);
  const std::vector<int64_t> f =
      host_ints(first_pos, "first_pos", "extend_batch", std::numeric_limits<int64_t>::min(), kI64Max);
  const std::vector<int64_t> c = host_ints(counts, "counts", "extend_batch", 0, kI64Max);
  std::vector<int64_t> st;
  if (!starts.is_none()) st = host_ints(starts, "starts", "extend_batch", 0, kI64Max);
  for (const auto& [name, n] : {std::pair{"first_pos", f.size()}, {"counts", c.size()}})
    if (n != s.size()) fail("{}: {} entries, but slots has {} (one per request)", name, n, s.size());
  if (!starts.is_none() && st.size() != s.size())
    fail("starts: {} entries, but slots has {} (one per request)", st.size(), s.size());
  const auto [t, k] = check_rows(taps, tokens, "", row_width, "extend_batch", arrays, device);
  const auto total = static_cast<int64_t>(t.shape(0));
  const int64_t stride = on_host(t) || total <= 1 ? row_width : static_cast<int64_t>(t.stride(0));
  const auto* taps_data = static_cast<const tfe::bf16_bits*>(t.data());
  const auto* tokens_data = static_cast<const int32_t*>(k.data());
  std::vector<AnyRequest> out;
  out.reserve(s.size());
  int64_t next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t start = st.empty() ? next : st[i];
    // Compared as c > total - start: start + c overflows for counts near INT64_MAX.
    if (start > total || c[i] > total - start) {
      if (st.empty())
        fail("counts[0..{}] add up to {} + {} rows, past the {} rows of taps and tokens", i, start, c[i], total);
      fail("starts[{}] + counts[{}] = {} + {}, past the {} rows of taps and tokens", i, i, start, c[i], total);
    }
    next = start + c[i];
    const auto slot = static_cast<int32_t>(s[i]);
    if (on_host(t))
      out.push_back(tfe::ExtendRequest{slot,
                                       f[i],
                                       c[i],
                                       {taps_data + start * row_width, static_cast<size_t>(c[i] * row_width)},
                                       {tokens_data + start, static_cast<size_t>(c[i])}});
    else
      out.push_back(
          tfe::DeviceExtendRequest{slot, f[i], c[i], taps_data + start * stride, stride, tokens_data + start});
  }
  return out;
}

template <typename T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner).cast();
}

nb::handle g_draft_result;  // collections.namedtuple DraftResult(tokens, confidences)
nb::handle g_tensor_info;   // collections.namedtuple TensorInfo(name, dtype, shape, nbytes)
nb::handle g_error;         // tfe.Error (ValueError)
nb::handle g_cuda_error;    // tfe.CudaError (RuntimeError)

nb::object draft_result(tfe::DraftResult&& d) {
  const size_t n = static_cast<size_t>(d.streams), s = static_cast<size_t>(d.steps);
  return g_draft_result(to_numpy(std::move(d.tokens), {n, s}), to_numpy(std::move(d.confidences), {n, s}));
}

// ---------------------------------------------------------------------------------------------------------
// Plan options: one table of names for PlanOptions(**kw), compile, plan_yaml and Runtime.

const std::vector<std::string>& plan_option_names() {
  static const std::vector<std::string> names = {"buckets",     "max_steps",       "fp8",   "arch", "max_slots",
                                                 "extend_rows", "attention_split", "cand_k"};
  return names;
}

// Sets one field; false when `key` names none.
bool set_plan_option(tfe::PlanOptions& o, const std::string& key, nb::handle v) {
  if (key == "buckets") {
    const auto items = as_sequence(v);
    if (!items) type_error(fmt::format("buckets: expected a list of ints, got {}", py_type(v)));
    std::vector<int> b;
    for (size_t i = 0; i < items->size(); ++i) b.push_back(as_int32((*items)[i], fmt::format("buckets[{}]", i)));
    o.buckets = b;
  } else if (key == "max_steps") {
    o.max_steps = as_int32(v, key);
  } else if (key == "fp8") {
    o.fp8 = as_fp8(v, key);
  } else if (key == "arch") {
    o.arch = as_str(v, key);
  } else if (key == "max_slots") {
    o.max_slots = as_int32(v, key);
  } else if (key == "extend_rows") {
    o.extend_rows = as_int32(v, key);
  } else if (key == "attention_split") {
    const std::string name = as_str(v, key);
    o.attention_split = tfe::attention_split_from_name(name);
  } else if (key == "cand_k") {
    o.cand_k = as_int32(v, key);
  } else {
    return false;
  }
  return true;
}

// `plan` (a PlanOptions or None) with the keyword arguments on top, validated as the planner will.
// nullopt when neither is given (the runtime then takes an artifact's options or the defaults).
std::optional<tfe::PlanOptions> plan_options_from(nb::handle plan, const nb::kwargs& kw, const std::string& call) {
  if (plan.is_none() && kw.size() == 0) return std::nullopt;
  tfe::PlanOptions o;
  if (!plan.is_none()) {
    if (!nb::isinstance<tfe::PlanOptions>(plan))
      type_error(fmt::format("plan: expected a tfe.PlanOptions, got {}", py_type(plan)));
    o = nb::cast<tfe::PlanOptions>(plan);
  }
  for (auto [k, v] : kw) {
    const std::string key = nb::cast<std::string>(k);
    if (!set_plan_option(o, key, v))
      type_error(fmt::format("{}() got an unexpected keyword argument '{}' (plan options: {})", call, key,
                             fmt::join(plan_option_names(), ", ")));
  }
  tfe::validate(o);
  return o;
}

nb::dict plan_options_dict(const tfe::PlanOptions& o) {
  nb::dict d;
  d["buckets"] = nb::cast(o.buckets);
  d["max_steps"] = o.max_steps;
  d["fp8"] = std::string(tfe::fp8_mode_name(o.fp8));
  d["arch"] = o.arch;
  d["max_slots"] = o.max_slots;
  d["extend_rows"] = o.extend_rows;
  d["attention_split"] = std::string(tfe::attention_split_name(o.attention_split));
  d["cand_k"] = o.cand_k;
  return d;
}

// ---------------------------------------------------------------------------------------------------------
// Heads

struct PyHead {
  std::shared_ptr<const tfe::HeadFile> file;
  std::string path;
};

struct PyPreset {
  std::string name;
  bool fp8 = false;
};

std::shared_ptr<const tfe::HeadFile> open_head(const std::string& path, bool verify) {
  nb::gil_scoped_release release;
  return std::make_shared<const tfe::HeadFile>(tfe::HeadFile::open(path, {.verify_sha256 = verify}));
}

// A head argument: a tfe.HeadFile, or a path opened now.
std::shared_ptr<const tfe::HeadFile> head_arg(nb::handle h, const std::string& name, bool verify) {
  if (nb::isinstance<PyHead>(h)) return nb::cast<PyHead&>(h).file;
  if (nb::isinstance<PyPreset>(h))
    fail("{}: a preset has no weights; pass a head file (tfe.random_head makes one)", name);
  return open_head(as_path(h, name).string(), verify);
}

// What a plan is made for: a tfe.HeadFile, a tfe.Preset, or a path.
tfe::PlanSource plan_source(nb::handle h) {
  if (nb::isinstance<PyPreset>(h)) {
    const PyPreset& p = nb::cast<PyPreset&>(h);
    return tfe::PlanSource::preset(p.name, p.fp8);
  }
  if (nb::isinstance<PyHead>(h)) return tfe::PlanSource::head(*nb::cast<PyHead&>(h).file);
  if (!nb::isinstance<nb::str>(h) && !nb::hasattr(h, "__fspath__"))
    type_error(fmt::format("head: expected a path, a tfe.HeadFile or a tfe.Preset, got {}", py_type(h)));
  const std::string path = as_path(h, "head").string();
  nb::gil_scoped_release release;
  return tfe::PlanSource::file(path);
}

PyHead opened(const std::string& path) { return PyHead{open_head(path, false), path}; }

// ---------------------------------------------------------------------------------------------------------
// Reference and Runtime: one thread at a time each. Calls run without the GIL, under the object's mutex,
// after every Python argument has been read.

struct PyReference {
  std::shared_ptr<const tfe::HeadFile> file;  // the reference reads its weights in place
  std::unique_ptr<tfe::Reference> ref;
  std::mutex mu;
};

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

// The accept log's counts (<tfe/accept_log.h>): lists indexed by window position - 1.
nb::dict accept_counts_dict(const tfe::AcceptCounts& c) {
  nb::dict d;
  d["rounds"] = c.rounds;
  d["sequences"] = c.sequences;
  d["kept_tokens"] = c.kept_tokens;
  d["mean_kept"] = c.mean_kept();
  d["asked"] = c.asked;
  d["kept"] = c.kept;
  return d;
}

// record_accepted's kept: a list, tuple or range of ints (or anything iterable of ints, e.g. a numpy array).
std::vector<int> accepted_arg(nb::handle h) {
  std::vector<int> out;
  size_t i = 0;
  for (nb::handle item : h) out.push_back(as_int32(item, fmt::format("kept[{}]", i++)));
  return out;
}

struct PyAcceptLog {
  std::unique_ptr<tfe::AcceptLog> log;
  tfe::AcceptLog& get() {
    if (!log) fail("accept log: closed");
    return *log;
  }
};

int64_t row_width(const tfe::HeadHeader& h) { return static_cast<int64_t>(h.taps.size()) * h.target_hidden; }

// The two forms of extend, as one argument list: (slot, first_pos, taps, tokens) or (requests). `device`
// >= 0: device rows are taken too.
std::vector<AnyRequest> extend_args(nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens,
                                    int64_t width, std::vector<Array>& arrays, int device = -1) {
  const bool single = !first_pos.is_none() || !taps.is_none() || !tokens.is_none();
  if (!single) return check_any_extend(a, width, arrays, device);
  if (first_pos.is_none() || taps.is_none() || tokens.is_none())
    type_error("extend: give slot, first_pos, taps and tokens, or one list of (slot, first_pos, taps, tokens)");
  return {check_request(a, first_pos, taps, tokens, "", width, arrays, device)};
}

// A 2-D CUDA target of an enqueued draft: [rows >= n, >= steps] of `dtype`, rows any stride apart.
void* check_target(nb::handle h, const std::string& name, int n, int steps, dl::dtype dtype,
                   std::string_view dtype_name, int device, int64_t& row_stride, std::vector<Array>& arrays) {
  const Array a = as_array(h, name, dtype_name);
  if (!on_cuda(a)) fail("{}: on {}; an enqueued draft writes device memory", name, device_text(a));
  check_place(a, name, "draft_async", device);
  if (a.dtype() != dtype) fail("{}: expected {}, got {}", name, dtype_name, dtype_text(a.dtype()));
  check_ndim(a, name, 2, "[slots, steps]");
  if (static_cast<int>(a.shape(0)) < n || static_cast<int>(a.shape(1)) < steps)
    fail("{}: shape {} holds less than [{}, {}] (slots, steps)", name, shape_text(a), n, steps);
  if (a.shape(1) > 1 && a.stride(1) != 1) fail("{}: a row's steps must be contiguous (stride 1)", name);
  const int64_t stride = a.shape(0) > 1 ? a.stride(0) : steps;
  if (row_stride != 0 && stride != row_stride)
    fail("{}: rows {} elements apart, but the other target's are {}; give both the same layout", name, stride,
         row_stride);
  row_stride = stride;
  arrays.push_back(a);
  return const_cast<void*>(a.data());
}

// A call's stream: None is the runtime's own (nullopt), else as stream_arg reads it.
std::optional<cudaStream_t> call_stream(nb::handle s, int device) {
  if (s.is_none()) return std::nullopt;
  return stream_arg(s, device);
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

#ifdef TFE_HAVE_NCCL
struct PyBroadcast {
  std::unique_ptr<tfe::DraftBroadcast> bc;
  int device = 0;
  std::mutex mu;
};
#endif

}  // namespace

NB_MODULE(_tfe, m) {
  m.doc() = "tfe: EAGLE-3 draft heads on CUDA graphs (see the package docstring)";
  m.attr("__version__") = TFE_VERSION;

  // Module-lifetime objects are held as handles that are never released: the interpreter may outlive the
  // module's static destructors at exit, and a leaked reference to a type costs nothing.
  g_error = PyErr_NewExceptionWithDoc("tfe.Error",
                                      "A call tfe refused (a bad argument, file, option or state); nothing changed.",
                                      PyExc_ValueError, nullptr);
  g_cuda_error = PyErr_NewExceptionWithDoc(
      "tfe.CudaError", "A CUDA or cuBLASLt call failed, or no device is there; a runtime it came from is unusable.",
      PyExc_RuntimeError, nullptr);
  if (!g_error.ptr() || !g_cuda_error.ptr()) throw nb::python_error();
  m.attr("Error") = g_error;
  m.attr("CudaError") = g_cuda_error;
  // tfe::CudaError derives from tfe::Error, so it is caught first. Both keep the library's message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tfe::CudaError& e) {
      PyErr_SetString(g_cuda_error.ptr(), e.what());
    } catch (const tfe::Error& e) {
      PyErr_SetString(g_error.ptr(), e.what());
    }
  });

  nb::module_ collections = nb::module_::import_("collections");
  g_draft_result =
      collections.attr("namedtuple")("DraftResult", nb::make_tuple("tokens", "confidences"), "module"_a.none() = "tfe")
          .release();
  g_tensor_info = collections
                      .attr("namedtuple")("TensorInfo", nb::make_tuple("name", "dtype", "shape", "nbytes"),
                                          "module"_a.none() = "tfe")
                      .release();
  m.attr("DraftResult") = g_draft_result;
  m.attr("TensorInfo") = g_tensor_info;

  // -------------------------------------------------------------------------------------------- options
  nb::class_<tfe::PlanOptions>(m, "PlanOptions", "The options of a plan (include/tfe/options.h).")
      .def(
          "__init__",
          [](tfe::PlanOptions* self, const nb::kwargs& kw) {
            tfe::PlanOptions o;
            for (auto [k, v] : kw) {
              const std::string key = nb::cast<std::string>(k);
              if (!set_plan_option(o, key, v))
                type_error(fmt::format("PlanOptions() got an unexpected keyword argument '{}' (fields: {})", key,
                                       fmt::join(plan_option_names(), ", ")));
            }
            tfe::validate(o);
            new (self) tfe::PlanOptions(std::move(o));
          },
          nb::sig("def __init__(self, **options: object) -> None"))
      .def_prop_rw(
          "buckets", [](const tfe::PlanOptions& o) { return o.buckets; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "buckets", v); })
      .def_prop_rw(
          "max_steps", [](const tfe::PlanOptions& o) { return o.max_steps; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "max_steps", v); })
      .def_prop_rw(
          "fp8", [](const tfe::PlanOptions& o) { return std::string(tfe::fp8_mode_name(o.fp8)); },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "fp8", v); })
      .def_prop_rw(
          "arch", [](const tfe::PlanOptions& o) { return o.arch; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "arch", v); })
      .def_prop_rw(
          "max_slots", [](const tfe::PlanOptions& o) { return o.max_slots; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "max_slots", v); })
      .def_prop_rw(
          "extend_rows", [](const tfe::PlanOptions& o) { return o.extend_rows; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "extend_rows", v); })
      .def_prop_rw(
          "attention_split",
          [](const tfe::PlanOptions& o) { return std::string(tfe::attention_split_name(o.attention_split)); },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "attention_split", v); })
      .def_prop_rw(
          "cand_k", [](const tfe::PlanOptions& o) { return o.cand_k; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "cand_k", v); })
      .def("to_dict", &plan_options_dict, "The fields as a dict.")
      .def(
          "replace",
          [](const tfe::PlanOptions& o, const nb::kwargs& kw) {
            return *plan_options_from(nb::cast(o), kw, "replace");
          },
          nb::sig("def replace(self, **options: object) -> PlanOptions"), "A copy with the given fields changed.")
      .def(
          "validate", [](const tfe::PlanOptions& o) { tfe::validate(o); },
          "Raises tfe.Error naming the first field out of range.")
      .def(
          "__eq__", [](const tfe::PlanOptions& a, const tfe::PlanOptions& b) { return a == b; }, nb::is_operator())
      .def("__repr__", [](const tfe::PlanOptions& o) {
        std::vector<std::string> parts;
        for (auto [k, v] : plan_options_dict(o))
          parts.push_back(fmt::format("{}={}", nb::str(k).c_str(), nb::repr(v).c_str()));
        return fmt::format("PlanOptions({})", fmt::join(parts, ", "));
      });

  m.def("plan_option_names", &plan_option_names, "Every PlanOptions field, as keyword arguments take them.");

  // ---------------------------------------------------------------------------------------------- heads
  nb::class_<PyPreset>(m, "Preset", "A built-in head shape, planned without a head file (`--preset`).")
      .def(
          "__init__",
          [](PyPreset* self, nb::handle name, nb::handle fp8) {
            const std::string n = as_str(name, "name");
            (void)tfe::preset_header(n);  // refuses an unknown name, listing the presets
            new (self) PyPreset{n, as_bool(fp8, "fp8")};
          },
          "name"_a.none(), "fp8"_a.none() = false, nb::sig("def __init__(self, name: str, fp8: bool = False) -> None"))
      .def_ro("name", &PyPreset::name)
      .def_ro("fp8", &PyPreset::fp8)
      .def_prop_ro("header",
                   [](const PyPreset& p) { return header_dict(tfe::PlanSource::preset(p.name, p.fp8).header); })
      .def("__repr__",
           [](const PyPreset& p) { return fmt::format("Preset({:?}, fp8={})", p.name, p.fp8 ? "True" : "False"); });

  m.def(
      "presets", [] { return tfe::preset_names(); }, "The names of the built-in head shapes.");

  struct PyArtifact {
    std::string path;
  };
  nb::class_<PyArtifact>(m, "Artifact", "A deploy artifact directory (tfe.compile, `tfe-plan compile -o`).")
      .def(
          "__init__", [](PyArtifact* self, nb::handle path) { new (self) PyArtifact{as_path(path, "path").string()}; },
          "path"_a.none(), nb::sig("def __init__(self, path: str | os.PathLike[str]) -> None"))
      .def_ro("path", &PyArtifact::path)
      .def(
          "verify",
          [](const PyArtifact& a, nb::handle head) {
            const std::string head_path = head.is_none() ? std::string() : as_path(head, "head").string();
            tfe::ArtifactInfo info;
            {
              nb::gil_scoped_release release;
              info = tfe::verify_artifact(a.path, head_path);
            }
            nb::dict d;
            d["arch"] = info.arch;
            d["nvrtc_version"] = info.nvrtc_version;
            d["head_sha256"] = info.head_sha256;
            d["kernels"] = info.kernels;
            d["cubin_bytes"] = info.cubin_bytes;
            return d;
          },
          "head"_a.none() = nb::none(),
          nb::sig("def verify(self, head: str | os.PathLike[str] | None = None) -> dict[str, Any]"),
          "`tfe-plan inspect DIR`: checks the artifact on the CPU (manifest, every sha256, the head the plan was made\n"
          "for; with `head`, that this head file is the one it was compiled for) and returns what it records.\n"
          "Raises tfe.Error naming the file and the mismatch.")
      .def("__repr__", [](const PyArtifact& a) { return fmt::format("Artifact({:?})", a.path); });

  nb::class_<PyHead>(m, "HeadFile", "A .tfe head file, mapped read-only and validated.")
      .def(
          "__init__",
          [](PyHead* self, nb::handle path, nb::handle verify) {
            const std::string p = as_path(path, "path").string();
            new (self) PyHead{open_head(p, as_bool(verify, "verify")), p};
          },
          "path"_a.none(), "verify"_a.none() = false,
          nb::sig("def __init__(self, path: str | os.PathLike[str], verify: bool = False) -> None"))
      .def_ro("path", &PyHead::path)
      .def_prop_ro("header", [](const PyHead& h) { return json_to_python(h.file->file().metadata().at("tfe.header")); })
      .def_prop_ro("header_sha256", [](const PyHead& h) { return h.file->header_sha256(); })
      .def_prop_ro("metadata",
                   [](const PyHead& h) {
                     nb::dict d;
                     for (const auto& [k, v] : h.file->file().metadata()) d[k.c_str()] = v;
                     return d;
                   })
      .def_prop_ro("tensors",
                   [](const PyHead& h) {
                     nb::list out;
                     for (const auto& t : h.file->file().tensors())
                       out.append(g_tensor_info(t.name, std::string(tfe::dtype_name(t.dtype)),
                                                nb::tuple(nb::cast(t.shape)), t.bytes));
                     return out;
                   })
      .def(
          "tensor",
          [](PyHead& h, const std::string& name) {
            const tfe::TensorView& t = h.file->tensor(name);
            std::vector<size_t> shape(t.shape.begin(), t.shape.end());
            dl::dtype d = nb::dtype<uint8_t>();
            switch (t.dtype) {
              case tfe::DType::BF16:
                d = nb::dtype<uint16_t>();
                break;
              case tfe::DType::F32:
                d = nb::dtype<float>();
                break;
              case tfe::DType::I32:
                d = nb::dtype<int32_t>();
                break;
              case tfe::DType::F8_E4M3:
                d = nb::dtype<uint8_t>();
                break;
              default:
                fail("tensor {}: dtype {} has no numpy form", name, tfe::dtype_name(t.dtype));
            }
            // A view into the mapped file: the HeadFile object stays alive while the array does.
            return nb::ndarray<nb::numpy, nb::ro>(t.data, shape.size(), shape.data(), nb::find(&h), nullptr, d).cast();
          },
          "name"_a, "The tensor as a read-only numpy view of the file: bf16 as uint16 bits, F8_E4M3 as uint8 codes.")
      .def("__contains__", [](const PyHead& h, const std::string& name) { return h.file->find(name) != nullptr; })
      .def("__len__", [](const PyHead& h) { return h.file->file().tensors().size(); })
      .def("__repr__", [](const PyHead& h) {
        return fmt::format("HeadFile({:?}: {}, {} tensors)", h.path, h.file->header().name,
                           h.file->file().tensors().size());
      });

  m.def(
      "random_head",
      [](nb::handle preset, nb::handle out, nb::handle seed, nb::handle fp8, nb::handle config, nb::handle threads) {
        tfe::RandomHeadOptions o;
        if (!preset.is_none()) o.preset = as_str(preset, "preset");
        if (!config.is_none()) o.config_path = as_path(config, "config").string();
        if (o.preset.empty() == o.config_path.empty()) fail("random_head: give exactly one of preset and config");
        o.seed = static_cast<uint64_t>(as_int(seed, "seed", 0));
        o.fp8 = as_bool(fp8, "fp8");
        o.threads = as_int32(threads, "threads");
        const std::string path = as_path(out, "out").string();
        {
          nb::gil_scoped_release release;
          (void)tfe::write_random_head(o, path);
        }
        return opened(path);
      },
      "preset"_a.none(), "out"_a.none(), nb::kw_only(), "seed"_a.none() = 0, "fp8"_a.none() = false,
      "config"_a.none() = nb::none(), "threads"_a.none() = 0,
      nb::sig("def random_head(preset: str | None, out: str | os.PathLike[str], *, seed: int = 0, fp8: bool = False, "
              "config: str | os.PathLike[str] | None = None, threads: int = 0) -> HeadFile"),
      "`tfe-plan random`: writes a head of random weights (a function of preset and seed) and opens it.");

  m.def(
      "convert",
      [](nb::handle eagle_dir, nb::handle out, nb::handle target, nb::handle window, nb::handle fp8,
         nb::handle threads) {
        tfe::CheckpointOptions o;
        o.eagle_dir = as_path(eagle_dir, "eagle_dir").string();
        if (!target.is_none()) o.target_dir = as_path(target, "target").string();
        o.window = as_int32(window, "window");
        o.fp8 = as_bool(fp8, "fp8");
        o.threads = as_int32(threads, "threads");
        const std::string path = as_path(out, "out").string();
        std::vector<std::string> warnings;
        {
          nb::gil_scoped_release release;
          (void)tfe::convert_checkpoint(o, path);
          warnings = tfe::checkpoint_warnings(o);
        }
        for (const std::string& w : warnings)
          if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) throw nb::python_error();
        return opened(path);
      },
      "eagle_dir"_a.none(), "out"_a.none(), nb::kw_only(), "target"_a.none() = nb::none(),
      "window"_a.none() = tfe::kMaxWindow, "fp8"_a.none() = false, "threads"_a.none() = 0,
      nb::sig("def convert(eagle_dir: str | os.PathLike[str], out: str | os.PathLike[str], *, "
              "target: str | os.PathLike[str] | None = None, window: int = 511, fp8: bool = False, threads: int = 0) "
              "-> HeadFile"),
      "`tfe-plan convert`: an EAGLE-3 checkpoint (config.json + safetensors) to a .tfe head, opened.");

  m.def(
      "plan_yaml",
      [](nb::handle head, nb::handle plan, const nb::kwargs& kw) {
        const tfe::PlanOptions o = plan_options_from(plan, kw, "plan_yaml").value_or(tfe::PlanOptions{});
        const tfe::PlanSource source = plan_source(head);
        nb::gil_scoped_release release;
        return tfe::plan_yaml(source, o);
      },
      "head"_a.none(), nb::kw_only(), "plan"_a.none() = nb::none(), "options"_a,
      nb::sig("def plan_yaml(head: str | os.PathLike[str] | HeadFile | Preset, *, plan: PlanOptions | None = None, "
              "**options: object) -> str"),
      "`tfe-plan dump`: the plan of a head as YAML.");

  m.def(
      "compile",
      [](nb::handle head, nb::handle out_dir, nb::handle plan, nb::handle progress, const nb::kwargs& kw) {
        const tfe::PlanOptions o = plan_options_from(plan, kw, "compile").value_or(tfe::PlanOptions{});
        const std::string out = as_path(out_dir, "out_dir").string();
        if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
          type_error(fmt::format("progress: expected a callable taking one str, got {}", py_type(progress)));
        const tfe::PlanSource source = plan_source(head);
        // The callback runs on compile workers: it takes the GIL, and a Python error it raises stops the
        // compile and is raised here, on the caller's thread, where its traceback belongs.
        std::optional<nb::python_error> raised;
        tfe::ArtifactProgress report;
        if (!progress.is_none())
          report = [&](const std::string& line) {
            nb::gil_scoped_acquire acquire;
            if (raised) return;
            try {
              progress(line);
            } catch (nb::python_error& e) {
              raised.emplace(std::move(e));
              throw tfe::Error("compile: the progress callback raised");
            }
          };
        tfe::ArtifactSummary s;
        try {
          nb::gil_scoped_release release;
          s = tfe::compile_artifact(source, o, out, report);
        } catch (const tfe::Error&) {
          if (raised) throw std::move(*raised);
          throw;
        }
        nb::dict d;
        d["specs"] = s.specs;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["wall_ms"] = s.wall_ms;
        d["out_dir"] = s.out_dir;
        d["cache_dir"] = s.cache_dir;
        return d;
      },
      "head"_a.none(), "out_dir"_a.none(), nb::kw_only(), "plan"_a.none() = nb::none(),
      "progress"_a.none() = nb::none(), "options"_a,
      nb::sig("def compile(head: str | os.PathLike[str] | HeadFile | Preset, out_dir: str | os.PathLike[str], *, "
              "plan: PlanOptions | None = None, progress: Callable[[str], object] | None = None, **options: object) "
              "-> dict[str, object]"),
      "`tfe-plan compile`: plans the head and writes the deploy artifact (plan.yaml, cubins, manifest.json).");

  // ------------------------------------------------------------------------------------------ reference
  nb::class_<PyReference>(m, "Reference", "The CPU reference: what the kernels must compute, slot state included.")
      .def(
          "__init__",
          [](PyReference* self, nb::handle head, nb::handle max_slots, nb::handle max_steps, nb::handle fp8,
             nb::handle threads, nb::handle cand_k, nb::handle check_taps) {
            tfe::ReferenceOptions o;
            o.max_slots = as_int32(max_slots, "max_slots");
            o.max_steps = as_int32(max_steps, "max_steps");
            o.fp8 = as_fp8(fp8, "fp8");
            o.threads = as_int32(threads, "threads");
            o.cand_k = as_int32(cand_k, "cand_k");
            o.check_taps = as_bool(check_taps, "check_taps");
            // Before the head is read and anything is allocated (max_slots sizes every slot's state).
            if (o.max_slots < 1 || o.max_slots > tfe::kMaxSlots)
              fail("max_slots: {} is outside 1..{}", o.max_slots, tfe::kMaxSlots);
            if (o.max_steps < 1 || o.max_steps > 16) fail("max_steps: {} is outside 1..16", o.max_steps);
            tfe::check_threads(o.threads, "Reference");
            auto file = head_arg(head, "head", false);
            auto ref = std::make_unique<tfe::Reference>(*file, o);
            new (self) PyReference{std::move(file), std::move(ref), {}};
          },
          "head"_a.none(), nb::kw_only(), "max_slots"_a.none() = 16, "max_steps"_a.none() = 8, "fp8"_a.none() = "auto",
          "threads"_a.none() = 0, "cand_k"_a.none() = 0, "check_taps"_a.none() = false,
          nb::sig("def __init__(self, head: str | os.PathLike[str] | HeadFile, *, max_slots: int = 16, "
                  "max_steps: int = 8, fp8: str = 'auto', threads: int = 0, cand_k: int = 0, "
                  "check_taps: bool = False) -> None"))
      .def(
          "extend",
          [](PyReference& r, nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens) {
            std::vector<Array> arrays;
            const auto requests = one_form<tfe::ExtendRequest>(
                extend_args(a, first_pos, taps, tokens, row_width(r.ref->header()), arrays));
            nb::gil_scoped_release release;
            const std::lock_guard lock(r.mu);
            r.ref->extend(requests);
          },
          "requests"_a.none(), "first_pos"_a.none() = nb::none(), "taps"_a.none() = nb::none(),
          "tokens"_a.none() = nb::none(),
          nb::sig("def extend(self, requests: int | Sequence[tuple[int, int, object, object]], first_pos: int | None "
                  "= None, taps: object = None, tokens: object = None) -> None"),
          "Absorbs real rows: extend(slot, first_pos, taps, tokens), or extend([(slot, first_pos, taps, tokens),\n"
          "...]) for several slots. taps [rows, taps * target_hidden] bfloat16 (numpy: uint16 bits), tokens [rows]\n"
          "int32. first_pos: the slot's next position (an empty slot starts anywhere). Drafted rows are not kept.")
      .def(
          "extend_batch",
          [](PyReference& r, nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
             nb::handle tokens, nb::handle starts) {
            std::vector<Array> arrays;
            const auto requests = one_form<tfe::ExtendRequest>(
                check_batch(slots, first_pos, counts, taps, tokens, starts, row_width(r.ref->header()), arrays));
            nb::gil_scoped_release release;
            const std::lock_guard lock(r.mu);
            r.ref->extend(requests);
          },
          "slots"_a.none(), "first_pos"_a.none(), "counts"_a.none(), "taps"_a.none(), "tokens"_a.none(), nb::kw_only(),
          "starts"_a.none() = nb::none(),
          nb::sig("def extend_batch(self, slots: Sequence[int] | object, first_pos: Sequence[int] | object, "
                  "counts: Sequence[int] | object, taps: object, tokens: object, *, "
                  "starts: Sequence[int] | None = None) -> None"),
          "extend for several slots from one pair of host arrays: request i is slots[i] at first_pos[i], taking\n"
          "counts[i] rows from row starts[i] (default: right after the previous request's rows).")
      .def(
          "draft",
          [](PyReference& r, nb::handle slots, nb::handle steps) {
            const std::vector<int> s = check_slots(slots);
            const int n = as_int32(steps, "steps");
            tfe::DraftResult d;
            {
              nb::gil_scoped_release release;
              const std::lock_guard lock(r.mu);
              d = r.ref->draft(s, n);
            }
            return draft_result(std::move(d));
          },
          "slots"_a.none(), "steps"_a.none(),
          nb::sig("def draft(self, slots: Sequence[int] | object, steps: int) -> DraftResult"),
          "Drafts `steps` tokens (1..max_steps) after each slot's last row: (tokens, confidences), numpy\n"
          "[slots, steps] int32 and float32. The slots keep their rows: the next extend continues them.")
      .def(
          "reset",
          [](PyReference& r, nb::handle slot) {
            const int s = as_int32(slot, "slot");
            const std::lock_guard lock(r.mu);
            r.ref->reset(s);
          },
          "slot"_a.none(), nb::sig("def reset(self, slot: int) -> None"),
          "Empties the slot: its next extend starts a new sequence.")
      .def_prop_ro("header", [](const PyReference& r) { return header_dict(r.ref->header()); })
      .def_prop_ro("ring_rows", [](const PyReference& r) { return r.ref->ring_rows(); })
      .def_prop_ro("max_slots", [](const PyReference& r) { return r.ref->options().max_slots; })
      .def_prop_ro("max_steps", [](const PyReference& r) { return r.ref->options().max_steps; })
      .def_prop_ro("fp8", [](const PyReference& r) { return std::string(tfe::fp8_mode_name(r.ref->options().fp8)); })
      .def(
          "uses_fp8", [](const PyReference& r, const std::string& linear) { return r.ref->uses_fp8(linear); },
          "linear"_a);

  // ----------------------------------------------------------------------------------------- accept log
  nb::class_<PyAcceptLog>(
      m, "AcceptLog", "Drafts asked and kept by window position, a JSON line every `every` rounds (docs/runtime.md).")
      .def(
          "__init__",
          [](PyAcceptLog* self, nb::handle every, nb::handle path, nb::handle label) {
            tfe::AcceptLogOptions o;
            o.every = static_cast<int>(as_int(every, "every", 0, std::numeric_limits<int>::max()));
            o.path = path.is_none() ? std::string() : as_path(path, "path").string();
            o.label = as_str(label, "label");
            new (self) PyAcceptLog{std::make_unique<tfe::AcceptLog>(std::move(o))};
          },
          nb::kw_only(), "every"_a.none() = 0, "path"_a.none() = "", "label"_a.none() = "",
          nb::sig("def __init__(self, *, every: int = 0, path: str | os.PathLike[str] = '', label: str = '') -> None"))
      .def(
          "record",
          [](PyAcceptLog& l, nb::handle kept, nb::handle steps) {
            const std::vector<int> k = accepted_arg(kept);
            l.get().record(k, as_int32(steps, "steps"));
          },
          "kept"_a.none(), "steps"_a.none(),
          nb::sig("def record(self, kept: Sequence[int] | object, steps: int) -> None"))
      .def("flush", [](PyAcceptLog& l) { l.get().flush(); })
      .def("totals", [](PyAcceptLog& l) { return accept_counts_dict(l.get().totals()); })
      .def(
          "close", [](PyAcceptLog& l) { l.log.reset(); }, "Writes the rounds not yet written and closes the file.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__", [](PyAcceptLog& l, nb::handle, nb::handle, nb::handle) { l.log.reset(); }, nb::arg().none(),
          nb::arg().none(), nb::arg().none());

  // -------------------------------------------------------------------------------------------- runtime
  m.def("cuda_device_count", &cuda_device_count, "CUDA devices visible to this process (0 without a driver).");

  nb::class_<PyRuntime>(m, "Runtime", "One draft head on one GPU (tfe::Runtime).")
      .def(
          "__init__",
          [](PyRuntime* self, nb::handle head, nb::handle artifact, nb::handle stream, nb::handle device,
             nb::handle plan, nb::handle graphs, nb::handle capture, nb::handle verify, nb::handle recompile,
             nb::handle graph_capacity, nb::handle l2_bytes, nb::handle log_every, nb::handle log_path,
             nb::handle log_label, nb::handle tap_dump, nb::handle tap_dump_max_rows, nb::handle self_check,
             const nb::kwargs& kw) {
            tfe::OpenOptions o;
            if (kw.contains("arch"))
              type_error("Runtime() takes no arch: the runtime plans for its device's architecture");
            o.plan = plan_options_from(plan, kw, "Runtime");
            if (!artifact.is_none()) o.artifact_dir = as_path(artifact, "artifact").string();
            o.device = as_int32(device, "device");
            o.stream = stream_arg(stream, o.device);
            o.graphs = as_bool(graphs, "graphs");
            const std::string cap = as_str(capture, "capture");
            if (cap != "at_open" && cap != "lazy") fail("capture: `{}` is not one of at_open, lazy", cap);
            o.capture = cap == "lazy" ? tfe::OpenOptions::Capture::lazy : tfe::OpenOptions::Capture::at_open;
            o.verify_sha256 = as_bool(verify, "verify");
            o.recompile_mismatched_artifact = as_bool(recompile, "recompile_mismatched_artifact");
            o.graph_capacity = static_cast<size_t>(as_int(graph_capacity, "graph_capacity", 0));
            o.l2_resident_weight_bytes = static_cast<size_t>(as_int(l2_bytes, "l2_resident_weight_bytes", 0));
            o.accept_log.every =
                static_cast<int>(as_int(log_every, "accept_log_every", 0, std::numeric_limits<int>::max()));
            o.accept_log.path = log_path.is_none() ? std::string() : as_path(log_path, "accept_log_path").string();
            o.accept_log.label = as_str(log_label, "accept_log_label");
            o.tap_dump.path = tap_dump.is_none() ? std::string() : as_path(tap_dump, "tap_dump").string();
            o.tap_dump.max_rows =
                as_int(tap_dump_max_rows, "tap_dump_max_rows", 1, std::numeric_limits<int32_t>::max());
            o.self_check = as_bool(self_check, "self_check");
            // Refused before the device is looked for, as Runtime::open refuses them before it plans anything.
            if (const tfe::TapDumpOptions d = tfe::tap_dump_options_from_environment(o.tap_dump); !d.path.empty())
              tfe::check_tap_dump_options(d);
            (void)tfe::self_check_from_environment(o.self_check);
            std::shared_ptr<const tfe::HeadFile> file;
            std::string path;
            if (nb::isinstance<PyHead>(head))
              file = nb::cast<PyHead&>(head).file;
            else
              path = as_path(head, "head").string();
            require_cuda_device(o.device);
            std::unique_ptr<tfe::Runtime> rt;
            {
              nb::gil_scoped_release release;
              rt = std::make_unique<tfe::Runtime>(file ? tfe::Runtime::open(*file, o) : tfe::Runtime::open(path, o));
            }
            new (self) PyRuntime{std::move(rt), {}, {}};
          },
          "head"_a.none(), "artifact"_a.none() = nb::none(), nb::kw_only(), "stream"_a.none() = nb::none(),
          "device"_a.none() = 0, "plan"_a.none() = nb::none(), "graphs"_a.none() = true, "capture"_a.none() = "at_open",
          "verify"_a.none() = false, "recompile_mismatched_artifact"_a.none() = false, "graph_capacity"_a.none() = 0,
          "l2_resident_weight_bytes"_a.none() = 0, "accept_log_every"_a.none() = 0, "accept_log_path"_a.none() = "",
          "accept_log_label"_a.none() = "", "tap_dump"_a.none() = "",
          "tap_dump_max_rows"_a.none() = tfe::TapDumpOptions{}.max_rows, "self_check"_a.none() = false, "options"_a,
          nb::sig("def __init__(self, head: str | os.PathLike[str] | HeadFile, artifact: str | os.PathLike[str] | None "
                  "= None, *, stream: object = None, device: int = 0, plan: PlanOptions | None = None, "
                  "graphs: bool = True, capture: str = 'at_open', verify: bool = False, "
                  "recompile_mismatched_artifact: bool = False, graph_capacity: int = 0, "
                  "l2_resident_weight_bytes: int = 0, accept_log_every: int = 0, "
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
          [](PyRuntime& r, nb::handle slots, nb::handle steps) {
            const std::vector<int> s = check_slots(slots);
            const int n = as_int32(steps, "steps");
            return draft_result(r.run([&](tfe::Runtime& rt) { return rt.draft(s, n); }));
          },
          "slots"_a.none(), "steps"_a.none(),
          nb::sig("def draft(self, slots: Sequence[int] | object, steps: int) -> DraftResult"),
          "One graph replay: `steps` tokens after each slot's last row, (tokens, confidences) numpy [slots, steps].")
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
             nb::handle stream) {
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
            tfe::DraftTargets t;
            if (!tokens.is_none())
              t.tokens = static_cast<int32_t*>(check_target(tokens, "tokens", n, n_steps, nb::dtype<int32_t>(), "int32",
                                                            device, t.row_stride, arrays));
            if (!confidences.is_none())
              t.confidences = static_cast<float*>(check_target(
                  confidences, "confidences", n, n_steps, nb::dtype<float>(), "float32", device, t.row_stride, arrays));
            const tfe::DeviceDraftOutputs o = r.run([&](tfe::Runtime& rt) {
              return device_ids ? rt.draft_async(device_ids, n, n_steps, t, s)
                                : rt.draft_async(host_ids, n_steps, t, s);
            });
            return device_draft_result(r, o, device);
          },
          "slots"_a.none(), "steps"_a.none(), nb::kw_only(), "tokens"_a.none() = nb::none(),
          "confidences"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
          nb::sig("def draft_async(self, slots: Sequence[int] | object, steps: int, *, tokens: object = None, "
                  "confidences: object = None, stream: object = None) -> DraftResult"),
          "Enqueues a draft and returns at once: (tokens, confidences) as device arrays [slots, steps] (DLPack,\n"
          "torch.from_dlpack takes them), valid until the next draft. `slots`: a list of ints, or an int32 CUDA\n"
          "tensor whose ids are read on the device (the form a torch.cuda.graph capture can record; the ids may\n"
          "change between replays). `tokens`/`confidences`: CUDA tensors [slots, >= steps] the outputs are also\n"
          "copied into. Enqueued on `stream` (None: the runtime's stream; inside a capture, pass\n"
          "torch.cuda.current_stream()).")
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

#ifdef TFE_HAVE_NCCL
  // ----------------------------------------------------------------------------------- drafts to every rank
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
#endif
}
