// tfe.HeadFile, tfe.Preset, tfe.Artifact and what tfe-plan does as calls: random_head, convert, plan_yaml
// and compile (<tfe/deploy.h>).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tfe/deploy.h>
#include <tfe/head_file.h>

#include "arrays.h"
#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

namespace {

std::shared_ptr<const tfe::HeadFile> open_head(const std::string& path, bool verify) {
  nb::gil_scoped_release release;
  return std::make_shared<const tfe::HeadFile>(tfe::HeadFile::open(path, {.verify_sha256 = verify}));
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

struct PyArtifact {
  std::string path;
};

}  // namespace

// A head argument: a tfe.HeadFile, or a path opened now.
std::shared_ptr<const tfe::HeadFile> head_arg(nb::handle h, const std::string& name, bool verify) {
  if (nb::isinstance<PyHead>(h)) return nb::cast<PyHead&>(h).file;
  if (nb::isinstance<PyPreset>(h))
    fail("{}: a preset has no weights; pass a head file (tfe.random_head makes one)", name);
  return open_head(as_path(h, name).string(), verify);
}

void bind_heads(nb::module_& m) {
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
}

}  // namespace tfe::py
