// GBNF grammars (runtime/grammar/gbnf.h, vLLM's guided_grammar) from untrusted request text.
//
// Input: the grammar text. Properties: no crash or hang; an accepted grammar gives a regex within
// the byte limit that the automaton compiler takes (the compiler promised it), with a recursion
// depth in [0, max_recursion_depth].
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/gbnf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tandem::grammar::GbnfOptions options;
  absl::StatusOr<tandem::grammar::GbnfRegex> r = tandem::grammar::GbnfToRegex(text, options);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(r->regex.size() <= options.max_regex_bytes);
  FUZZ_CHECK(r->recursion_depth >= 0 && r->recursion_depth <= options.max_recursion_depth);
  FUZZ_CHECK(tandem::grammar::ByteDfa::FromRegex(r->regex).ok());
  return 0;
}
