// Arrays from Python (arrays.h): the checks of each array argument, and the requests they make.
#include "arrays.h"

#include <nanobind/ndarray.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tfe::py {

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

namespace {

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

}  // namespace

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
void check_place(const Array& a, const std::string& name, std::string_view call, int device) {
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
Array check_taps(nb::handle h, const std::string& name, int64_t row_width, std::string_view call, int device) {
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

Array check_tokens(nb::handle h, const std::string& name, std::string_view call, int device) {
  Array a = as_array(h, name, "int32");
  check_place(a, name, call, device);
  if (!is(a.dtype(), dl::dtype_code::Int, 32)) fail("{}: expected int32, got {}", name, dtype_text(a.dtype()));
  check_ndim(a, name, 1, "[rows]");
  check_layout(a, name);
  return a;
}

namespace {

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
                         const std::string& prefix, int64_t row_width, std::vector<Array>& arrays, int device) {
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

template <typename T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner).cast();
}

}  // namespace

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

std::vector<int> host_first_ranks(nb::handle h, std::string_view call) {
  if (h.is_none()) return {};
  const std::vector<int64_t> v =
      host_ints(h, "first_ranks", call, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  return {v.begin(), v.end()};
}

// extend_batch: request i is slots[i] at first_pos[i], taking counts[i] rows of the shared taps and tokens
// from row starts[i] (default: the rows of the requests before it, in order). One array pair for every slot
// is what an engine holds after verification, and it crosses the DLPack boundary twice instead of twice a
// slot.
std::vector<AnyRequest> check_batch(nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
                                    nb::handle tokens, nb::handle starts, int64_t row_width, std::vector<Array>& arrays,
                                    int device) {
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

nb::object draft_result(tfe::DraftResult&& d) {
  const size_t n = static_cast<size_t>(d.streams), s = static_cast<size_t>(d.steps);
  return g_draft_result(to_numpy(std::move(d.tokens), {n, s}), to_numpy(std::move(d.confidences), {n, s}));
}

// The two forms of extend, as one argument list: (slot, first_pos, taps, tokens) or (requests). `device`
// >= 0: device rows are taken too.
std::vector<AnyRequest> extend_args(nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens,
                                    int64_t width, std::vector<Array>& arrays, int device) {
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

}  // namespace tfe::py
