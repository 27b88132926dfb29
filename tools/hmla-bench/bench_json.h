// hmla-bench: the JSON type of the result files. ordered_json keeps the keys in the order they are
// set, which is the order the result files have always had (readers and diffs of old and new files
// rely on it); plain nlohmann::json sorts them.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hmla_bench {

using Json = nlohmann::ordered_json;

// `v`, or null where `present` is false (a ratio without an anchor, a fraction without ceilings).
inline Json number_or_null(bool present, double v) { return present ? Json(v) : Json(nullptr); }

// Pretty-printed with two-space indents and a final newline. NaN and inf become null (JSON has
// neither); bytes that are not UTF-8 (a device name, a path) become U+FFFD instead of throwing.
inline std::string dump_json(const Json& doc) {
  return doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace hmla_bench
