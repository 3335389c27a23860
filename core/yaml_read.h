// Strict reading of YAML documents that tfe itself writes (head headers, plans). Every key must be
// known and present, every scalar must parse completely as its type, and every error names the
// document, the path of the field (`buckets[1].nodes[4].args[2].buffer`) and its line.
//
// Hostile input: yaml-cpp bounds the nesting depth while parsing; aliases, however, let a small document
// describe a tree that is exponentially large when walked, so a Context counts the nodes a reader visits
// and stops at a budget far above any real document.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace tfe::yaml {

struct Context {
  std::string doc;                    // "plan YAML", "header YAML": the start of every message
  int64_t budget = int64_t{1} << 22;  // nodes a reader may visit
};

class Map;

// One node of the document and where it is.
struct Field {
  Context* ctx = nullptr;
  YAML::Node node;
  std::string path;

  [[noreturn]] void fail(std::string_view message) const;

  int64_t i64() const;
  int64_t i64(int64_t lo, int64_t hi) const;  // refused outside lo..hi, naming the limits
  // Refused outside lo..hi (what its C++ field holds, up to int64's range), the message naming the format's
  // limits stated_lo..stated_hi, which the document's validation applies to a value that fits.
  int64_t i64(int64_t lo, int64_t hi, int64_t stated_lo, int64_t stated_hi) const;
  int i32(int lo, int hi) const;
  float f32() const;     // finite only: plans and headers never hold NaN or infinities
  bool boolean() const;  // `true` or `false`
  std::string str() const;
  Map map() const;
  std::vector<Field> seq(size_t max_items) const;  // refused beyond max_items, naming the limit
};

// A mapping read key by key. done() refuses keys nobody read; duplicated keys are refused on entry.
class Map {
 public:
  explicit Map(const Field& f);
  bool has(std::string_view key) const;
  Field at(std::string_view key);  // refuses a missing key by name
  void done() const;
  const Field& self() const { return self_; }

 private:
  struct Entry {
    std::string key;
    YAML::Node value;
    bool read = false;
  };
  Field self_;
  std::vector<Entry> entries_;                     // in document order, for messages
  std::unordered_map<std::string, size_t> index_;  // key -> entries_ index, so a map reads in linear time
};

// Parses `text` into the root field of `ctx`'s document; YAML syntax errors become tfe::Error with
// their line.
Field parse(Context& ctx, std::string_view text);

// The shortest decimal form of a float that reads back to the same bits (fmt's `{}`).
std::string float_text(float f);

}  // namespace tfe::yaml
