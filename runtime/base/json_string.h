#pragma once
// A string as a JSON string literal (quotes included): ", \ and control characters escaped
// (\n \r \t \b \f by name, the rest as \u00XX), every other byte as it is (UTF-8 passes
// through). Used by the JSON log lines and the chat template's `tojson`.

#include <string>
#include <string_view>

namespace tandem {

void AppendJsonString(std::string_view s, std::string* out);

}  // namespace tandem
