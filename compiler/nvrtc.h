// NVRTC: one kernel specialization in, one CUBIN out.
//
// A specialization is compiled as a small generated translation unit: the kernel's source included by
// name, a `TfeConfig` struct of `static constexpr long long` members (the spec's constants), and the name
// expression `<function><TfeConfig>` that NVRTC lowers to the mangled symbol the runtime looks up.
// Every kernel source is handed to NVRTC as a named header, so sources include each other by file name
// and no source tree is needed at run time.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/embedded_sources.h"
#include "kernels/registry.h"

namespace tfe {

// One NVRTC translation unit.
struct CompileUnit {
  std::string uri;                                         // names the unit in progress lines, errors and cache entries
  std::string source;                                      // the generated translation unit
  std::string name_expression;                             // e.g. "tfe::kernels::gemv<TfeConfig>"
  std::vector<std::pair<std::string, int64_t>> constants;  // for error messages
};

// The unit of `spec`, instantiating `def` (tests pass kernels that are not in the registry).
CompileUnit make_compile_unit(const KernelSpec& spec, const KernelDef& def);
CompileUnit make_compile_unit(const KernelSpec& spec);  // def from the registry

// The generated `struct TfeConfig { static constexpr long long NAME = value; ... };`.
std::string config_struct_source(const std::vector<std::pair<std::string, int64_t>>& constants);

// CUDA include directory NVRTC compiles against: $TFE_CUDA_INCLUDE, else the one found at configure time.
std::string cuda_include_dir();

struct CompileOptions {
  std::string arch = "sm_90";  // a real architecture: the output is a CUBIN, not PTX
  std::vector<EmbeddedSource> headers = embedded_kernel_sources();
  std::string cuda_include = cuda_include_dir();
  bool line_info = true;  // -lineinfo: source lines in profilers, no effect on code
};

// The exact NVRTC options for `options`. No fast math: the numerics follow docs/head.md.
std::vector<std::string> nvrtc_options(const CompileOptions& options);

struct NvrtcVersion {
  int major = 0, minor = 0;
  std::string str() const;  // "13.0"
  bool operator==(const NvrtcVersion&) const = default;
};
NvrtcVersion nvrtc_version();
// The CUDA toolkit the library was built against, e.g. "13.0".
std::string cuda_toolkit_version();

struct CompiledKernel {
  std::string uri;
  std::string lowered_name;  // mangled symbol of the instantiation
  std::string cubin;         // ELF image
  std::string log;           // NVRTC's log (warnings), may be empty
};

// Compiles a unit. A compile error throws tfe::Error carrying the NVRTC log, the options, the uri and the
// constants.
CompiledKernel compile_unit(const CompileUnit& unit, const CompileOptions& options);
CompiledKernel compile_spec(const KernelSpec& spec, const CompileOptions& options);

// Compiles `source` and discards the output: for probes whose static_asserts are the result. Throws like
// compile_unit (`label` names the probe).
void check_compiles(const std::string& label, const std::string& source, const CompileOptions& options);

// Whether the CUBIN's ELF symbol table defines `symbol`. Throws tfe::Error on an image that is not a
// well-formed 64-bit ELF.
bool cubin_defines_symbol(std::string_view cubin, std::string_view symbol);

}  // namespace tfe
