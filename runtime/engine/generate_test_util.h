#pragma once
// Test-only: runs prompts through an engine and collects each one's tokens.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"

namespace tandem {

// Submits every prompt with `params` at once, waits (at most 120 s) until all finished, shuts
// the engine down and returns each prompt's tokens by index; *stats gets the engine's stats
// (when not null). An error output fails the test.
inline std::vector<std::vector<int32_t>> GenerateAll(
    std::unique_ptr<Engine> engine, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingParams& params, EngineStats* stats = nullptr) {
  absl::Mutex mu;
  std::vector<std::vector<int32_t>> out(prompts.size());
  size_t finished = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params = params;
    r.on_output = [&, i](const GenerationOutput& o) {
      absl::MutexLock lock(&mu);
      out[i].insert(out[i].end(), o.token_ids.begin(), o.token_ids.end());
      EXPECT_NE(o.finish_reason, FinishReason::kError) << o.error;
      if (o.finish_reason.has_value()) ++finished;
    };
    CHECK(engine->Submit(std::move(r)).ok());
  }
  {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished == prompts.size(); };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120)));
  }
  engine->Shutdown(absl::Seconds(5));
  if (stats != nullptr) *stats = engine->stats();
  absl::MutexLock lock(&mu);
  return out;
}

}  // namespace tandem
