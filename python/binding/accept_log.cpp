// tfe.AcceptLog (<tfe/accept_log.h>), and the accept counts as Python reads them (also Runtime's).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tfe/accept_log.h>

#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

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
  nb::object items = nb::steal(PyObject_GetIter(h.ptr()));
  if (!items.is_valid()) {
    PyErr_Clear();
    type_error(fmt::format("kept: expected a sequence of ints, got {}", py_type(h)));
  }
  std::vector<int> out;
  size_t i = 0;
  for (;;) {
    nb::object item = nb::steal(PyIter_Next(items.ptr()));
    if (!item.is_valid()) break;  // the end, or an error the iterator raised
    out.push_back(as_int32(item, fmt::format("kept[{}]", i++)));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

namespace {

struct PyAcceptLog {
  std::unique_ptr<tfe::AcceptLog> log;
  tfe::AcceptLog& get() {
    if (!log) fail("accept log: closed");
    return *log;
  }
};

}  // namespace

void bind_accept_log(nb::module_& m) {
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
}

}  // namespace tfe::py
