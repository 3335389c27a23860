// The fields of a head header in their written order, walked once for every form that reads or writes
// them: the JSON of a .tfe file (head/header_json.cpp) and the YAML of a plan or a `random --config`
// (head/header_yaml.cpp). Each form supplies a visitor with one method per kind of field; a writer takes
// `const HeadHeader&` and values, a reader `HeadHeader&` and references. format_version is not walked:
// the JSON form keeps it in its own metadata key and the YAML form reads it first.
//
// Visitor methods: integer (int64_t or int), real (float), flag (bool), text (std::string), taps,
// rope (a nested map of visit_rope_fields), head_type, names (std::vector<std::string>).
#pragma once
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <tfe/header.h>

namespace tfe {

// The values the format allows an integer field (by its key: "window", "original_max_positions"), as
// validate() checks them. A reader meeting a value its C++ field cannot hold (window = 2^32) states this
// range, not the C++ type's.
struct IntegerRange {
  int64_t lo = 0, hi = 0;
};
IntegerRange header_integer_range(std::string_view key);

template <class R>
concept RopeOf = std::is_same_v<std::remove_const_t<R>, Rope>;
template <class H>
concept HeaderOf = std::is_same_v<std::remove_const_t<H>, HeadHeader>;

template <class V, RopeOf R>
void visit_rope_fields(V& v, R& r) {
  v.real("theta", r.theta);
  v.flag("llama3", r.llama3);
  v.real("factor", r.factor);
  v.real("low_freq_factor", r.low_freq_factor);
  v.real("high_freq_factor", r.high_freq_factor);
  v.integer("original_max_positions", r.original_max_positions);
}

template <class V, HeaderOf H>
void visit_header_fields(V& v, H& h) {
  v.text("name", h.name);
  v.taps("taps", h.taps);
  v.integer("target_hidden", h.target_hidden);
  v.integer("hidden", h.hidden);
  v.integer("heads", h.heads);
  v.integer("kv_heads", h.kv_heads);
  v.integer("head_dim", h.head_dim);
  v.integer("ffn", h.ffn);
  v.integer("vocab", h.vocab);
  v.integer("draft_vocab", h.draft_vocab);
  v.integer("window", h.window);
  v.rope("rope", h.rope);
  v.real("rms_eps", h.rms_eps);
  v.flag("qk_norm", h.qk_norm);
  v.head_type("head_type", h.head_type);
  v.integer("cand_k", h.cand_k);
  v.integer("lowrank", h.lowrank);
  v.names("fp8", h.fp8);
}

}  // namespace tfe
