#include "speculative/registry.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "speculative/ngram_drafter.h"

namespace tandem::speculative {

const std::vector<DrafterEntry>& DrafterRegistry() {
  static const auto* entries = new std::vector<DrafterEntry>{
      {"ngram", "prompt lookup and suffix decoding over the sequence and recent outputs"},
  };
  return *entries;
}

absl::StatusOr<std::unique_ptr<Drafter>> CreateDrafter(std::string_view spec_view) {
  const std::string spec(spec_view);  // absl's string_view is not std's here
  if (spec == "ngram") {
    absl::StatusOr<std::unique_ptr<NgramDrafter>> d = NgramDrafter::Create(NgramDrafterOptions{});
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(*std::move(d));
  }
  if (absl::StartsWith(spec, "draft:") || absl::StartsWith(spec, "remote:")) {
    return absl::UnimplementedError(absl::StrCat(
        "--speculative ", spec, ": draft-model and remote drafters are not built yet"));
  }
  std::vector<std::string> names;
  for (const DrafterEntry& e : DrafterRegistry()) names.emplace_back(e.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "--speculative '", spec, "': unknown drafter (choices: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace tandem::speculative
