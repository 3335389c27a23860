// Python values read as the library's (an int in range, a bool, a path, ...), and the plan options:
// tfe.PlanOptions and the keyword arguments of compile, plan_yaml and Runtime.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tfe/head_file.h>
#include <tfe/options.h>

#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

[[noreturn]] void type_error(const std::string& what) { throw nb::type_error(what.c_str()); }

std::string py_type(nb::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// An int (or anything with __index__, such as a numpy integer) in [lo, hi]; bool is refused, since a
// flag passed where a count belongs is a mistake.
int64_t as_int(nb::handle h, const std::string& name, int64_t lo, int64_t hi) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    type_error(fmt::format("{}: expected an int, got {}", name, py_type(h)));
  nb::object index = nb::steal(PyNumber_Index(h.ptr()));
  if (!index.is_valid()) {  // e.g. a numpy array of one int, whose __index__ refuses in its own words
    PyErr_Clear();
    type_error(fmt::format("{}: expected an int, got {}", name, py_type(h)));
  }
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
// Plan options: one table of names for PlanOptions(**kw), compile, plan_yaml and Runtime.

const std::vector<std::string>& plan_option_names() {
  static const std::vector<std::string> names = {"buckets",     "max_steps",       "fp8",    "arch",       "max_slots",
                                                 "extend_rows", "attention_split", "cand_k", "first_ranks"};
  return names;
}

namespace {

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
  } else if (key == "first_ranks") {
    o.first_ranks = as_bool(v, key);
  } else {
    return false;
  }
  return true;
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
  d["first_ranks"] = o.first_ranks;
  return d;
}

}  // namespace

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

void bind_plan_options(nb::module_& m) {
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
      .def_prop_rw(
          "first_ranks", [](const tfe::PlanOptions& o) { return o.first_ranks; },
          [](tfe::PlanOptions& o, nb::handle v) { set_plan_option(o, "first_ranks", v); })
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
}

}  // namespace tfe::py
