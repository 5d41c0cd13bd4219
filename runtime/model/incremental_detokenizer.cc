// vLLM-style incremental detokenization (see tokenizer.h): the text of ids_[prefix_offset_,
// read_offset_) was already emitted; decoding ids_[prefix_offset_, end) and dropping that prefix
// yields the new text, withheld while it ends in an incomplete character (U+FFFD).
#include <span>

#include "runtime/model/tokenizer.h"
#include "runtime/model/tokenizer_unicode.h"

namespace tandem {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::Push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tokenizer_.Decode(all.subspan(prefix_offset_), skip_special_);
  const std::string_view fffd = tokenizer_internal::kReplacementChar;
  const bool incomplete = new_text.size() >= fffd.size() &&
                          new_text.compare(new_text.size() - fffd.size(), fffd.size(), fffd) == 0;
  if (new_text.size() > prefix_text.size() && !incomplete) {
    std::string delta = new_text.substr(prefix_text.size());
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    return delta;
  }
  return "";
}

std::string IncrementalDetokenizer::Flush() {
  if (read_offset_ >= ids_.size()) return "";
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tokenizer_.Decode(all.subspan(prefix_offset_), skip_special_);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (new_text.size() <= prefix_text.size()) return "";
  return new_text.substr(prefix_text.size());
}

}  // namespace tandem
