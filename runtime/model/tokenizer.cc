// Hugging Face `tokenizer.json` loading and the encode/decode pipeline (see tokenizer.h).
// The stages themselves live in tokenizer_components.{h,cc}.
#include "runtime/model/tokenizer.h"

#include <cctype>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/model/tokenizer_components.h"
#include "runtime/model/tokenizer_unicode.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using tokenizer_internal::BpeModel;
using tokenizer_internal::Decoder;
using tokenizer_internal::Normalizer;
using tokenizer_internal::Piece;
using tokenizer_internal::PreTokenizer;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Leftmost-longest matcher over a set of added tokens (a byte trie), with `tokenizers`'
// lstrip / rstrip / single_word adjustments (AddedVocabulary::find_matches).
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    if (token->content.empty()) return;
    int node = 0;
    for (char c : token->content) {
      auto& children = nodes_[node].children;
      auto it = children.find(static_cast<uint8_t>(c));
      if (it == children.end()) {
        const int child = static_cast<int>(nodes_.size());
        children.emplace(static_cast<uint8_t>(c), child);
        nodes_.emplace_back();
        node = child;
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = token;
  }
  bool empty() const { return nodes_.size() == 1; }

  // A segment of text: either a matched token (token != nullptr) or plain text [begin, end).
  struct Segment {
    const AddedToken* token;
    size_t begin;
    size_t end;
  };
  std::vector<Segment> Split(std::string_view text) const {
    std::vector<Segment> out;
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      const AddedToken* best = nullptr;
      size_t best_len = 0;
      int node = 0;
      for (size_t i = pos; i < text.size(); ++i) {
        const auto& children = nodes_[node].children;
        auto it = children.find(static_cast<uint8_t>(text[i]));
        if (it == children.end()) break;
        node = it->second;
        if (nodes_[node].token != nullptr) {
          best = nodes_[node].token;
          best_len = i + 1 - pos;
        }
      }
      if (best == nullptr) {
        ++pos;
        continue;
      }
      size_t start = pos;
      size_t stop = pos + best_len;
      pos = stop;
      if (start < start_offset) continue;  // swallowed by a previous rstrip
      if (best->single_word) {
        const bool start_space = start == 0 || !EndsWithWordChar(text.substr(0, start));
        const bool stop_space = stop == text.size() || !StartsWithWordChar(text.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (best->lstrip) {
        size_t s = start;
        while (s > start_offset) {
          size_t b = s - 1;
          while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
          size_t p = b;
          if (!tokenizer_internal::IsWhitespace(tokenizer_internal::NextCodePoint(text, p))) break;
          s = b;
        }
        start = s;
      }
      if (best->rstrip) {
        while (stop < text.size()) {
          size_t p = stop;
          if (!tokenizer_internal::IsWhitespace(tokenizer_internal::NextCodePoint(text, p))) break;
          stop = p;
        }
        pos = stop;
      }
      if (start_offset < start) out.push_back({nullptr, start_offset, start});
      out.push_back({best, start, stop});
      start_offset = stop;
    }
    if (start_offset < text.size()) out.push_back({nullptr, start_offset, text.size()});
    return out;
  }

 private:
  // `tokenizers` treats alphanumerics and '_' as word characters (its `is_word_char`).
  static bool IsWordChar(char32_t c) { return c == '_' || tokenizer_internal::IsAlphanumeric(c); }
  static bool EndsWithWordChar(std::string_view s) {
    if (s.empty()) return false;
    size_t b = s.size() - 1;
    while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
    return IsWordChar(tokenizer_internal::NextCodePoint(s, b));
  }
  static bool StartsWithWordChar(std::string_view s) {
    if (s.empty()) return false;
    size_t p = 0;
    return IsWordChar(tokenizer_internal::NextCodePoint(s, p));
  }

  struct Node {
    absl::flat_hash_map<uint8_t, int> children;
    const AddedToken* token = nullptr;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

// TemplateProcessing's "single" template: ids before and after the sequence.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

absl::Status ParsePostProcessor(const json& j, PostProcessor& pp) {
  const std::string type = j.value("type", std::string("<no type>"));
  if (type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (type == "Sequence") {
    for (const json& step : j.at("processors")) RETURN_IF_ERROR(ParsePostProcessor(step, pp));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(absl::StrCat("unsupported post_processor type '", type, "'"));
  }
  const json& specials = j.at("special_tokens");
  bool seen_sequence = false;
  for (const json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].at("id").get<std::string>() != "A") {
        return absl::InvalidArgumentError("post_processor TemplateProcessing: single uses B");
      }
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "post_processor TemplateProcessing: special token '", name, "' is not defined"));
      }
      auto& dst = seen_sequence ? pp.suffix : pp.prefix;
      for (const json& id : specials[name].at("ids")) {
        ASSIGN_OR_RETURN(const int32_t token, tokenizer_internal::TokenIdFromJson(
                                                  id, "post_processor TemplateProcessing"));
        dst.push_back(token);
      }
    } else {
      return absl::InvalidArgumentError("post_processor TemplateProcessing: bad template item");
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> TokenString(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

class HfTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Build(const json& j) {
    auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());
    for (const char* key : {"truncation", "padding"}) {
      if (j.contains(key) && !j[key].is_null()) {
        return absl::UnimplementedError(absl::StrCat("'", key, "' is not supported"));
      }
    }
    if (!j.contains("model")) return absl::InvalidArgumentError("missing 'model'");
    ASSIGN_OR_RETURN(t->model_, BpeModel::FromJson(j["model"]));
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      ASSIGN_OR_RETURN(t->normalizer_, tokenizer_internal::MakeNormalizer(j["normalizer"]));
    }
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      ASSIGN_OR_RETURN(t->pre_tokenizer_, tokenizer_internal::MakePreTokenizer(j["pre_tokenizer"]));
    }
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      ASSIGN_OR_RETURN(t->decoder_, tokenizer_internal::MakeDecoder(j["decoder"]));
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      RETURN_IF_ERROR(ParsePostProcessor(j["post_processor"], t->post_));
    }
    int32_t max_id = -1;
    for (const auto& [token, id] : t->model_->vocab()) max_id = std::max(max_id, id);
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken tok;
        ASSIGN_OR_RETURN(tok.id, tokenizer_internal::TokenIdFromJson(a.at("id"), "added_tokens"));
        tok.content = a.at("content").get<std::string>();
        tok.special = a.value("special", false);
        tok.lstrip = a.value("lstrip", false);
        tok.rstrip = a.value("rstrip", false);
        tok.single_word = a.value("single_word", false);
        tok.normalized = a.value("normalized", !tok.special);
        if (tok.id < 0) return absl::InvalidArgumentError("added token with a negative id");
        max_id = std::max(max_id, tok.id);
        t->added_.push_back(std::move(tok));
      }
    }
    t->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [token, id] : t->model_->vocab()) {
      if (id < 0) return absl::InvalidArgumentError("vocab entry with a negative id");
      t->id_to_token_[id] = token;
    }
    t->special_.assign(t->id_to_token_.size(), false);
    for (const AddedToken& tok : t->added_) {
      t->id_to_token_[tok.id] = tok.content;
      t->special_[tok.id] = tok.special;
      t->added_by_content_[tok.content] = tok.id;
      (tok.normalized && t->normalizer_ != nullptr ? t->normalized_matcher_ : t->raw_matcher_)
          .Add(&tok);
    }
    for (const std::vector<int32_t>* ids : {&t->post_.prefix, &t->post_.suffix}) {
      for (int32_t id : *ids) {
        if (static_cast<size_t>(id) >= t->id_to_token_.size()) {
          return absl::InvalidArgumentError(absl::StrCat("post_processor: token id ", id,
                                                         " is outside the vocabulary (",
                                                         t->id_to_token_.size(), " ids)"));
        }
      }
    }
    // Without tokenizer_config.json, the BOS is what the post-processor prepends.
    if (!t->post_.prefix.empty())
      t->SetSpecialTokens(t->IdToToken(t->post_.prefix[0]), std::nullopt);
    // TokenBytes' anchor: the first ordinary token that is a single ASCII letter when decoded
    // alone (any non-special one otherwise).
    for (size_t id = 0; id < t->id_to_token_.size() && t->anchor_ < 0; ++id) {
      if (t->special_[id] || t->id_to_token_[id].empty()) continue;
      const int32_t one[] = {static_cast<int32_t>(id)};
      const std::string text = t->Decode(one, true);
      if (text.size() == 1 && std::isalpha(static_cast<unsigned char>(text[0]))) {
        t->anchor_ = static_cast<int32_t>(id);
      }
    }
    for (size_t id = 0; id < t->id_to_token_.size() && t->anchor_ < 0; ++id) {
      if (!t->special_[id] && !t->id_to_token_[id].empty()) t->anchor_ = static_cast<int32_t>(id);
    }
    return t;
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids = post_.prefix;
    std::string repaired;
    if (!tokenizer_internal::IsValidUtf8(text)) {
      repaired = tokenizer_internal::Utf8Lossy(text);
      text = repaired;
    }
    for (const auto& seg : raw_matcher_.Split(text)) {
      if (seg.token != nullptr) {
        ids.push_back(seg.token->id);
        continue;
      }
      std::string section(text.substr(seg.begin, seg.end - seg.begin));
      const bool at_origin = seg.begin == 0;
      if (normalizer_ != nullptr && !normalizer_->Apply(section).ok()) {
        // ICU only fails on allocation; encode the text unnormalized rather than drop it.
        section.assign(text.substr(seg.begin, seg.end - seg.begin));
      }
      for (const auto& sub : normalized_matcher_.Split(section)) {
        if (sub.token != nullptr) {
          ids.push_back(sub.token->id);
          continue;
        }
        EncodeSection(section.substr(sub.begin, sub.end - sub.begin), at_origin && sub.begin == 0,
                      ids);
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) continue;
      if (skip_special_tokens && special_[id]) continue;
      tokens.push_back(id_to_token_[id]);
    }
    if (decoder_ == nullptr) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (i > 0) out += ' ';
        out += tokens[i];
      }
      return tokenizer_internal::Utf8Lossy(out);
    }
    decoder_->Apply(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return tokenizer_internal::Utf8Lossy(out);
  }

  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || special_[id]) return "";
    if (decoder_ == nullptr) return id_to_token_[id];
    const auto join = [](const std::vector<std::string>& parts) {
      std::string out;
      for (const std::string& p : parts) out += p;
      return out;
    };
    // Decoders treat the first token of a text apart (Strip, Metaspace drop its leading space):
    // decode after an ordinary anchor token and keep what the token added.
    if (anchor_ >= 0) {
      std::vector<std::string> both = {id_to_token_[anchor_], id_to_token_[id]};
      std::vector<std::string> alone = {id_to_token_[anchor_]};
      decoder_->ApplyRaw(both);
      decoder_->ApplyRaw(alone);
      const std::string b = join(both), a = join(alone);
      if (b.size() >= a.size() && b.compare(0, a.size(), a) == 0) return b.substr(a.size());
    }
    std::vector<std::string> one = {id_to_token_[id]};
    decoder_->ApplyRaw(one);
    return join(one);
  }

  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = added_by_content_.find(absl::string_view(token.data(), token.size()));
    if (it != added_by_content_.end()) return it->second;
    auto v = model_->vocab().find(absl::string_view(token.data(), token.size()));
    if (v != model_->vocab().end()) return v->second;
    return std::nullopt;
  }
  std::string IdToToken(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return "";
    return id_to_token_[id];
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
  }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::string bos_token() const override { return bos_token_; }
  std::string eos_token() const override { return eos_token_; }

  void SetSpecialTokens(const std::optional<std::string>& bos,
                        const std::optional<std::string>& eos) {
    if (bos.has_value()) {
      bos_token_ = *bos;
      bos_id_ = TokenToId(*bos);
    }
    if (eos.has_value()) {
      eos_token_ = *eos;
      eos_id_ = TokenToId(*eos);
    }
  }

 private:
  HfTokenizer() = default;

  void EncodeSection(std::string_view section, bool at_origin, std::vector<int32_t>& ids) const {
    if (section.empty()) return;
    std::vector<Piece> pieces;
    pieces.push_back({std::string(section), at_origin});
    if (pre_tokenizer_ != nullptr && !pre_tokenizer_->Apply(pieces).ok()) {
      // Only an internal PCRE2 failure gets here (inputs are valid UTF-8); fall back to the
      // whole section as one word rather than dropping text.
      pieces.assign(1, {std::string(section), at_origin});
    }
    for (const Piece& p : pieces) model_->Tokenize(p.text, ids);
  }

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  int32_t anchor_ = -1;  // a non-special token TokenBytes decodes after (set at load)
  PostProcessor post_;
  std::vector<AddedToken> added_;  // stable: the matchers point into it
  AddedTokenMatcher raw_matcher_;
  AddedTokenMatcher normalized_matcher_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::string bos_token_;
  std::string eos_token_;
};

absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(std::string_view text,
                                                  const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not an object"));
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t;
  try {
    t = HfTokenizer::Build(j);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed tokenizer: ", e.what()));
  }
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(source, ": ", t.status().message()));
  }
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text,
                                                               const std::string& source) {
  ASSIGN_OR_RETURN(auto t, Load(json_text, source));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(auto t, Load(text, path));
  const std::string config_path = dir + "/tokenizer_config.json";
  std::ifstream probe(config_path);
  if (probe) {
    ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
    json config;
    try {
      config = json::parse(config_text);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": invalid JSON: ", e.what()));
    }
    if (config.is_object()) {
      t->SetSpecialTokens(TokenString(config, "bos_token"), TokenString(config, "eos_token"));
    }
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace tandem
