#include "kernels/registry.h"

#include <algorithm>
#include <limits>
#include <set>

#include "core/error.h"

namespace tfe {

std::string_view param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::ptr:
      return "ptr";
    case ParamKind::i64:
      return "i64";
    case ParamKind::f32:
      return "f32";
  }
  return "?";
}

std::string_view buffer_role_name(BufferRole r) {
  switch (r) {
    case BufferRole::weight:
      return "weight";
    case BufferRole::state:
      return "state";
    case BufferRole::table:
      return "table";
    case BufferRole::activation:
      return "activation";
    case BufferRole::output:
      return "output";
    case BufferRole::input:
      return "input";
    case BufferRole::host:
      return "host";
  }
  return "?";
}

std::string buffer_roles_name(BufferRoles roles) {
  std::vector<std::string_view> names;
  for (BufferRole r : {BufferRole::weight, BufferRole::state, BufferRole::table, BufferRole::activation,
                       BufferRole::output, BufferRole::input, BufferRole::host})
    if (roles & role_bit(r)) names.push_back(buffer_role_name(r));
  if (names.empty()) return "no role";
  std::string s(names.front());
  for (size_t i = 1; i < names.size(); ++i) s += fmt::format("{}{}", i + 1 == names.size() ? " or " : ", ", names[i]);
  return s;
}

namespace kernel_desc {

int64_t product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return std::numeric_limits<int64_t>::max();
  return p;
}

int64_t saturating_add(int64_t a, int64_t b) {
  int64_t s;
  return __builtin_add_overflow(a, b, &s) ? std::numeric_limits<int64_t>::max() : s;
}

std::vector<std::string> constant_names(std::string_view declared) {
  std::vector<std::string> names;
  while (!declared.empty()) {
    const size_t comma = declared.find(',');
    std::string_view name = declared.substr(0, comma);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    names.emplace_back(name);
    declared = comma == std::string_view::npos ? std::string_view() : declared.substr(comma + 1);
  }
  return names;
}

KernelSpec constants_spec(std::string_view kernel, std::string_view declared, std::initializer_list<Constant> values) {
  const auto names = constant_names(declared);
  std::vector<std::pair<std::string, int64_t>> constants;
  for (const Constant& v : values) {
    const std::string& name = names.at(constants.size());
    if (!v.set()) fail("kernel spec {}: constant {} is not set", kernel, name);
    constants.emplace_back(name, v);
  }
  return make_spec(kernel, std::move(constants));
}

std::vector<int64_t> constants_of(const KernelSpec& spec, std::string_view kernel, std::string_view declared) {
  if (spec.kernel != kernel) fail("kernel spec {}: read as a spec of {}", spec.uri(), kernel);
  const auto names = constant_names(declared);
  std::vector<int64_t> values;
  for (const auto& name : names) values.push_back(spec.constant(name));
  return values;
}

}  // namespace kernel_desc

namespace {

// What every description must hold, checked once when the registry is built: a description without a
// launch or a reach would otherwise surface only as a refused plan.
std::vector<KernelDef> checked(std::vector<KernelDef> defs) {
  std::set<std::string> names;
  for (const auto& d : defs) {
    if (!names.insert(d.name).second) fail("kernel registry: `{}` is described twice", d.name);
    if (!d.launch) fail("kernel registry: {} has no launch shape", d.name);
    std::set<std::string> params;
    for (const auto& p : d.params) {
      if (!params.insert(p.name).second) fail("kernel registry: {} lists parameter `{}` twice", d.name, p.name);
      const bool ptr = p.kind == ParamKind::ptr;
      if (ptr != static_cast<bool>(p.reach) || ptr != static_cast<bool>(p.dtype))
        fail("kernel registry: {} parameter `{}`: a reach and a dtype are what a pointer has, and only a pointer",
             d.name, p.name);
      if (ptr && (p.roles == 0 || (p.writes && (p.roles & role_bit(BufferRole::weight)))))
        fail("kernel registry: {} parameter `{}` may bind {}", d.name, p.name, buffer_roles_name(p.roles));
      if (!ptr && (p.writes || p.alignment != 1))
        fail("kernel registry: {} parameter `{}` is a scalar, so neither written nor aligned", d.name, p.name);
    }
  }
  return defs;
}

const KernelParam* find_param(const KernelDef& def, std::string_view name) {
  for (const auto& p : def.params)
    if (p.name == name) return &p;
  return nullptr;
}

const KernelParam& pointer_param(const KernelSpec& spec, std::string_view param, std::string_view what) {
  const KernelParam* p = find_param(kernel_def(spec.kernel), param);
  if (!p || p->kind != ParamKind::ptr) fail("{}: kernel {} has no pointer parameter `{}`", what, spec.kernel, param);
  return *p;
}

}  // namespace

const std::vector<KernelDef>& kernel_defs() {
  static const std::vector<KernelDef> defs = checked({
      kernel_desc::rmsnorm(),
      kernel_desc::prepare_x(),
      kernel_desc::copy_rows(),
      kernel_desc::gemv(),
      kernel_desc::gemv_cluster(),
      kernel_desc::gemv_rope_kv(),
      kernel_desc::qk_rope_kv(),
      kernel_desc::ring_attention(),
      kernel_desc::top1(),
      kernel_desc::ranked(),
      kernel_desc::topk(),
      kernel_desc::rescore(),
      kernel_desc::load_tables(),
      kernel_desc::store_outputs(),
      kernel_desc::gather_taps(),
      kernel_desc::keep_state(),
  });
  return defs;
}

const KernelDef& kernel_def(std::string_view name) {
  for (const auto& d : kernel_defs())
    if (d.name == name) return d;
  fail("kernel registry: no kernel named `{}`", name);
}

int64_t KernelSpec::constant(std::string_view name) const {
  for (const auto& [k, v] : constants)
    if (k == name) return v;
  fail("kernel spec {}: no constant `{}`", kernel, name);
}

std::string KernelSpec::uri() const {
  std::string u = kernel;
  for (const auto& [k, v] : constants) {
    std::string lk = k;
    std::transform(lk.begin(), lk.end(), lk.begin(), [](unsigned char c) { return std::tolower(c); });
    u += fmt::format("__{}_{}", lk, v);
  }
  return u;
}

KernelSpec make_spec(std::string_view kernel, std::vector<std::pair<std::string, int64_t>> constants) {
  const auto& def = kernel_def(kernel);
  if (constants.size() != def.constants.size())
    fail("kernel spec {}: {} constants given, {} expected", kernel, constants.size(), def.constants.size());
  for (size_t i = 0; i < constants.size(); ++i)
    if (constants[i].first != def.constants[i])
      fail("kernel spec {}: constant {} is `{}`, expected `{}`", kernel, i, constants[i].first, def.constants[i]);
  return KernelSpec{std::string(kernel), std::move(constants)};
}

LaunchShape launch_shape(const KernelSpec& spec, int64_t rows) {
  if (rows < 1) fail("launch_shape {}: rows is {}, must be at least 1", spec.uri(), rows);
  return kernel_def(spec.kernel).launch(spec, rows);
}

int64_t param_reach(const KernelSpec& spec, std::string_view param, const Reach& r) {
  return pointer_param(spec, param, "param_reach").reach(spec, r);
}

int64_t param_alignment(const KernelSpec& spec, std::string_view param) {
  return pointer_param(spec, param, "param_alignment").alignment;
}

DType param_dtype(const KernelSpec& spec, std::string_view param) {
  return pointer_param(spec, param, "param_dtype").dtype(spec);
}

BufferRoles param_roles(const KernelSpec& spec, std::string_view param) {
  return pointer_param(spec, param, "param_roles").roles;
}

bool param_writes(std::string_view kernel, std::string_view param) {
  for (const auto& d : kernel_defs())
    if (d.name == kernel) {
      const KernelParam* p = find_param(d, param);
      return p && p->writes;
    }
  fail("param_writes: no kernel named `{}`", kernel);
}

}  // namespace tfe
