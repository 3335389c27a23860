// JSON as the safetensors format defines it, read in time linear in the text: one UTF-8 value (an object
// where the caller asks), no byte-order mark, no NUL byte, nothing but whitespace after it, no key twice in
// one object (nlohmann keeps the last silently, where another reader may keep the first), nesting at most
// `max_depth` levels. Refusals name `label`, what is wrong and where.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tfe {

nlohmann::json parse_strict_json(std::string_view text, const std::string& label, int max_depth);

}  // namespace tfe
