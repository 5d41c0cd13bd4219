#pragma once
// Drafters by name, as `--speculative` spells them (docs/speculative.md):
//   "ngram"      prompt lookup and suffix decoding (ngram_drafter.h)
//   "draft:DIR"  a small model from the Hugging Face directory DIR on the worker's device, with
//                its own KV cache (draft_model_drafter.h); it must share the target's vocabulary
//   "remote:ADDR[,ADDR...]"  `tandem drafter` services (remote_drafter.h), called with the
//                worker's service identity
// InvalidArgument for an unknown name (naming the choices) or a draft model that does not fit
// the target; the model loader's errors otherwise.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "speculative/drafter.h"

namespace tandem::auth {
class ServiceIdentity;
}  // namespace tandem::auth

namespace tandem::speculative {

struct DrafterEntry {
  std::string_view name;     // or the prefix before ':' for drafters that take an argument
  std::string_view summary;  // for --help and errors
};
const std::vector<DrafterEntry>& DrafterRegistry();

// What a drafter must match or use of the worker it drafts for.
struct DrafterContext {
  int target_vocab_size = 0;                 // 0: not checked
  std::string device = "cpu";                // the worker's device ("cpu", "cuda:N")
  size_t kv_cache_bytes = size_t{64} << 20;  // a draft model's own KV cache
  int block_size = 16;
  // remote: the credential presented to the drafter services (required).
  std::shared_ptr<const auth::ServiceIdentity> identity;
};

absl::StatusOr<std::unique_ptr<Drafter>> CreateDrafter(std::string_view spec,
                                                       const DrafterContext& context = {});

}  // namespace tandem::speculative
