#pragma once
// Drafters by name, as `--speculative` spells them (docs/speculative.md):
//   "ngram"   prompt lookup and suffix decoding (ngram_drafter.h)
// InvalidArgument for an unknown name, naming the choices. "draft:DIR" (a draft model on the
// worker) and "remote:ADDR" (the `tandem drafter` service) are planned (issue 25) and answer
// Unimplemented until they exist.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "speculative/drafter.h"

namespace tandem::speculative {

struct DrafterEntry {
  std::string_view name;     // or the prefix before ':' for drafters that take an argument
  std::string_view summary;  // for --help and errors
};
const std::vector<DrafterEntry>& DrafterRegistry();

absl::StatusOr<std::unique_ptr<Drafter>> CreateDrafter(std::string_view spec);

}  // namespace tandem::speculative
