// Test tool for check.py: compiles a JSON Schema (runtime/grammar/json_schema.h) to its byte
// automaton and
//   json_schema_sample sample SCHEMA_FILE N SEED   prints N random texts the automaton accepts,
//                                                   one JSON string per line;
//   json_schema_sample match SCHEMA_FILE            reads JSON-string lines on stdin and prints
//                                                   1 or 0 per line: whether the automaton
//                                                   accepts the text;
//   json_schema_sample compile SCHEMA_FILE          prints "ok" or the compile error.
// The random walk picks uniformly among the distinct next states (then a byte leading there),
// so structure is explored rather than long strings; it ends at an accepting state with
// probability 1/4, or when nothing can follow.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/json_schema.h"

namespace {

using json = nlohmann::ordered_json;
using tandem::grammar::ByteDfa;

int Usage() {
  std::cerr << "usage: json_schema_sample sample|match|compile SCHEMA_FILE [N SEED]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string mode = argv[1];
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  const json schema = json::parse(text.str(), nullptr, false);
  if (schema.is_discarded()) {
    std::cerr << "not JSON: " << argv[2] << "\n";
    return 2;
  }
  absl::StatusOr<std::string> regex = tandem::grammar::JsonSchemaToRegex(schema);
  absl::StatusOr<ByteDfa> dfa = regex.ok() ? ByteDfa::FromRegex(*regex) : regex.status();
  if (mode == "compile") {
    std::cout << (dfa.ok() ? std::string("ok") : std::string(dfa.status().message())) << "\n";
    return 0;
  }
  if (!dfa.ok()) {
    std::cerr << dfa.status() << "\n";
    return 1;
  }
  if (mode == "match") {
    std::string line;
    while (std::getline(std::cin, line)) {
      std::cout << (dfa->Matches(json::parse(line).get<std::string>()) ? 1 : 0) << "\n";
    }
    return 0;
  }
  if (mode != "sample" || argc != 5) return Usage();
  const int n = std::stoi(argv[3]);
  std::mt19937_64 rng(std::stoull(argv[4]));
  for (int i = 0; i < n; ++i) {
    std::string out;
    int s = dfa->start();
    while (out.size() < 4096) {
      if (dfa->accepting(s) && (!dfa->can_continue(s) || rng() % 4 == 0)) break;
      std::vector<int> targets;
      for (int b = 0; b < 256; ++b) {
        const int t = dfa->Next(s, static_cast<uint8_t>(b));
        if (t != tandem::grammar::kDeadState &&
            std::find(targets.begin(), targets.end(), t) == targets.end()) {
          targets.push_back(t);
        }
      }
      const int target = targets[rng() % targets.size()];
      std::vector<int> bytes;
      for (int b = 0; b < 256; ++b) {
        if (dfa->Next(s, static_cast<uint8_t>(b)) == target) bytes.push_back(b);
      }
      out.push_back(static_cast<char>(bytes[rng() % bytes.size()]));
      s = target;
    }
    if (!dfa->accepting(s)) continue;  // too long: skipped, check.py counts what came back
    std::cout << json(out).dump() << "\n";
  }
  return 0;
}
