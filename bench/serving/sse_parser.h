#pragma once
// Incremental Server-Sent Events parser (the WHATWG event-stream format): bytes go in as they
// arrive, in pieces of any size; each complete event's data comes out once its blank line arrives.
// Lines end in LF, CRLF or CR (a CR at the end of one piece and an LF at the start of the next
// are one line end). `data:` lines of one event are joined with '\n'; comments, `event:`, `id:`
// and `retry:` lines are accepted and ignored. Events without data are not delivered.
//
// Not thread-safe; one parser per stream. Memory: the current line and event only, never the
// whole stream; a line longer than `max_line_bytes` makes Feed return false (and the parser stays
// failed).

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tandem::bench {

class SseParser {
 public:
  explicit SseParser(size_t max_line_bytes = 1 << 20) : max_line_bytes_(max_line_bytes) {}

  // Calls `on_event(data)` for every event completed by `bytes`; `data` is valid during the call.
  // Returns false once a line exceeds the limit. `on_event` returning false stops parsing of this
  // piece (the rest of `bytes` is dropped), for callers that are done with the stream.
  bool Feed(std::string_view bytes, const std::function<bool(std::string_view data)>& on_event);

  bool failed() const { return failed_; }
  // True when no partial line or undelivered event data is pending.
  bool idle() const { return line_.empty() && !has_data_; }

 private:
  // Returns the callback's verdict (true to continue).
  bool Line(std::string_view line, const std::function<bool(std::string_view)>& on_event);

  size_t max_line_bytes_;
  std::string line_;  // the partial line so far
  std::string data_;  // the current event's data
  bool has_data_ = false;
  bool after_cr_ = false;  // the previous byte ended a line with CR
  bool failed_ = false;
};

}  // namespace tandem::bench
