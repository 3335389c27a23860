#include "core/yaml_read.h"

#include <yaml-cpp/depthguard.h>

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "core/numeric.h"

namespace tfe::yaml {

namespace {

int line_of(const YAML::Node& n) {
  const auto m = n.Mark();
  return m.is_null() ? 0 : m.line + 1;
}

std::string kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return fmt::format("scalar `{}`", n.Scalar());
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      return "undefined";
  }
  return "?";
}

void spend(Context* ctx, const Field& at, int64_t nodes) {
  ctx->budget -= nodes;
  if (ctx->budget < 0) at.fail("the document visits more nodes than any plan holds (aliases expanding?)");
}

}  // namespace

void Field::fail(std::string_view message) const {
  const int line = line_of(node);
  if (line > 0) tfe::fail("{}: {}: {} (line {})", ctx->doc, path.empty() ? "<root>" : path, message, line);
  tfe::fail("{}: {}: {}", ctx->doc, path.empty() ? "<root>" : path, message);
}

int64_t Field::i64() const {
  if (!node.IsScalar()) fail(fmt::format("expected an integer, found {}", kind_of(node)));
  const std::string& s = node.Scalar();
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) fail(fmt::format("integer `{}` is outside the int64 range", s));
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    fail(fmt::format("expected an integer, found `{}`", s));
  return v;
}

int64_t Field::i64(int64_t lo, int64_t hi) const { return i64(lo, hi, lo, hi); }

int64_t Field::i64(int64_t lo, int64_t hi, int64_t stated_lo, int64_t stated_hi) const {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size())
      fail(fmt::format("{} is outside {}..{}", s, stated_lo, stated_hi));
  }
  const int64_t v = i64();
  if (v < lo || v > hi) fail(fmt::format("{} is outside {}..{}", v, stated_lo, stated_hi));
  return v;
}

int Field::i32(int lo, int hi) const { return static_cast<int>(i64(lo, hi)); }

float Field::f32() const {
  if (!node.IsScalar()) fail(fmt::format("expected a number, found {}", kind_of(node)));
  const std::string& s = node.Scalar();
  // Read as a double first: a number a float cannot hold (1e-300, 1e39) is refused as that, not as 0 or inf.
  double d = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if ((ec != std::errc() && ec != std::errc::result_out_of_range) || end != s.data() + s.size() || s.empty())
    fail(fmt::format("expected a finite float, found `{}`", s));
  const std::optional<float> f = ec == std::errc() ? float32_of(d) : std::nullopt;
  if (!f) fail(fmt::format("`{}` does not fit a 32-bit float ({})", s, kFloat32Range));
  return *f;
}

bool Field::boolean() const {
  if (node.IsScalar() && node.Scalar() == "true") return true;
  if (node.IsScalar() && node.Scalar() == "false") return false;
  fail(fmt::format("expected `true` or `false`, found {}", kind_of(node)));
}

std::string Field::str() const {
  if (!node.IsScalar()) fail(fmt::format("expected a string, found {}", kind_of(node)));
  return node.Scalar();
}

Map Field::map() const { return Map(*this); }

std::vector<Field> Field::seq(size_t max_items) const {
  if (!node.IsSequence()) fail(fmt::format("expected a sequence, found {}", kind_of(node)));
  if (node.size() > max_items) fail(fmt::format("has {} items; at most {} are allowed", node.size(), max_items));
  spend(ctx, *this, static_cast<int64_t>(node.size()) + 1);
  std::vector<Field> out;
  out.reserve(node.size());
  size_t i = 0;
  for (const auto& item : node) out.push_back(Field{ctx, item, fmt::format("{}[{}]", path, i++)});
  return out;
}

Map::Map(const Field& f) : self_(f) {
  if (!f.node.IsMap()) f.fail(fmt::format("expected a mapping, found {}", kind_of(f.node)));
  spend(f.ctx, f, static_cast<int64_t>(f.node.size()) + 1);
  for (const auto& kv : f.node) {
    const Field key{f.ctx, kv.first, f.path};
    if (!kv.first.IsScalar()) key.fail(fmt::format("a key is {}, not a name", kind_of(kv.first)));
    const std::string& k = kv.first.Scalar();
    if (index_.contains(k)) key.fail(fmt::format("key `{}` appears twice", k));
    entries_.push_back(Entry{k, kv.second, false});
    index_.emplace(k, entries_.size() - 1);
  }
}

bool Map::has(std::string_view key) const { return index_.contains(std::string(key)); }

Field Map::at(std::string_view key) {
  const auto it = index_.find(std::string(key));
  if (it == index_.end()) self_.fail(fmt::format("missing key `{}`", key));
  Entry& e = entries_[it->second];
  e.read = true;
  return Field{self_.ctx, e.value, self_.path.empty() ? std::string(key) : fmt::format("{}.{}", self_.path, key)};
}

void Map::done() const {
  for (const auto& e : entries_)
    if (!e.read) {
      const Field f{self_.ctx, e.value, self_.path};
      f.fail(fmt::format("unknown key `{}`", e.key));
    }
}

Field parse(Context& ctx, std::string_view text) {
  try {
    return Field{&ctx, YAML::Load(std::string(text)), ""};
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for it is "bad file".
    tfe::fail("{}: nesting deeper than {} levels (line {}, column {}); tfe's documents nest a few levels", ctx.doc,
              e.depth() - 1, e.mark.line + 1, e.mark.column + 1);
  } catch (const YAML::Exception& e) {
    tfe::fail("{}: not valid YAML: {} (line {}, column {})", ctx.doc, e.msg, e.mark.line + 1, e.mark.column + 1);
  }
}

std::string float_text(float f) { return fmt::format("{}", f); }

}  // namespace tfe::yaml
