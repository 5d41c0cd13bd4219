// The tool-call output parsers (runtime/router/tool_calls.h) over model output text fed in
// pieces, as the router streams it.
//
// Input: one byte choosing the parser (low 2 bits: hermes, llama3_json, required, named; bit 2:
// parallel_tool_calls false), one byte per cut (a piece length, 0 ends the cuts), then the text.
// Offered functions: get_weather and noop.
// Properties: no crash; the pieces give exactly what the whole text gives (streaming changes
// nothing); every call names an offered function, has a fresh id, and (but for the named kind,
// whose arguments are the raw text) JSON-object arguments; without parallel calls at most one;
// when no call came out of an auto parser the content is the text, byte for byte.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_support.h"
#include "nlohmann/json.hpp"
#include "runtime/router/tool_calls.h"

namespace {

using tandem::router::ToolCall;
using tandem::router::ToolChoice;

struct Result {
  std::string content;
  std::vector<ToolCall> calls;
};

Result Run(const tandem::router::ToolRequest& request, const std::string& parser,
           const std::string& text, const std::vector<size_t>& pieces) {
  auto p = tandem::router::CreateToolCallParser(request, parser);
  FUZZ_CHECK(p.ok());
  Result r;
  auto take = [&](tandem::router::ToolParseOutput out) {
    r.content += out.content;
    tandem::router::AppendToolCallDeltas(out.calls, &r.calls);
  };
  size_t at = 0;
  for (size_t n : pieces) {
    const size_t len = std::min(n, text.size() - at);
    take((*p)->Feed(absl::string_view(text).substr(at, len)));
    at += len;
  }
  take((*p)->Feed(absl::string_view(text).substr(at)));
  take((*p)->Finish());
  FUZZ_CHECK((*p)->calls() == static_cast<int>(r.calls.size()));
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  tandem::router::ToolRequest request;
  request.functions = {{"get_weather"}, {"noop"}};
  const int kind = data[0] & 3;
  request.choice = kind == 2   ? ToolChoice::kRequired
                   : kind == 3 ? ToolChoice::kFunction
                               : ToolChoice::kAuto;
  request.function = "get_weather";
  request.parallel = (data[0] & 4) == 0;
  const std::string parser = kind == 0 ? "hermes" : kind == 1 ? "llama3_json" : "";
  size_t i = 1;
  std::vector<size_t> pieces;
  while (i < size && data[i] != 0 && pieces.size() < 64) pieces.push_back(data[i++]);
  if (i < size) ++i;
  const std::string text(reinterpret_cast<const char*>(data + i), size - i);

  const Result whole = Run(request, parser, text, {});
  const Result split = Run(request, parser, text, pieces);
  FUZZ_CHECK(split.content == whole.content);
  FUZZ_CHECK(split.calls.size() == whole.calls.size());
  std::set<std::string> ids;
  for (size_t k = 0; k < whole.calls.size(); ++k) {
    const ToolCall& c = whole.calls[k];
    FUZZ_CHECK(c.name == split.calls[k].name && c.arguments == split.calls[k].arguments);
    FUZZ_CHECK(c.name == "get_weather" || c.name == "noop");
    FUZZ_CHECK(c.id.size() == 29 && ids.insert(c.id).second);
    if (request.choice != ToolChoice::kFunction) {
      const nlohmann::json args = nlohmann::json::parse(c.arguments, nullptr, false);
      FUZZ_CHECK(!args.is_discarded() && args.is_object());
    }
  }
  if (request.choice == ToolChoice::kFunction) FUZZ_CHECK(whole.calls.size() == 1);
  if (!request.parallel && request.choice != ToolChoice::kRequired) {
    FUZZ_CHECK(whole.calls.size() <= 1);
  }
  if (request.choice == ToolChoice::kAuto && whole.calls.empty()) {
    FUZZ_CHECK(whole.content == text);
  }
  return 0;
}
