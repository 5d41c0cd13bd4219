#include "runtime/engine/stop_strings.h"

#include <algorithm>

namespace tandem {

std::string StopStringBuffer::Append(std::string_view delta) {
  if (stopped_) return "";
  withheld_.append(delta);
  // No stop string can start in text already emitted: it would have been withheld.
  size_t first = std::string::npos;
  size_t first_len = 0;
  for (const std::string& stop : stops_) {
    const size_t at = withheld_.find(stop);
    // The earliest match; of two at the same place, the longer (the text it keeps is longer).
    if (at < first || (at == first && at != std::string::npos && stop.size() > first_len)) {
      first = at;
      first_len = stop.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = withheld_.substr(0, include_stop_ ? first + first_len : first);
    withheld_.clear();
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, withheld_.size()); k > keep; --k) {
      if (withheld_.compare(withheld_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = withheld_.substr(0, withheld_.size() - keep);
  withheld_.erase(0, withheld_.size() - keep);
  return out;
}

std::string StopStringBuffer::Flush() {
  if (stopped_) return "";
  std::string out = std::move(withheld_);
  withheld_.clear();
  return out;
}

}  // namespace tandem
