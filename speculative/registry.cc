#include "speculative/registry.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/model/runner_factory.h"
#include "speculative/draft_model_drafter.h"
#include "speculative/ngram_drafter.h"
#include "speculative/remote_drafter.h"

namespace tandem::speculative {

const std::vector<DrafterEntry>& DrafterRegistry() {
  static const auto* entries = new std::vector<DrafterEntry>{
      {"ngram", "prompt lookup and suffix decoding over the sequence and recent outputs"},
      {"draft", "draft:DIR, a small model of the target's vocabulary on the worker"},
      {"remote", "remote:ADDR[,ADDR...], tandem drafter services"},
  };
  return *entries;
}

absl::StatusOr<std::unique_ptr<Drafter>> CreateDrafter(std::string_view spec_view,
                                                       const DrafterContext& context) {
  const std::string spec(spec_view);  // absl's string_view is not std's here
  if (spec == "ngram") {
    absl::StatusOr<std::unique_ptr<NgramDrafter>> d = NgramDrafter::Create(NgramDrafterOptions{});
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(*std::move(d));
  }
  if (absl::StartsWith(spec, "draft:")) {
    const std::string dir = spec.substr(6);
    if (dir.empty()) return absl::InvalidArgumentError("--speculative draft:DIR: DIR is empty");
    RunnerOptions options;
    options.kv_cache_bytes = context.kv_cache_bytes;
    options.block_size = context.block_size;
    absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
        CreateModelRunner(context.device, dir, options);
    if (!runner.ok()) {
      return absl::Status(runner.status().code(),
                          absl::StrCat("--speculative ", spec, ": ", runner.status().message()));
    }
    const int vocab = (*runner)->config().vocab_size;
    if (context.target_vocab_size > 0 && vocab != context.target_vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative ", spec, ": the draft model's vocabulary has ", vocab,
                       " tokens, the target's ", context.target_vocab_size,
                       ": a draft model must share the target's tokenizer"));
    }
    absl::StatusOr<std::unique_ptr<DraftModelDrafter>> d =
        DraftModelDrafter::Create(*std::move(runner), DraftModelOptions{});
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(*std::move(d));
  }
  if (absl::StartsWith(spec, "remote:")) {
    std::vector<std::string> addresses = absl::StrSplit(spec.substr(7), ',');
    if (context.identity == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative ", spec, ": no service identity to call the drafters with"));
    }
    absl::StatusOr<std::unique_ptr<RemoteDrafter>> d =
        RemoteDrafter::Create(addresses, context.identity);
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat("--speculative ", spec, ": ", d.status().message()));
    }
    return std::unique_ptr<Drafter>(*std::move(d));
  }
  std::vector<std::string> names;
  for (const DrafterEntry& e : DrafterRegistry()) names.emplace_back(e.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "--speculative '", spec, "': unknown drafter (choices: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace tandem::speculative
