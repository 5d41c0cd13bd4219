#include "bench/serving/sse_parser.h"

namespace tandem::bench {

bool SseParser::Feed(std::string_view bytes,
                     const std::function<bool(std::string_view data)>& on_event) {
  if (failed_) return false;
  size_t i = 0;
  if (after_cr_ && !bytes.empty()) {
    after_cr_ = false;
    if (bytes[0] == '\n') i = 1;
  }
  while (i < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) {
      if (line_.size() + (bytes.size() - i) > max_line_bytes_) {
        failed_ = true;
        return false;
      }
      line_.append(bytes.substr(i));
      return true;
    }
    bool go_on;
    if (line_.empty()) {
      go_on = Line(bytes.substr(i, end - i), on_event);
    } else {
      if (line_.size() + (end - i) > max_line_bytes_) {
        failed_ = true;
        return false;
      }
      line_.append(bytes.substr(i, end - i));
      std::string line;
      line.swap(line_);
      go_on = Line(line, on_event);
    }
    i = end + 1;
    if (bytes[end] == '\r') {
      if (i < bytes.size()) {
        if (bytes[i] == '\n') ++i;
      } else {
        after_cr_ = true;
      }
    }
    if (!go_on) return true;
  }
  return true;
}

bool SseParser::Line(std::string_view line, const std::function<bool(std::string_view)>& on_event) {
  if (line.empty()) {
    if (!has_data_) return true;
    has_data_ = false;
    const bool go_on = on_event(data_);
    data_.clear();
    return go_on;
  }
  if (line[0] == ':') return true;  // comment
  std::string_view field = line;
  std::string_view value;
  if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  return true;
}

}  // namespace tandem::bench
