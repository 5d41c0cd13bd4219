#pragma once
// Stop-string matching on streamed text (OpenAI semantics): text is released as soon as it can no
// longer be the start of a stop string; when a stop string appears, the text before it is
// released (with the stop string itself when `include_stop`, vLLM's include_stop_str_in_output),
// and everything after it is dropped.
//
// Not thread-safe; one per request. No failure modes.

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class StopStringBuffer {
 public:
  explicit StopStringBuffer(std::vector<std::string> stops, bool include_stop = false)
      : stops_(std::move(stops)), include_stop_(include_stop) {}

  // Appends `delta`; returns the text that is now safe to emit. After a match stopped() is true
  // and further calls return "".
  std::string Append(std::string_view delta);
  // End of stream: returns the withheld text ("" after a match).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string withheld_;
  bool stopped_ = false;
};

}  // namespace tandem
