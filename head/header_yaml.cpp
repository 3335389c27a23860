#include "head/header_yaml.h"

#include <limits>

#include "core/error.h"
#include "head/header_fields.h"

namespace tfe {

namespace {

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();

YAML::Node flow_map() {
  YAML::Node n(YAML::NodeType::Map);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}

// Writes the fields (head/header_fields.h) into a YAML map, floats in their shortest form.
struct YamlWriter {
  YAML::Node& n;

  void integer(const char* key, int64_t v) { n[key] = v; }
  void real(const char* key, float v) { n[key] = yaml::float_text(v); }
  void flag(const char* key, bool v) { n[key] = v; }
  void text(const char* key, const std::string& v) { n[key] = v; }
  void head_type(const char* key, HeadType t) { n[key] = std::string(head_type_name(t)); }
  void names(const char* key, const std::vector<std::string>& v) {
    YAML::Node seq(YAML::NodeType::Sequence);
    seq.SetStyle(YAML::EmitterStyle::Flow);
    for (const auto& name : v) seq.push_back(name);
    n[key] = seq;
  }
  void rope(const char* key, const Rope& r) {
    YAML::Node sub = flow_map();
    YamlWriter w{sub};
    visit_rope_fields(w, r);
    n[key] = sub;
  }
  void taps(const char* key, const std::vector<Tap>& taps) {
    YAML::Node seq(YAML::NodeType::Sequence);
    seq.SetStyle(YAML::EmitterStyle::Flow);
    for (const auto& t : taps) {
      YAML::Node tap = flow_map();
      if (t.layer == -1) {
        tap["layer"] = "final";
      } else {
        tap["layer"] = t.layer;
      }
      tap["norm"] = t.norm;
      seq.push_back(tap);
    }
    n[key] = seq;
  }
};

// Reads the fields (head/header_fields.h) from a YAML map; every key required, none unknown.
struct YamlReader {
  yaml::Map& m;

  // Refused where the C++ field cannot hold the value, stating the format's range (validate() checks it).
  void integer(const char* key, int64_t& out) {
    const IntegerRange format = header_integer_range(key);
    out = m.at(key).i64(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), format.lo, format.hi);
  }
  void integer(const char* key, int& out) {
    const IntegerRange format = header_integer_range(key);
    out = static_cast<int>(m.at(key).i64(kIntMin, kIntMax, format.lo, format.hi));
  }
  void real(const char* key, float& out) { out = m.at(key).f32(); }
  void flag(const char* key, bool& out) { out = m.at(key).boolean(); }
  void text(const char* key, std::string& out) { out = m.at(key).str(); }
  void head_type(const char* key, HeadType& out) {
    const auto t = m.at(key);
    const std::string s = t.str();
    if (s == "dense") {
      out = HeadType::dense;
    } else if (s == "two_stage") {
      out = HeadType::two_stage;
    } else {
      t.fail(fmt::format("head_type `{}` is neither `dense` nor `two_stage`", s));
    }
  }
  void names(const char* key, std::vector<std::string>& out) {
    for (const auto& l : m.at(key).seq(std::size(kLinears))) out.push_back(l.str());
  }
  void rope(const char* key, Rope& r) {
    yaml::Map sub(m.at(key));
    YamlReader read{sub};
    visit_rope_fields(read, r);
    sub.done();
  }
  void taps(const char* key, std::vector<Tap>& out) {
    for (const auto& tf : m.at(key).seq(kMaxTaps)) {
      yaml::Map t(tf);
      Tap tap;
      const auto layer = t.at("layer");
      if (layer.node.IsScalar() && layer.node.Scalar() == "final") {
        tap.layer = -1;
      } else {
        if (!layer.node.IsScalar()) layer.fail("expected a layer index or `final`");
        tap.layer = layer.i32(0, kIntMax);
      }
      tap.norm = t.at("norm").boolean();
      t.done();
      out.push_back(tap);
    }
  }
};

}  // namespace

YAML::Node header_to_yaml(const HeadHeader& h) {
  YAML::Node n(YAML::NodeType::Map);
  n["format_version"] = h.format_version;
  YamlWriter w{n};
  visit_header_fields(w, h);
  return n;
}

HeadHeader header_from_yaml(const yaml::Field& f) {
  yaml::Map m(f);
  HeadHeader h;
  h.format_version = m.at("format_version").i32(kIntMin, kIntMax);
  if (h.format_version != kHeadFormatVersion)
    m.at("format_version")
        .fail(fmt::format("format_version {} is not supported (this build reads {})", h.format_version,
                          kHeadFormatVersion));
  YamlReader read{m};
  visit_header_fields(read, h);
  m.done();
  try {
    validate(h);
  } catch (const Error& e) {
    f.fail(e.what());
  }
  return h;
}

HeadHeader header_from_yaml(const YAML::Node& node) {
  yaml::Context ctx{"header YAML"};
  return header_from_yaml(yaml::Field{&ctx, node, ""});
}

HeadHeader header_from_yaml_text(std::string_view text) {
  yaml::Context ctx{"header YAML"};
  return header_from_yaml(yaml::parse(ctx, text));
}

}  // namespace tfe
