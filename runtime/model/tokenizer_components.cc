#include "runtime/model/tokenizer_components.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "runtime/model/tokenizer_unicode.h"

namespace tandem::tokenizer_internal {
namespace {

using json = nlohmann::json;

std::string TypeOf(const json& j) {
  if (!j.is_object()) return "<not an object>";
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return "<no type>";
  return it->get<std::string>();
}

// Onig (which `tokenizers` uses) reads \s as Unicode White_Space; PCRE2 with UCP reads it as
// "Z or tab/NL/VT/FF/CR", which misses U+0085. Spell the property out so both agree.
std::string RewriteWhitespaceClasses(const std::string& regex) {
  std::string out;
  out.reserve(regex.size() + 32);
  for (size_t i = 0; i < regex.size(); ++i) {
    if (regex[i] == '\\' && i + 1 < regex.size()) {
      const char c = regex[i + 1];
      if (c == 's') {
        out += "\\p{White_Space}";
      } else if (c == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += regex[i];
        out += c;
      }
      ++i;
      continue;
    }
    out += regex[i];
  }
  return out;
}

}  // namespace

absl::StatusOr<int32_t> TokenIdFromJson(const json& v, std::string_view where) {
  // (get<int32_t> on a float or a wide integer would be undefined or truncate.)
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > kMaxTokenId) ||
      (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId))) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": token id ", v.dump(),
                                                   " is not an integer in [0, ", kMaxTokenId, "]"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// ---------------------------------------------------------------------------------------------
// Pattern

Pattern::~Pattern() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(const std::string& regex) {
  const std::string rewritten = RewriteWhitespaceClasses(regex);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("cannot compile regex '", regex, "' at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
  auto pattern = std::unique_ptr<Pattern>(new Pattern());
  pattern->code_ = code;
  return pattern;
}

std::unique_ptr<Pattern> Pattern::Literal(std::string literal) {
  auto pattern = std::unique_ptr<Pattern>(new Pattern());
  pattern->literal_ = std::move(literal);
  return pattern;
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::FromJson(const json& j, const char* where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    return Literal(j["String"].get<std::string>());
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    auto pattern = Regex(j["Regex"].get<std::string>());
    if (!pattern.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", pattern.status().message()));
    }
    return pattern;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": pattern must be {\"String\": ...} or {\"Regex\": ...}"));
}

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Pattern::FindAll(
    std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  if (code_ == nullptr) {
    if (literal_.empty()) return matches;
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      matches.emplace_back(pos, pos + literal_.size());
      pos += literal_.size();
    }
    return matches;
  }
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  absl::Status status;
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                         PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      // Long runs can outgrow the default 32 KiB JIT stack; retry once with a large one.
      jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = absl::InternalError(
          absl::StrCat("regex match failed: ", reinterpret_cast<const char*>(message)));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0];
    const size_t e = ov[1];
    if (e <= b) {
      if (b >= text.size()) break;
      size_t next = b;
      NextCodePoint(text, next);
      start = next;
      continue;
    }
    matches.emplace_back(b, e);
    start = e;
  }
  pcre2_match_data_free(md);
  if (mctx != nullptr) pcre2_match_context_free(mctx);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  if (!status.ok()) return status;
  return matches;
}

// ---------------------------------------------------------------------------------------------
// Normalizers

namespace {

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalizationForm form) : form_(form) {}
  absl::Status Apply(std::string& text) const override {
    ASSIGN_OR_RETURN(text, Normalize(text, form_));
    return absl::OkStatus();
  }

 private:
  NormalizationForm form_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  absl::Status Apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
};

// Replaces every match of a pattern (shared by the Replace normalizer and decoder).
absl::StatusOr<std::string> ReplaceAll(const Pattern& pattern, const std::string& content,
                                       std::string_view text) {
  ASSIGN_OR_RETURN(auto matches, pattern.FindAll(text));
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(text.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Apply(std::string& text) const override {
    ASSIGN_OR_RETURN(text, ReplaceAll(*pattern_, content_, text));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Apply(std::string& text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextCodePoint(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhitespace(NextCodePoint(text, next))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(std::string& text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Apply(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json& j) {
  const std::string type = TypeOf(j);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfkd);
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>());
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j.at("pattern"), "normalizer Replace"));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern),
                                               j.at("content").get<std::string>());
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(j.value("strip_left", true),
                                             j.value("strip_right", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const json& step : j.at("normalizers")) {
      ASSIGN_OR_RETURN(auto n, MakeNormalizer(step));
      steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported normalizer type '", type, "'"));
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` at the matches of `pattern` as `tokenizers`' NormalizedString::split does
// (empty results are dropped, as PreTokenizedString::split does).
absl::Status SplitPiece(const Piece& piece, const Pattern& pattern, SplitBehavior behavior,
                        bool invert, std::vector<Piece>& out) {
  struct Span {
    size_t begin;
    size_t end;
    bool flag;  // is a match; after `behavior`, "remove"
  };
  const std::string& text = piece.text;
  std::vector<Span> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
  } else {
    ASSIGN_OR_RETURN(auto matches, pattern.FindAll(text));
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      if (prev != b) spans.push_back({prev, b, false});
      spans.push_back({b, e, true});
      prev = e;
    }
    if (prev != text.size()) spans.push_back({prev, text.size(), false});
  }
  if (invert) {
    for (Span& s : spans) s.flag = !s.flag;
  }
  std::vector<Span> splits;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) splits.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      splits = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.flag == previous_match && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.flag && !previous_match && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const Span& s : splits) {
    if (s.flag || s.end <= s.begin) continue;
    out.push_back({text.substr(s.begin, s.end - s.begin), piece.at_origin && s.begin == 0});
  }
  return absl::OkStatus();
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status Apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces)
      RETURN_IF_ERROR(SplitPiece(p, *pattern_, behavior_, invert_, out));
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status Apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> split;
    for (Piece& p : pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (regex_ != nullptr) {
        RETURN_IF_ERROR(SplitPiece(p, *regex_, SplitBehavior::kIsolated, false, split));
      } else if (!p.text.empty()) {
        split.push_back(std::move(p));
      }
    }
    for (Piece& p : split) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) mapped += ByteToUnicode(static_cast<uint8_t>(c));
      p.text = std::move(mapped);
    }
    pieces = std::move(split);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

absl::StatusOr<PrependScheme> ParsePrependScheme(const json& j, const char* where) {
  if (j.contains("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown prepend_scheme '", s, "'"));
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        replacement_pattern_(Pattern::Literal(replacement_)) {}
  absl::Status Apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      std::string replaced;
      for (char c : p.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        replaced.insert(0, replacement_);
      }
      Piece np{std::move(replaced), p.at_origin};
      if (split_) {
        RETURN_IF_ERROR(
            SplitPiece(np, *replacement_pattern_, SplitBehavior::kMergedWithNext, false, out));
      } else if (!np.text.empty()) {
        out.push_back(std::move(np));
      }
    }
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  std::unique_ptr<Pattern> replacement_pattern_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Apply(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& j) {
  const std::string type = TypeOf(j);
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j.at("pattern"), "pre_tokenizer Split"));
    const std::string b = j.at("behavior").get<std::string>();
    SplitBehavior behavior;
    if (b == "Removed") {
      behavior = SplitBehavior::kRemoved;
    } else if (b == "Isolated") {
      behavior = SplitBehavior::kIsolated;
    } else if (b == "MergedWithPrevious") {
      behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      behavior = SplitBehavior::kContiguous;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("pre_tokenizer Split: unknown behavior '", b, "'"));
    }
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior,
                                               j.value("invert", false));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Pattern> regex;
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(regex, Pattern::Regex(kGpt2Regex));
    }
    return std::make_unique<ByteLevelPreTokenizer>(j.value("add_prefix_space", true),
                                                   std::move(regex));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(j, "pre_tokenizer Metaspace"));
    return std::make_unique<MetaspacePreTokenizer>(j.value("replacement", std::string("\u2581")),
                                                   scheme, j.value("split", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const json& step : j.at("pretokenizers")) {
      ASSIGN_OR_RETURN(auto p, MakePreTokenizer(step));
      steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported pre_tokenizer type '", type, "'"));
}

// ---------------------------------------------------------------------------------------------
// Decoders

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void Apply(std::vector<std::string>& tokens) const override { Decode(tokens, /*raw=*/false); }
  void ApplyRaw(std::vector<std::string>& tokens) const override { Decode(tokens, /*raw=*/true); }

 private:
  static void Decode(std::vector<std::string>& tokens, bool raw) {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all_mapped = true;
      size_t pos = 0;
      while (pos < t.size()) {
        const std::optional<uint8_t> b = UnicodeToByte(NextCodePoint(t, pos));
        if (!b.has_value()) {
          all_mapped = false;
          break;
        }
        mapped.push_back(static_cast<char>(*b));
      }
      bytes += all_mapped ? mapped : t;
    }
    tokens.assign(1, raw ? bytes : Utf8Lossy(bytes));
  }
};

class ByteFallbackDecoder : public Decoder {
 public:
  void Apply(std::vector<std::string>& tokens) const override { Decode(tokens, /*raw=*/false); }
  void ApplyRaw(std::vector<std::string>& tokens) const override { Decode(tokens, /*raw=*/true); }

 private:
  static void Decode(std::vector<std::string>& tokens, bool raw) {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (raw || IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        byte = HexByte(t[3], t[4]);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int HexByte(char hi, char lo) {
    const int h = HexDigit(hi);
    const int l = HexDigit(lo);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void Apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      // Tokens are valid UTF-8, so the only failure is an internal regex error; keep the token.
      auto replaced = ReplaceAll(*pattern_, content_, t);
      if (replaced.ok()) t = *std::move(replaced);
    }
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void Apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> offsets;  // byte offset of each code point, plus the end
      std::vector<char32_t> chars;
      size_t pos = 0;
      while (pos < t.size()) {
        offsets.push_back(pos);
        chars.push_back(NextCodePoint(t, pos));
      }
      offsets.push_back(t.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (chars[i] != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      t = t.substr(offsets[start_cut], offsets[stop_cut] - offsets[start_cut]);
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void Apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (!replacement_.empty() && t.compare(pos, replacement_.size(), replacement_) == 0) {
          out += ' ';
          pos += replacement_.size();
        } else {
          out += t[pos++];
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void Apply(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->Apply(tokens);
  }
  void ApplyRaw(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->ApplyRaw(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

absl::StatusOr<char32_t> SingleChar(const std::string& s, const char* where) {
  size_t pos = 0;
  if (s.empty() || !IsValidUtf8(s)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected one character"));
  }
  const char32_t c = NextCodePoint(s, pos);
  if (pos != s.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected one character"));
  }
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const json& j) {
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j.at("pattern"), "decoder Replace"));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), j.at("content").get<std::string>());
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(char32_t content,
                     SingleChar(j.at("content").get<std::string>(), "decoder Strip content"));
    return std::make_unique<StripDecoder>(content, j.value("start", size_t{0}),
                                          j.value("stop", size_t{0}));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(j, "decoder Metaspace"));
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", std::string("\u2581")),
                                              scheme != PrependScheme::kNever);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const json& step : j.at("decoders")) {
      ASSIGN_OR_RETURN(auto d, MakeDecoder(step));
      steps.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported decoder type '", type, "'"));
}

// ---------------------------------------------------------------------------------------------
// BPE model

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& j) {
  const std::string type = j.contains("type") ? TypeOf(j) : "BPE";
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat("unsupported model type '", type, "'"));
  }
  if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() != 0.0) {
    return absl::UnimplementedError("model BPE: dropout is not supported (non-deterministic)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j[key].is_null() && !j[key].get<std::string>().empty()) {
      return absl::UnimplementedError(absl::StrCat("model BPE: ", key, " is not supported"));
    }
  }
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  const json& vocab = j.at("vocab");
  if (!vocab.is_object()) return absl::InvalidArgumentError("model BPE: vocab must be an object");
  model->vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    ASSIGN_OR_RETURN(model->vocab_[it.key()], TokenIdFromJson(it.value(), "model BPE: vocab"));
  }
  const json& merges = j.at("merges");
  if (!merges.is_array()) return absl::InvalidArgumentError("model BPE: merges must be an array");
  model->merges_.reserve(merges.size());
  uint32_t rank = 0;
  for (const json& m : merges) {
    std::string a;
    std::string b;
    if (m.is_string()) {
      std::vector<std::string> parts = absl::StrSplit(m.get<std::string>(), ' ');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("model BPE: merge ", rank, " '",
                                                       m.get<std::string>(),
                                                       "' is not two space-separated tokens"));
      }
      a = std::move(parts[0]);
      b = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("model BPE: merge ", rank, " is malformed"));
    }
    auto ia = model->vocab_.find(a);
    auto ib = model->vocab_.find(b);
    auto inew = model->vocab_.find(a + b);
    if (ia == model->vocab_.end() || ib == model->vocab_.end() || inew == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: merge ", rank, " '", a, " ", b, "' uses a token not in vocab"));
    }
    model->merges_[PairKey(ia->second, ib->second)] = MergeTarget{rank, inew->second};
    ++rank;
  }
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    const std::string unk = j["unk_token"].get<std::string>();
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: unk_token '", unk, "' is not in vocab"));
    }
    model->unk_id_ = it->second;
  }
  model->fuse_unk_ = j.value("fuse_unk", false);
  model->byte_fallback_ = j.value("byte_fallback", false);
  model->ignore_merges_ = j.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    auto it = model->vocab_.find(absl::StrFormat("<0x%02X>", b));
    model->byte_ids_[b] = it == model->vocab_.end() ? -1 : it->second;
  }
  return model;
}

const BpeModel::MergeTarget* BpeModel::FindMerge(int32_t a, int32_t b) const {
  auto it = merges_.find(PairKey(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(absl::string_view(word.data(), word.size()));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols, as `tokenizers`' BPE::merge_word (including its unk/byte-fallback order).
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  std::optional<int32_t> pending_unk;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    NextCodePoint(word, pos);
    const std::string_view ch = word.substr(begin, pos - begin);
    auto it = vocab_.find(absl::string_view(ch.data(), ch.size()));
    if (it != vocab_.end()) {
      if (pending_unk.has_value()) {
        ids.push_back(*pending_unk);
        pending_unk.reset();
      }
      ids.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (pending_unk.has_value() && !fuse_unk_) ids.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk.has_value()) ids.push_back(*pending_unk);

  // Merge by rank (ties: leftmost), as `tokenizers`' Word::merge_all.
  const int n = static_cast<int>(ids.size());
  if (n > 1) {
    std::vector<int> prev(n);
    std::vector<int> next(n);
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Entry {
      uint32_t rank;
      int pos;
      int32_t new_id;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
    for (int i = 0; i + 1 < n; ++i) {
      if (const MergeTarget* m = FindMerge(ids[i], ids[i + 1])) queue.push({m->rank, i, m->new_id});
    }
    while (!queue.empty()) {
      const Entry top = queue.top();
      queue.pop();
      if (!alive[top.pos] || next[top.pos] == -1) continue;
      const int right = next[top.pos];
      const MergeTarget* current = FindMerge(ids[top.pos], ids[right]);
      if (current == nullptr || current->new_id != top.new_id) continue;
      ids[top.pos] = top.new_id;
      alive[right] = false;
      next[top.pos] = next[right];
      if (next[right] != -1) prev[next[right]] = top.pos;
      if (prev[top.pos] >= 0) {
        const int p = prev[top.pos];
        if (const MergeTarget* m = FindMerge(ids[p], ids[top.pos])) {
          queue.push({m->rank, p, m->new_id});
        }
      }
      if (next[top.pos] != -1) {
        if (const MergeTarget* m = FindMerge(ids[top.pos], ids[next[top.pos]])) {
          queue.push({m->rank, top.pos, m->new_id});
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      if (alive[i]) out.push_back(ids[i]);
    }
    return;
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace tandem::tokenizer_internal
