// `tandem tokenize`: encodes text with a model directory's tokenizer.json, as Hugging Face
// `tokenizer.encode(text, add_special_tokens=False)` does (True with --add-special-tokens).
//   tandem tokenize --model DIR [--json] TEXT...   ids per text (space-separated, or {"ids":
//   [...]}) tandem tokenize --model DIR < lines            one JSON string per line in, {"ids":
//   [...]} out tandem tokenize --model DIR --chat msgs.json   {"text": ..., "ids": [...]} of the
//   chat prompt
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "runtime/model/chat_template.h"
#include "runtime/model/tokenizer.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;

struct TokenizeOptions {
  std::string model_dir;
  bool json_output = false;
  bool add_special_tokens = false;
  std::string chat_file;
  std::vector<std::string> texts;
};

std::string IdsJson(const std::vector<int32_t>& ids) {
  return json{{"ids", ids}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string IdsPlain(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

absl::StatusOr<std::vector<ChatMessage>> ReadMessages(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
  if (!j.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected an array of messages"));
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": message ", i, " must be {\"role\": string, \"content\": string}"));
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

absl::Status RunChat(const TokenizeOptions& opts, const Tokenizer& tokenizer) {
  auto messages = ReadMessages(opts.chat_file);
  if (!messages.ok()) return messages.status();
  auto chat = ChatTemplate::FromModelDir(opts.model_dir);
  if (!chat.ok()) return chat.status();
  auto text = (*chat)->Render(*messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  const std::vector<int32_t> ids = tokenizer.Encode(*text, opts.add_special_tokens);
  nlohmann::ordered_json out;
  out["text"] = *text;
  out["ids"] = ids;
  std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n" << std::flush;
  return absl::OkStatus();
}

// One JSON string per stdin line; one {"ids": [...]} line out per line in, flushed as it goes.
absl::Status RunLines(const TokenizeOptions& opts, const Tokenizer& tokenizer) {
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("stdin line ", line_number, ": not valid JSON: ", e.what()));
    }
    if (!j.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stdin line ", line_number, ": expected a JSON string"));
    }
    std::cout << IdsJson(tokenizer.Encode(j.get<std::string>(), opts.add_special_tokens)) << "\n"
              << std::flush;
  }
  return absl::OkStatus();
}

int RunTokenize(const TokenizeOptions& opts) {
  if (!opts.chat_file.empty() && !opts.texts.empty()) {
    std::cerr << "tandem tokenize: --chat takes no TEXT arguments\n";
    return 2;
  }
  auto tokenizer = Tokenizer::FromModelDir(opts.model_dir);
  if (!tokenizer.ok()) {
    std::cerr << "tandem tokenize: " << tokenizer.status().message() << "\n";
    return 1;
  }
  absl::Status status;
  if (!opts.chat_file.empty()) {
    status = RunChat(opts, **tokenizer);
  } else if (opts.texts.empty()) {
    status = RunLines(opts, **tokenizer);
  } else {
    for (const std::string& text : opts.texts) {
      const std::vector<int32_t> ids = (*tokenizer)->Encode(text, opts.add_special_tokens);
      std::cout << (opts.json_output ? IdsJson(ids) : IdsPlain(ids)) << "\n";
    }
    std::cout << std::flush;
  }
  if (!status.ok()) {
    std::cerr << "tandem tokenize: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Encode text with DIR/tokenizer.json (like HF tokenizer.encode). With no TEXT, reads one "
      "JSON string per stdin line and writes one {\"ids\": [...]} line per input line.");
  cmd->add_option("--model", opts->model_dir, "model directory holding tokenizer.json")->required();
  cmd->add_flag("--json", opts->json_output, "print {\"ids\": [...]} per TEXT");
  cmd->add_flag("--add-special-tokens", opts->add_special_tokens,
                "apply the post-processor (e.g. prepend BOS)");
  cmd->add_option("--chat", opts->chat_file,
                  "render a JSON array of {role, content} through the model's chat template "
                  "(add_generation_prompt) and print {\"text\": ..., \"ids\": [...]}");
  cmd->add_option("text", opts->texts, "texts to encode");
  cmd->callback([opts, exit_code] { *exit_code = RunTokenize(*opts); });
}

}  // namespace tandem::cli
