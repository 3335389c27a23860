#include "compiler/nvrtc.h"

#include <cuda.h>
#include <elf.h>
#include <nvrtc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

#ifndef TFE_CUDA_INCLUDE_DIR
#error "TFE_CUDA_INCLUDE_DIR must be defined by the build (CMakeLists.txt)"
#endif

namespace tfe {

namespace {

struct ProgramDeleter {
  void operator()(nvrtcProgram p) const noexcept { nvrtcDestroyProgram(&p); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

void check(nvrtcResult r, std::string_view what, std::string_view label) {
  if (r != NVRTC_SUCCESS) fail("nvrtc: {} failed for {}: {}", what, label, nvrtcGetErrorString(r));
}

std::string program_log(nvrtcProgram p, std::string_view label) {
  size_t size = 0;
  check(nvrtcGetProgramLogSize(p, &size), "nvrtcGetProgramLogSize", label);
  std::string log(size, '\0');
  if (size > 0) check(nvrtcGetProgramLog(p, log.data()), "nvrtcGetProgramLog", label);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

std::string constants_text(const std::vector<std::pair<std::string, int64_t>>& constants) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : constants) parts.push_back(fmt::format("{}={}", k, v));
  return parts.empty() ? "(none)" : fmt::format("{}", fmt::join(parts, " "));
}

// Creates and compiles a program; on a compile error throws with everything needed to reproduce it.
Program compile_program(const std::string& label, const std::string& source, const std::vector<std::string>& names,
                        const CompileOptions& options, const std::vector<std::pair<std::string, int64_t>>& constants,
                        std::string* log_out) {
  std::vector<const char*> header_texts, header_names;
  for (const auto& h : options.headers) {
    header_texts.push_back(h.text.c_str());
    header_names.push_back(h.name.c_str());
  }
  nvrtcProgram raw = nullptr;
  check(nvrtcCreateProgram(&raw, source.c_str(), (label + ".cu").c_str(), static_cast<int>(header_texts.size()),
                           header_texts.data(), header_names.data()),
        "nvrtcCreateProgram", label);
  Program prog(raw);
  for (const auto& n : names) check(nvrtcAddNameExpression(prog.get(), n.c_str()), "nvrtcAddNameExpression", label);

  const std::vector<std::string> opts = nvrtc_options(options);
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  std::string log = program_log(prog.get(), label);
  if (r != NVRTC_SUCCESS)
    fail("nvrtc: compiling {} failed ({})\n  constants: {}\n  options: {}\n  log:\n{}", label, nvrtcGetErrorString(r),
         constants_text(constants), fmt::join(opts, " "), Verbatim{log});
  if (log_out) *log_out = std::move(log);
  return prog;
}

}  // namespace

std::string config_struct_source(const std::vector<std::pair<std::string, int64_t>>& constants) {
  std::string s = "struct TfeConfig {\n";
  for (const auto& [k, v] : constants) s += fmt::format("  static constexpr long long {} = {}LL;\n", k, v);
  s += "};\n";
  return s;
}

CompileUnit make_compile_unit(const KernelSpec& spec, const KernelDef& def) {
  if (spec.kernel != def.name) fail("compile unit: spec names kernel `{}`, definition is `{}`", spec.kernel, def.name);
  if (spec.constants.size() != def.constants.size())
    fail("compile unit {}: {} constants given, {} expected", spec.uri(), spec.constants.size(), def.constants.size());
  for (size_t i = 0; i < def.constants.size(); ++i)
    if (spec.constants[i].first != def.constants[i])
      fail("compile unit {}: constant {} is `{}`, expected `{}`", spec.uri(), i, spec.constants[i].first,
           def.constants[i]);
  CompileUnit u;
  u.uri = spec.uri();
  u.constants = spec.constants;
  u.name_expression = def.function + "<TfeConfig>";
  u.source = fmt::format("// {}\n#include \"{}\"\n\n{}", u.uri, def.source, config_struct_source(spec.constants));
  return u;
}

CompileUnit make_compile_unit(const KernelSpec& spec) { return make_compile_unit(spec, kernel_def(spec.kernel)); }

std::string cuda_include_dir() {
  if (const char* env = std::getenv("TFE_CUDA_INCLUDE"); env && *env) return env;
  return TFE_CUDA_INCLUDE_DIR;
}

std::vector<std::string> nvrtc_options(const CompileOptions& options) {
  if (options.arch.size() < 4 || options.arch.rfind("sm_", 0) != 0 ||
      options.arch.find_first_not_of("0123456789af", 3) != std::string::npos)
    fail("compile options: arch `{}` is not a real architecture like sm_90 (a CUBIN needs sm_XX)", options.arch);
  std::vector<std::string> o = {
      "--gpu-architecture=" + options.arch,
      "-std=c++17",
      "-default-device",
      "-I" + options.cuda_include,
  };
  if (options.line_info) o.push_back("-lineinfo");
  return o;
}

std::string NvrtcVersion::str() const { return fmt::format("{}.{}", major, minor); }

NvrtcVersion nvrtc_version() {
  NvrtcVersion v;
  check(nvrtcVersion(&v.major, &v.minor), "nvrtcVersion", "the library");
  return v;
}

std::string cuda_toolkit_version() { return fmt::format("{}.{}", CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10); }

CompiledKernel compile_unit(const CompileUnit& unit, const CompileOptions& options) {
  CompiledKernel k;
  k.uri = unit.uri;
  Program prog = compile_program(unit.uri, unit.source, {unit.name_expression}, options, unit.constants, &k.log);
  const char* lowered = nullptr;
  check(nvrtcGetLoweredName(prog.get(), unit.name_expression.c_str(), &lowered), "nvrtcGetLoweredName", unit.uri);
  k.lowered_name = lowered;
  size_t size = 0;
  check(nvrtcGetCUBINSize(prog.get(), &size), "nvrtcGetCUBINSize", unit.uri);
  if (size == 0) fail("nvrtc: {} produced an empty CUBIN for {}", unit.uri, options.arch);
  k.cubin.resize(size);
  check(nvrtcGetCUBIN(prog.get(), k.cubin.data()), "nvrtcGetCUBIN", unit.uri);
  return k;
}

CompiledKernel compile_spec(const KernelSpec& spec, const CompileOptions& options) {
  return compile_unit(make_compile_unit(spec), options);
}

void check_compiles(const std::string& label, const std::string& source, const CompileOptions& options) {
  compile_program(label, source, {}, options, {}, nullptr);
}

bool cubin_defines_symbol(std::string_view cubin, std::string_view symbol) {
  auto bad = [&](std::string_view why) -> bool { fail("cubin: not a well-formed ELF64 image: {}", why); };
  if (cubin.size() < sizeof(Elf64_Ehdr)) return bad(fmt::format("{} bytes, shorter than an ELF header", cubin.size()));
  Elf64_Ehdr eh;
  std::memcpy(&eh, cubin.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return bad("no ELF magic");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return bad("not 64-bit");
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) return bad(fmt::format("section header size {}", eh.e_shentsize));
  auto in_image = [&](uint64_t off, uint64_t len) { return off <= cubin.size() && len <= cubin.size() - off; };
  if (!in_image(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr))) return bad("section headers outside the image");
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, cubin.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh);
    return sh;
  };
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_SYMTAB) continue;
    if (sh.sh_link >= eh.e_shnum) return bad("symbol table links to a missing string table");
    const Elf64_Shdr strtab = section(sh.sh_link);
    if (!in_image(sh.sh_offset, sh.sh_size) || !in_image(strtab.sh_offset, strtab.sh_size))
      return bad("symbol or string table outside the image");
    const std::string_view names(cubin.data() + strtab.sh_offset, strtab.sh_size);
    for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= sh.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, cubin.data() + sh.sh_offset + off, sizeof sym);
      if (sym.st_shndx == SHN_UNDEF || sym.st_name >= names.size()) continue;
      const std::string_view rest = names.substr(sym.st_name);
      if (rest.substr(0, rest.find('\0')) == symbol) return true;
    }
  }
  return false;
}

}  // namespace tfe
