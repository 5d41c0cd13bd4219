#pragma once
// Drafter: proposes tokens for speculative decoding (docs/speculative.md). The decode engine asks
// once per step for the sequences it is decoding, scores each sequence's last token plus its
// drafts in one forward pass, and keeps the longest prefix of drafts that the target model's own
// sampling reproduces (plus the token it sampled after it). So output never depends on the
// drafter: a drafter that is wrong, slow, dead or malicious only costs speed.
//
// Contract:
// - Propose gets the sequences of one step (prompt and accepted output; never unverified drafts)
//   and returns, for each, at most `max_tokens` tokens to try after it (none is a fine answer).
//   It should answer by `deadline`; the engine drops a late or failed answer (a fallback to
//   plain decoding, counted) and validates every token against its vocabulary, since a drafter
//   may be another process.
// - Release tells the drafter a sequence is gone (finished, aborted or preempted), with its final
//   tokens, so it can free per-sequence state or learn from the output. A key may come back
//   after Release (a preempted sequence resumes) with its tokens from the start.
//
// Keys are the engine's sequence ids: unique among live sequences of one engine.
//
// Thread-safety: an engine calls its drafter from its own thread only; a drafter shared by
// several engines must synchronize itself.
//
// Drafters are created by name through the registry (registry.h), as backends are.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::speculative {

struct DraftRequest {
  int64_t key = 0;                  // the sequence (stable while it lives)
  std::span<const int32_t> tokens;  // prompt followed by accepted output
  int num_prompt_tokens = 0;        // of tokens
  int max_tokens = 0;               // propose at most this many (>= 1)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string_view name() const = 0;
  // One vector per request, in order, each at most its max_tokens long.
  virtual absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const DraftRequest> requests, absl::Time deadline) = 0;
  virtual void Release(int64_t key, std::span<const int32_t> tokens, int num_prompt_tokens) = 0;
};

}  // namespace tandem::speculative
