#include "head/strict_json.h"

#include <cstring>
#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace tfe {

namespace {

using json = nlohmann::json;

// A SAX pass that builds nothing: it checks nesting and duplicate keys with one hash set per open object.
// (nlohmann's callback parser rescans the parent object at every nested object's end, which is quadratic
// in a header of many small objects.)
class Checker final : public nlohmann::json_sax<json> {
 public:
  Checker(const std::string& label, int max_depth) : label_(label), max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open(true);
    return true;
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second) fail("{} has key `{}` twice in one object", label_, k);
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    objects_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    open(false);
    return true;
  }
  bool end_array() override {
    objects_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    fail("{} is not valid JSON at byte {}: {}", label_, position, e.what());
  }

 private:
  void open(bool object) {
    if (static_cast<int>(objects_.size()) >= max_depth_) fail("{} nests deeper than {} levels", label_, max_depth_);
    objects_.push_back(object);
    if (object) keys_.emplace_back();
  }

  const std::string& label_;
  int max_depth_;
  std::vector<bool> objects_;
  std::vector<std::unordered_set<std::string>> keys_;
};

}  // namespace

json parse_strict_json(std::string_view text, const std::string& label, int max_depth) {
  if (text.size() >= 3 && std::memcmp(text.data(), "\xEF\xBB\xBF", 3) == 0)
    fail("{} starts with a byte-order mark, which the safetensors format does not allow", label);
  if (const void* nul = std::memchr(text.data(), '\0', text.size()))
    fail("{} holds a NUL byte at byte {}; only trailing spaces may pad it", label,
         static_cast<const char*>(nul) - text.data());
  Checker checker(label, max_depth);
  // strict: nothing but whitespace may follow the value.
  json::sax_parse(text, &checker, json::input_format_t::json, /*strict=*/true);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", label, e.what());
  }
}

}  // namespace tfe
