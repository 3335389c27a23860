#include "plan/header_yaml.h"

#include <limits>

#include "plan/error.h"

namespace tfe {

namespace {

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();

YAML::Node flow_map() {
  YAML::Node n(YAML::NodeType::Map);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}

}  // namespace

YAML::Node header_to_yaml(const HeadHeader& h) {
  YAML::Node n(YAML::NodeType::Map);
  n["format_version"] = h.format_version;
  n["name"] = h.name;
  YAML::Node taps(YAML::NodeType::Sequence);
  taps.SetStyle(YAML::EmitterStyle::Flow);
  for (const auto& t : h.taps) {
    YAML::Node tap = flow_map();
    if (t.layer == -1) {
      tap["layer"] = "final";
    } else {
      tap["layer"] = t.layer;
    }
    tap["norm"] = t.norm;
    taps.push_back(tap);
  }
  n["taps"] = taps;
  n["target_hidden"] = h.target_hidden;
  n["hidden"] = h.hidden;
  n["heads"] = h.heads;
  n["kv_heads"] = h.kv_heads;
  n["head_dim"] = h.head_dim;
  n["ffn"] = h.ffn;
  n["vocab"] = h.vocab;
  n["draft_vocab"] = h.draft_vocab;
  n["window"] = h.window;
  YAML::Node rope = flow_map();
  rope["theta"] = yaml::float_text(h.rope.theta);
  rope["llama3"] = h.rope.llama3;
  rope["factor"] = yaml::float_text(h.rope.factor);
  rope["low_freq_factor"] = yaml::float_text(h.rope.low_freq_factor);
  rope["high_freq_factor"] = yaml::float_text(h.rope.high_freq_factor);
  rope["original_max_positions"] = h.rope.original_max_positions;
  n["rope"] = rope;
  n["rms_eps"] = yaml::float_text(h.rms_eps);
  n["qk_norm"] = h.qk_norm;
  n["head_type"] = std::string(head_type_name(h.head_type));
  n["cand_k"] = h.cand_k;
  n["lowrank"] = h.lowrank;
  YAML::Node fp8(YAML::NodeType::Sequence);
  fp8.SetStyle(YAML::EmitterStyle::Flow);
  for (const auto& l : h.fp8) fp8.push_back(l);
  n["fp8"] = fp8;
  return n;
}

HeadHeader header_from_yaml(const yaml::Field& f) {
  yaml::Map m(f);
  HeadHeader h;
  h.format_version = m.at("format_version").i32(kIntMin, kIntMax);
  if (h.format_version != kHeadFormatVersion)
    m.at("format_version").fail(fmt::format("format_version {} is not supported (this build reads {})",
                                            h.format_version, kHeadFormatVersion));
  h.name = m.at("name").str();
  for (const auto& tf : m.at("taps").seq(kMaxTaps)) {
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
    h.taps.push_back(tap);
  }
  h.target_hidden = m.at("target_hidden").i64();
  h.hidden = m.at("hidden").i64();
  h.heads = m.at("heads").i64();
  h.kv_heads = m.at("kv_heads").i64();
  h.head_dim = m.at("head_dim").i64();
  h.ffn = m.at("ffn").i64();
  h.vocab = m.at("vocab").i64();
  h.draft_vocab = m.at("draft_vocab").i64();
  h.window = m.at("window").i32(kIntMin, kIntMax);
  {
    yaml::Map r(m.at("rope"));
    h.rope.theta = r.at("theta").f32();
    h.rope.llama3 = r.at("llama3").boolean();
    h.rope.factor = r.at("factor").f32();
    h.rope.low_freq_factor = r.at("low_freq_factor").f32();
    h.rope.high_freq_factor = r.at("high_freq_factor").f32();
    h.rope.original_max_positions = r.at("original_max_positions").i32(kIntMin, kIntMax);
    r.done();
  }
  h.rms_eps = m.at("rms_eps").f32();
  h.qk_norm = m.at("qk_norm").boolean();
  {
    const auto t = m.at("head_type");
    const std::string s = t.str();
    if (s == "dense") {
      h.head_type = HeadType::dense;
    } else if (s == "two_stage") {
      h.head_type = HeadType::two_stage;
    } else {
      t.fail(fmt::format("head_type `{}` is neither `dense` nor `two_stage`", s));
    }
  }
  h.cand_k = m.at("cand_k").i32(kIntMin, kIntMax);
  h.lowrank = m.at("lowrank").i64();
  for (const auto& l : m.at("fp8").seq(std::size(kLinears))) h.fp8.push_back(l.str());
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
