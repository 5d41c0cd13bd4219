// Guided decoding on the CPU: compiling a constraint, and a step's token mask, uncached (the first
// time an automaton state is reached) and cached (every later time).
//   build/bench/grammar/grammar_mask_bench [--benchmark_filter=...]
// Vocabularies: the bundled model's (8,192 tokens), and a synthetic 131,072-token one (the
// bundled tokens plus random pairs of them, so the tokens are longer and share prefixes as a
// large BPE vocabulary's do; Llama 3's is 128,256).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/pda.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/model/tokenizer.h"
#include "runtime/router/openai_protocol.h"

namespace {

using tandem::grammar::ByteDfa;
using tandem::grammar::TokenMasker;

const char* kPhone = "\\(?[0-9]{3}\\)?[ -][0-9]{3}-[0-9]{4}";
const char* kDateTime =
    "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5]"
    "[0-9](\\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})";
// A JSON-shaped regex: an object of three typed fields (what a JSON Schema compiles to).
const char* kJsonish =
    "\\{\"name\": \"[A-Za-z ]{1,32}\", \"age\": [0-9]{1,3}, \"tags\": \\[(\"[a-z]{1,10}\"(, "
    "\"[a-z]{1,10}\"){0,4})?\\]\\}";

const std::vector<std::string>& BundledVocab() {
  static const auto* vocab = [] {
    auto t = tandem::Tokenizer::FromModelDir(std::string(TANDEM_SOURCE_DIR) + "/models/target");
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      std::abort();
    }
    auto* v = new std::vector<std::string>((*t)->vocab_size());
    for (int id = 0; id < (*t)->vocab_size(); ++id) (*v)[id] = (*t)->TokenBytes(id);
    return v;
  }();
  return *vocab;
}

const std::vector<std::string>& LargeVocab() {
  static const auto* vocab = [] {
    const std::vector<std::string>& base = BundledVocab();
    auto* v = new std::vector<std::string>(base);
    std::mt19937 rng(1);
    while (v->size() < 131072) {
      const std::string& a = base[rng() % base.size()];
      const std::string& b = base[rng() % base.size()];
      if (!a.empty() && !b.empty()) v->push_back(a + b);
    }
    return v;
  }();
  return *vocab;
}

const char* Pattern(int i) { return i == 0 ? kPhone : i == 1 ? kDateTime : kJsonish; }

void BM_Compile(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(Pattern(state.range(0)));
    benchmark::DoNotOptimize(dfa);
  }
}
BENCHMARK(BM_Compile)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

// A JSON Schema of `n` properties (string, integer, boolean, number in turn; every other one
// required), as a structured-outputs request brings it: schema to regex to automaton.
nlohmann::ordered_json WideSchema(int n) {
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  nlohmann::ordered_json required = nlohmann::ordered_json::array();
  static const char* types[] = {"string", "integer", "boolean", "number"};
  for (int i = 0; i < n; ++i) {
    const std::string name = "field_" + std::to_string(i);
    props[name] = {{"type", types[i % 4]}};
    if (i % 2 == 0) required.push_back(name);
  }
  return {{"type", "object"}, {"properties", props}, {"required", required}};
}

void BM_JsonSchemaCompile(benchmark::State& state) {
  const nlohmann::ordered_json schema = WideSchema(static_cast<int>(state.range(0)));
  size_t regex_bytes = 0;
  int states = 0;
  for (auto _ : state) {
    absl::StatusOr<std::string> regex = tandem::grammar::JsonSchemaToRegex(schema);
    absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(*regex);
    if (!dfa.ok()) {
      state.SkipWithError(std::string(dfa.status().message()).c_str());
      break;
    }
    regex_bytes = regex->size();
    states = dfa->num_states();
    benchmark::DoNotOptimize(dfa);
  }
  state.counters["regex_bytes"] = static_cast<double>(regex_bytes);
  state.counters["states"] = states;
}
BENCHMARK(BM_JsonSchemaCompile)->Arg(10)->Arg(50)->Unit(benchmark::kMillisecond);

// The router's whole parse of a chat request carrying a 50-property json_schema
// response_format: range 0, a schema seen before (the router's constraint cache); 1, a new one
// each time (a property renamed), which compiles.
void BM_ChatRequestWithSchema(benchmark::State& state) {
  const bool fresh = state.range(0) != 0;
  int n = 0;
  auto body = [&](int salt) {
    nlohmann::ordered_json schema = WideSchema(50);
    schema["properties"][absl::StrCat("salt_", salt)] = {{"type", "boolean"}};
    nlohmann::ordered_json req = {
        {"messages", {{{"role", "user"}, {"content", "x"}}}},
        {"response_format",
         {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}};
    return req.dump();
  };
  const std::string same = body(-1);
  benchmark::DoNotOptimize(tandem::router::ParseChatCompletionRequest(same).ok());
  for (auto _ : state) {
    const std::string text = fresh ? body(n++) : same;
    absl::StatusOr<tandem::router::OpenAiRequest> r =
        tandem::router::ParseChatCompletionRequest(text);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_ChatRequestWithSchema)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Uncached masks of a JSON Schema's automaton (10 properties) on the 131,072-token vocabulary,
// cycling over its states, and of json_object's.
void BM_JsonMaskUncached(benchmark::State& state) {
  const std::string regex = state.range(0) == 0
                                ? *tandem::grammar::JsonSchemaToRegex(WideSchema(10))
                                : tandem::grammar::AnyJsonObjectRegex();
  const ByteDfa dfa = *ByteDfa::FromRegex(regex);
  const TokenMasker masker(&dfa, LargeVocab());
  int s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(masker.ComputeMask(s));
    s = (s + 1) % dfa.num_states();
  }
  state.counters["states"] = dfa.num_states();
}
BENCHMARK(BM_JsonMaskUncached)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The target's measure: the mask time per decoded token, median over whole documents, for a
// nested JSON Schema (objects, arrays, enums) on the 131,072-token vocabulary. Each iteration
// decodes `docs` documents by random walks over the allowed tokens with a cold masker (the first
// request with a new schema: every state's first visit is paid), timing every Mask() call.
nlohmann::ordered_json NestedSchema() {
  return nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "id": {"type": "integer", "minimum": 0, "maximum": 100000},
      "status": {"enum": ["open", "closed", "pending"]},
      "owner": {"type": "object", "properties": {
        "name": {"type": "string"},
        "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "maxItems": 3}},
        "required": ["name", "roles"]},
      "items": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1,
        "maximum": 99}, "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
        "required": ["sku", "qty"]}},
      "note": {"type": ["string", "null"]}
    },
    "required": ["id", "status", "owner", "items"]})");
}

// The per-token mask times' count, median, p90 and mean as the benchmark's counters.
void ReportPerToken(std::vector<double> times_us, benchmark::State& state) {
  std::sort(times_us.begin(), times_us.end());
  state.counters["tokens"] = static_cast<double>(times_us.size());
  state.counters["median_us"] = times_us[times_us.size() / 2];
  state.counters["p90_us"] = times_us[times_us.size() * 9 / 10];
  double sum = 0;
  for (double t : times_us) sum += t;
  state.counters["mean_us"] = sum / static_cast<double>(times_us.size());
}

void BM_JsonMaskPerToken(benchmark::State& state) {
  const std::vector<std::string>& vocab = LargeVocab();
  const ByteDfa dfa = *ByteDfa::FromRegex(*tandem::grammar::JsonSchemaToRegex(NestedSchema()));
  const auto trie = std::make_shared<const tandem::grammar::VocabTrie>(vocab);
  std::vector<double> times_us;
  std::mt19937 rng(7);
  for (auto _ : state) {
    const TokenMasker masker(&dfa, trie);  // cold
    for (int doc = 0; doc < 4; ++doc) {
      int s = dfa.start();
      for (int step = 0; step < 400; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::shared_ptr<const tandem::grammar::TokenBitmask> mask = masker.Mask(s);
        times_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        if (dfa.accepting(s) && (!dfa.can_continue(s) || rng() % 8 == 0)) break;
        std::vector<int> allowed;
        for (int id = 0; id < mask->size(); ++id) {
          if (mask->Test(id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        s = dfa.Walk(s, vocab[allowed[rng() % allowed.size()]]);
      }
    }
  }
  ReportPerToken(std::move(times_us), state);
  state.counters["states"] = dfa.num_states();
}
BENCHMARK(BM_JsonMaskPerToken)->Iterations(3)->Unit(benchmark::kMillisecond);

// llama.cpp's grammars/json.gbnf (recursive: values hold objects and arrays, which hold values)
// as a pushdown automaton: compile time, and the mask time per decoded token as above (random
// walks over the allowed tokens, a cold masker per iteration: every configuration's first mask is
// paid; Arg 1 starts each document 60 to 63 arrays deep, where every configuration is new).
const char* kJsonGbnf = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

void BM_GbnfCompile(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(tandem::grammar::GrammarPda::FromGbnf(kJsonGbnf));
  }
}
BENCHMARK(BM_GbnfCompile)->Unit(benchmark::kMicrosecond);

void BM_GbnfJsonMaskPerToken(benchmark::State& state) {
  const std::vector<std::string>& vocab = LargeVocab();
  const auto trie = std::make_shared<const tandem::grammar::VocabTrie>(vocab);
  std::vector<double> times_us;
  std::mt19937 rng(7);
  int configs = 0, deepest = 0;
  for (auto _ : state) {
    const std::unique_ptr<tandem::grammar::GrammarPda> pda =
        *tandem::grammar::GrammarPda::FromGbnf(kJsonGbnf);  // cold
    const TokenMasker masker(pda.get(), trie);
    for (int doc = 0; doc < 4; ++doc) {
      std::string deep = "{\"a\": ";
      for (int i = 0; i < 60 + doc; ++i) deep += "[ ";
      int s = state.range(0) == 1 ? pda->Walk(pda->start(), deep) : pda->start();
      for (int step = 0; step < 400; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::shared_ptr<const tandem::grammar::TokenBitmask> mask = masker.Mask(s);
        times_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        deepest = std::max(deepest, pda->StacksAndDepth(s).second);
        if (pda->accepting(s) && (!pda->can_continue(s) || rng() % 8 == 0)) break;
        std::vector<int> allowed;
        for (int id = 0; id < mask->size(); ++id) {
          if (mask->Test(id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        const int pick = allowed[rng() % allowed.size()];
        s = pda->Walk(s, vocab[pick]);
      }
    }
    configs = pda->num_configs();
  }
  ReportPerToken(std::move(times_us), state);
  state.counters["configs"] = configs;
  state.counters["max_depth"] = deepest;
}
BENCHMARK(BM_GbnfJsonMaskPerToken)->Arg(0)->Arg(1)->Iterations(3)->Unit(benchmark::kMillisecond);

// One uncached mask per iteration, cycling over every state of the automaton.
void BM_MaskUncached(benchmark::State& state) {
  const std::vector<std::string>& vocab = state.range(1) == 0 ? BundledVocab() : LargeVocab();
  const ByteDfa dfa = *ByteDfa::FromRegex(Pattern(state.range(0)));
  const TokenMasker masker(&dfa, vocab);
  int s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(masker.ComputeMask(s));
    s = (s + 1) % dfa.num_states();
  }
  state.counters["states"] = dfa.num_states();
  state.counters["vocab"] = static_cast<double>(vocab.size());
}
BENCHMARK(BM_MaskUncached)->ArgsProduct({{0, 1, 2}, {0, 1}})->Unit(benchmark::kMicrosecond);

void BM_MaskCached(benchmark::State& state) {
  const std::vector<std::string>& vocab = LargeVocab();
  const ByteDfa dfa = *ByteDfa::FromRegex(kJsonish);
  const TokenMasker masker(&dfa, vocab);
  for (int s = 0; s < dfa.num_states(); ++s) masker.Mask(s);
  int s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(masker.Mask(s));
    s = (s + 1) % dfa.num_states();
  }
}
BENCHMARK(BM_MaskCached)->Unit(benchmark::kMicrosecond);

// The vocabulary trie, built once per engine and shared by every constraint.
void BM_VocabTrieBuild(benchmark::State& state) {
  const std::vector<std::string>& vocab = state.range(0) == 0 ? BundledVocab() : LargeVocab();
  for (auto _ : state) {
    tandem::grammar::VocabTrie trie(vocab);
    benchmark::DoNotOptimize(trie);
  }
}
BENCHMARK(BM_VocabTrieBuild)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
