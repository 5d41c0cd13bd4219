// Decode reference check: reads {"ids": [...], "skip": bool, "text": "..."} lines written by
// check_tokenizer.mjs from the JavaScript reference's decode, and checks that
// Tokenizer::Decode(ids, skip) gives `text` and that streaming the ids through an
// IncrementalDetokenizer gives whole-UTF-8 deltas that concatenate to `text`.
// usage: tokenizer_decode_check MODEL_DIR DECODE.jsonl
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model/tokenizer.h"
#include "runtime/model/tokenizer_unicode.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: tokenizer_decode_check MODEL_DIR DECODE.jsonl\n";
    return 2;
  }
  auto tokenizer = tandem::Tokenizer::FromModelDir(argv[1]);
  if (!tokenizer.ok()) {
    std::cerr << "FAIL: " << tokenizer.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2]);
  if (!in) {
    std::cerr << "FAIL: cannot open " << argv[2] << " (written by check_tokenizer.mjs)\n";
    return 1;
  }
  std::string line;
  int checked = 0;
  int failed = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      std::cerr << "FAIL: bad line " << checked + 1 << ": " << e.what() << "\n";
      return 1;
    }
    const std::vector<int32_t> ids = j.at("ids").get<std::vector<int32_t>>();
    const bool skip = j.at("skip").get<bool>();
    const std::string expected = j.at("text").get<std::string>();
    const std::string decoded = (*tokenizer)->Decode(ids, skip);
    tandem::IncrementalDetokenizer detok(**tokenizer, skip);
    std::string streamed;
    bool whole = true;
    for (int32_t id : ids) {
      const std::string delta = detok.Push(id);
      whole = whole && tandem::tokenizer_internal::IsValidUtf8(delta);
      streamed += delta;
    }
    streamed += detok.Flush();
    ++checked;
    if (decoded != expected || streamed != expected || !whole) {
      if (++failed <= 5) {
        std::cout << "MISMATCH (line " << checked << ", skip_special_tokens=" << skip << "): ids "
                  << j.at("ids").dump() << "\n  reference: " << nlohmann::json(expected).dump()
                  << "\n  Decode:    "
                  << nlohmann::json(decoded).dump(-1, ' ', false,
                                                  nlohmann::json::error_handler_t::replace)
                  << "\n  streamed:  "
                  << nlohmann::json(streamed).dump(-1, ' ', false,
                                                   nlohmann::json::error_handler_t::replace)
                  << (whole ? "" : " (a delta split a character)") << "\n";
      }
    }
  }
  std::cout << argv[2] << ": " << checked << " decodes compared, " << failed << " mismatches\n";
  return failed == 0 && checked > 0 ? 0 : 1;
}
