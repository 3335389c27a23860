// The head header as JSON text inside a safetensors __metadata__ map (string -> string).
// The format version is its own metadata key, read before the header, so that a reader meeting a newer
// layout says "version" rather than "unknown field".
#include <cfloat>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/numeric.h"
#include "head/strict_json.h"
#include <tfe/head_file.h>
#include "head/header_fields.h"

namespace tfe {

using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kFinalLayer = "final";

// A value for a message: scalars as written, containers by type (their text may be huge or deep).
std::string describe(const json& v) { return v.is_structured() ? std::string(v.type_name()) : v.dump(); }

// The shortest decimal that reads back as the same float: 1e-06 rather than 9.999999974752427e-07.
// JSON has no inf or NaN (nlohmann would write null), so they are refused here rather than written.
double readable(std::string_view field, float f) {
  if (!std::isfinite(f)) fail("head header: field `{}` = {} cannot be stored (not finite)", field, f);
  return std::stod(fmt::format("{}", f));
}

// Writes the fields (head/header_fields.h) into a JSON object, floats in their shortest form.
struct JsonWriter {
  ordered_json& j;
  std::string where;  // "" or "rope", for messages

  std::string path(const char* key) const { return where.empty() ? key : where + "." + key; }
  void integer(const char* key, int64_t v) { j[key] = v; }
  void real(const char* key, float v) { j[key] = readable(path(key), v); }
  void flag(const char* key, bool v) { j[key] = v; }
  void text(const char* key, const std::string& v) { j[key] = v; }
  void names(const char* key, const std::vector<std::string>& v) { j[key] = v; }
  void head_type(const char* key, HeadType t) { j[key] = head_type_name(t); }
  void rope(const char* key, const Rope& r) {
    ordered_json sub;
    JsonWriter w{sub, key};
    visit_rope_fields(w, r);
    j[key] = std::move(sub);
  }
  void taps(const char* key, const std::vector<Tap>& taps) {
    ordered_json out = ordered_json::array();
    for (const auto& t : taps) {
      ordered_json tap;
      if (t.layer == -1) {
        tap["layer"] = kFinalLayer;
      } else {
        tap["layer"] = t.layer;
      }
      tap["norm"] = t.norm;
      out.push_back(std::move(tap));
    }
    j[key] = std::move(out);
  }
};

ordered_json header_to_json(const HeadHeader& h) {
  ordered_json j;
  JsonWriter w{j, ""};
  visit_header_fields(w, h);
  return j;
}

// Reads the fields of one JSON object by name. Every field must be present with its type; fields the
// reader did not ask for are refused in finish(), so that a typo is never silently ignored.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  const json& at(const std::string& key) {
    auto it = obj_.find(key);
    if (it == obj_.end()) fail("head header: field `{}` missing", path(key));
    read_.insert(key);
    return *it;
  }

  // Refused outside lo..hi, the range of its C++ field, with the format's range for the key in the message.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    const IntegerRange format = header_integer_range(key);
    return integer_value(at(key), path(key), lo, hi, format.lo, format.hi);
  }

  float number(const std::string& key) {
    const json& v = at(key);
    if (!v.is_number()) fail("head header: field `{}` must be a number (got {})", path(key), v.type_name());
    const double d = v.get<double>();
    const std::optional<float> f = float32_of(d);
    if (!f) fail("head header: field `{}` = {} does not fit a 32-bit float ({})", path(key), d, kFloat32Range);
    return *f;
  }

  bool boolean(const std::string& key) {
    const json& v = at(key);
    if (!v.is_boolean()) fail("head header: field `{}` must be a boolean (got {})", path(key), v.type_name());
    return v.get<bool>();
  }

  std::string string(const std::string& key) {
    const json& v = at(key);
    if (!v.is_string()) fail("head header: field `{}` must be a string (got {})", path(key), v.type_name());
    return v.get<std::string>();
  }

  const json& array(const std::string& key) {
    const json& v = at(key);
    if (!v.is_array()) fail("head header: field `{}` must be an array (got {})", path(key), v.type_name());
    return v;
  }

  const json& object(const std::string& key) {
    const json& v = at(key);
    if (!v.is_object()) fail("head header: field `{}` must be an object (got {})", path(key), v.type_name());
    return v;
  }

  void finish() const {
    for (const auto& [key, value] : obj_.items())
      if (!read_.contains(key)) fail("head header: unknown field `{}`", path(key));
  }

  std::string path(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }

  // Refused outside lo..hi, the message stating stated_lo..stated_hi.
  static int64_t integer_value(const json& v, const std::string& name, int64_t lo, int64_t hi, int64_t stated_lo,
                               int64_t stated_hi) {
    if (!v.is_number_integer()) fail("head header: field `{}` must be an integer (got {})", name, describe(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      fail("head header: field `{}` = {} is outside {}..{}", name, v.get<uint64_t>(), stated_lo, stated_hi);
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail("head header: field `{}` = {} is outside {}..{}", name, x, stated_lo, stated_hi);
    return x;
  }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> read_;
};

// Integers are read within the range of their C++ field only, a value past it refused with the format's
// range (header_integer_range); validate() then applies the format's limits to what fits.
constexpr int64_t kIntMin = std::numeric_limits<int>::min();
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Reads the fields (head/header_fields.h) from a JSON object through a FieldReader.
struct JsonReader {
  FieldReader& f;

  void integer(const char* key, int64_t& out) { out = f.integer(key, kInt64Min, kInt64Max); }
  void integer(const char* key, int& out) { out = static_cast<int>(f.integer(key, kIntMin, kIntMax)); }
  void real(const char* key, float& out) { out = f.number(key); }
  void flag(const char* key, bool& out) { out = f.boolean(key); }
  void text(const char* key, std::string& out) { out = f.string(key); }
  void rope(const char* key, Rope& r) {
    FieldReader sub(f.object(key), f.path(key));
    JsonReader read{sub};
    visit_rope_fields(read, r);
    sub.finish();
  }
  void head_type(const char* key, HeadType& out) {
    const std::string type = f.string(key);
    if (type == head_type_name(HeadType::dense)) {
      out = HeadType::dense;
    } else if (type == head_type_name(HeadType::two_stage)) {
      out = HeadType::two_stage;
    } else {
      fail("head header: field `{}` = \"{}\" must be \"dense\" or \"two_stage\"", f.path(key), type);
    }
  }
  void names(const char* key, std::vector<std::string>& out) {
    const json& a = f.array(key);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string())
        fail("head header: field `{}[{}]` must be a string naming a linear (got {})", f.path(key), i, describe(a[i]));
      out.push_back(a[i].get<std::string>());
    }
  }
  void taps(const char* key, std::vector<Tap>& out) {
    const json& taps = f.array(key);
    for (size_t i = 0; i < taps.size(); ++i) {
      const std::string where = fmt::format("{}[{}]", f.path(key), i);
      if (!taps[i].is_object()) fail("head header: field `{}` must be an object (got {})", where, taps[i].type_name());
      FieldReader t(taps[i], where);
      Tap tap;
      const json& layer = t.at("layer");
      if (layer.is_string()) {
        if (layer.get<std::string>() != kFinalLayer)
          fail("head header: field `{}.layer` = {} must be an integer >= 0 or \"final\"", where, describe(layer));
        tap.layer = -1;
      } else {
        // -1 is how a Tap says `final`; the file spells it out, so a negative number is never a tap.
        tap.layer = static_cast<int>(FieldReader::integer_value(layer, where + ".layer", 0, kIntMax, 0, kIntMax));
      }
      tap.norm = t.boolean("norm");
      t.finish();
      out.push_back(tap);
    }
  }
};

HeadHeader header_from_json(const json& j, int format_version) {
  if (!j.is_object()) fail("head header: `tfe.header` must be a JSON object (got {})", j.type_name());
  FieldReader f(j, "");
  HeadHeader h;
  h.format_version = format_version;
  JsonReader read{f};
  visit_header_fields(read, h);
  f.finish();
  return h;
}

const std::string& metadata_value(const std::map<std::string, std::string>& md, const std::string& key) {
  auto it = md.find(key);
  if (it == md.end()) fail("head metadata: key `{}` missing (not a .tfe head file?)", key);
  return it->second;
}

}  // namespace

std::map<std::string, std::string> header_to_metadata(const HeadHeader& h) {
  return {{"tfe.format_version", std::to_string(h.format_version)}, {"tfe.header", header_to_json(h).dump()}};
}

HeadHeader header_from_metadata(const std::map<std::string, std::string>& md) {
  const std::string& version_text = metadata_value(md, "tfe.format_version");
  int version = 0;
  const char* end = version_text.data() + version_text.size();
  auto [ptr, ec] = std::from_chars(version_text.data(), end, version);
  if (ec != std::errc() || ptr != end || version_text.empty())
    fail("head metadata: `tfe.format_version` = \"{}\" is not an integer", version_text);
  if (version != kHeadFormatVersion)
    fail("head metadata: `tfe.format_version` = {} is not supported (this build reads {})", version,
         kHeadFormatVersion);
  // The header nests three levels (taps[i].layer); deeper text is refused before it is built.
  static constexpr int kMaxDepth = 8;
  const json j = parse_strict_json(metadata_value(md, "tfe.header"), "head metadata: `tfe.header`", kMaxDepth);
  HeadHeader h = header_from_json(j, version);
  validate(h);
  return h;
}

}  // namespace tfe
