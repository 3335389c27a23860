// Arrays from Python (arrays.cpp): DLPack or the buffer protocol (torch, CuPy, JAX, numpy) without a copy,
// and torch tensors read through their own accessors. Every check names the argument, the expected and the
// actual, so that the library never reads past what an array holds.
#pragma once
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <tfe/draft.h>

#include "binding.h"

namespace tfe::py {

using Array = nb::ndarray<nb::ro>;
namespace dl = nb::dlpack;

std::string dtype_text(dl::dtype d);
bool is(dl::dtype d, dl::dtype_code code, int bits);
std::string device_text(const Array& a);
std::string shape_text(const Array& a);

Array as_array(nb::handle h, const std::string& name, std::string_view expected);
bool on_host(const Array& a);
bool on_cuda(const Array& a);
// Where a checked array's data may be read from. `device` < 0: the host only; otherwise also CUDA memory of
// that device.
void check_place(const Array& a, const std::string& name, std::string_view call, int device = -1);
void check_host(const Array& a, const std::string& name, std::string_view call);
// Row-major with no gaps, and aligned for its element type: the library reads it as one flat span.
void check_layout(const Array& a, const std::string& name);
void check_ndim(const Array& a, const std::string& name, size_t ndim, std::string_view shape);
// taps [rows, row_width] bf16 (or uint16 bits) and tokens [rows] int32.
Array check_taps(nb::handle h, const std::string& name, int64_t row_width, std::string_view call, int device = -1);
Array check_tokens(nb::handle h, const std::string& name, std::string_view call, int device = -1);

using AnyRequest = std::variant<tfe::ExtendRequest, tfe::DeviceExtendRequest>;

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

// A list, tuple or range of ints, or a 1-D integer array on the host, each within lo..hi.
std::vector<int64_t> host_ints(nb::handle h, const std::string& name, std::string_view call, int64_t lo, int64_t hi);
// draft's slots: a list, tuple or range of ints, or a 1-D integer array on the host.
std::vector<int> check_slots(nb::handle h);
// draft's first_ranks on the host: None (empty: every slot its best), or ints as check_slots takes them; any
// int, since the C++ call's own check names the field and its limits.
std::vector<int> host_first_ranks(nb::handle h, std::string_view call);
// extend_batch's arguments as requests; `arrays` keeps what their spans point into alive until the call returns.
std::vector<AnyRequest> check_batch(nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
                                    nb::handle tokens, nb::handle starts, int64_t row_width, std::vector<Array>& arrays,
                                    int device = -1);
// The two forms of extend, as one argument list: (slot, first_pos, taps, tokens) or (requests). `device`
// >= 0: device rows are taken too.
std::vector<AnyRequest> extend_args(nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens,
                                    int64_t width, std::vector<Array>& arrays, int device = -1);
// A 2-D CUDA target of an enqueued draft: [rows >= n, >= steps] of `dtype`, rows any stride apart.
void* check_target(nb::handle h, const std::string& name, int n, int steps, dl::dtype dtype,
                   std::string_view dtype_name, int device, int64_t& row_stride, std::vector<Array>& arrays);

// A draft's tokens and confidences as numpy arrays [streams, steps], in a DraftResult.
nb::object draft_result(tfe::DraftResult&& d);

}  // namespace tfe::py
