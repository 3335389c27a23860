// tfe._tfe: the Python binding of tfe (nanobind), over the public headers (include/tfe) alone, one file a
// class or two (binding.h lists them). Arrays arrive through DLPack or the buffer protocol (torch, CuPy, JAX,
// numpy) without a copy (arrays.h). Every argument is checked before the library sees it:
// a wrong type, dtype, shape, device, stride or alignment is refused naming the argument, the expected and
// the actual, so that the library never reads past what an array holds. Errors map by C++ type:
//   tfe::CudaError (a CUDA or cuBLASLt call failed; device state unknown)  -> tfe.CudaError (RuntimeError)
//   tfe::Error (a refused call; nothing changed), and the binding's checks -> tfe.Error (ValueError)
//   a Python value of the wrong type (a str for an int)                     -> TypeError
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <exception>

#include <tfe/error.h>

#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

nb::handle g_draft_result;
nb::handle g_tensor_info;

namespace {
nb::handle g_error;       // tfe.Error (ValueError)
nb::handle g_cuda_error;  // tfe.CudaError (RuntimeError)
}  // namespace

}  // namespace tfe::py

using namespace tfe::py;

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

  bind_plan_options(m);
  bind_heads(m);
  bind_reference(m);
  bind_accept_log(m);
  bind_runtime(m);
#ifdef TFE_HAVE_NCCL
  bind_broadcast(m);
#endif
}
