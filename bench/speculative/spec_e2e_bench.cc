// spec_e2e_bench: the engine end to end with speculative decoding at a controlled acceptance rate,
// on any model (random weights included) and device.
//   spec_e2e_bench --model DIR [--device cpu|cuda|cuda:N] [--requests 8] [--concurrency 1]
//                  [--prompt-len 512] [--output-len 128] [--k 4] [--acceptance 0.5,0.7,0.9]
//                  [--kv-cache-mib 1024] [--seed 1] [--json FILE] [--check-batching]
// First a plain run records every request's greedy output and the tokens/s; then, per acceptance
// rate a, an engine whose drafter proposes that output's next tokens, each one the true token
// with probability a (independently; a wrong one ends what can be accepted), so the acceptance
// rate is what a real drafter (n-gram, suffix, a draft model) would reach on a workload where
// it is right that often. The engine's whole step loop runs (drafting, verification on the
// runner, adaptive k, sampling, emission), and every speculative run's outputs must equal the
// plain run's: a mismatch is an error (exit 1). Prints a table; --json writes every number.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"
#include "runtime/model/runner_factory.h"
#include "speculative/drafter.h"

namespace tandem {
namespace {

struct Flags {
  std::string model_dir;
  std::string device = "cpu";
  int requests = 8;
  int concurrency = 1;
  int prompt_len = 512;
  int output_len = 128;
  int k = 4;
  std::vector<double> acceptance = {0.5, 0.7, 0.9};
  int kv_cache_mib = 1024;
  uint64_t seed = 1;
  std::string json_path;
  bool check_batching = false;
};

// Proposes the reference continuation of each request (by prompt), each token right with
// probability `rate` (decided per position, so a draft re-proposed later agrees with itself).
class ControlledDrafter : public speculative::Drafter {
 public:
  ControlledDrafter(const std::map<std::vector<int32_t>, std::vector<int32_t>>* reference,
                    double rate, int vocab, uint64_t seed)
      : reference_(reference), rate_(rate), vocab_(vocab), seed_(seed) {}
  std::string_view name() const override { return "controlled"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const speculative::DraftRequest> requests, absl::Time) override {
    std::vector<std::vector<int32_t>> out;
    for (const speculative::DraftRequest& r : requests) {
      const std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + r.num_prompt_tokens);
      const auto it = reference_->find(prompt);
      std::vector<int32_t> draft;
      if (it != reference_->end()) {
        const std::vector<int32_t>& full = it->second;
        for (size_t p = r.tokens.size() - r.num_prompt_tokens;
             p < full.size() && static_cast<int>(draft.size()) < r.max_tokens; ++p) {
          std::mt19937_64 rng(seed_ ^ (std::hash<size_t>{}(p)*0x9e3779b97f4a7c15ULL) ^
                              static_cast<uint64_t>(prompt.front()) << 32);
          const bool right = std::uniform_real_distribution<double>(0, 1)(rng) < rate_;
          draft.push_back(right ? full[p] : (full[p] + 1) % vocab_);
        }
      }
      out.push_back(std::move(draft));
    }
    return out;
  }
  void Release(int64_t, std::span<const int32_t>, int) override {}

 private:
  const std::map<std::vector<int32_t>, std::vector<int32_t>>* reference_;
  const double rate_;
  const int vocab_;
  const uint64_t seed_;
};

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;
  double seconds = 0;
  int64_t tokens = 0;
  EngineStats stats;
};

// Runs every prompt, `concurrency` at a time, greedy, exactly output_len tokens each.
absl::StatusOr<RunResult> RunAll(const Flags& f, const std::vector<std::vector<int32_t>>& prompts,
                                 EngineOptions options) {
  RunnerOptions ro;
  ro.kv_cache_bytes = static_cast<size_t>(f.kv_cache_mib) << 20;
  ro.max_batch_tokens = std::max(2048, f.prompt_len);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(f.device, f.model_dir, ro);
  if (!runner.ok()) return runner.status();
  options.max_num_seqs = std::max(options.max_num_seqs, f.concurrency);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(*std::move(runner), nullptr, options);
  if (!engine.ok()) return engine.status();
  RunResult result;
  result.outputs.resize(prompts.size());
  absl::Mutex mu;
  size_t finished = 0, in_flight = 0;
  absl::Status failure;
  const auto start = std::chrono::steady_clock::now();
  // This thread submits while fewer than `concurrency` run; outputs arrive on the engine's.
  for (size_t i = 0; i < prompts.size(); ++i) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return in_flight < static_cast<size_t>(f.concurrency);
      };
      mu.Await(absl::Condition(&room));
      ++in_flight;
    }
    GenerateRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params.max_tokens = f.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    r.on_output = [&, i](const GenerationOutput& out) {
      absl::MutexLock lock(&mu);
      result.outputs[i].insert(result.outputs[i].end(), out.token_ids.begin(), out.token_ids.end());
      if (!out.finish_reason.has_value()) return;
      if (*out.finish_reason == FinishReason::kError && failure.ok()) failure = out.error;
      ++finished;
      --in_flight;
    };
    if (absl::Status s = (*engine)->Submit(std::move(r)); !s.ok()) {
      absl::MutexLock lock(&mu);
      if (failure.ok()) failure = s;
      ++finished;
      --in_flight;
    }
  }
  {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished == prompts.size(); };
    if (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Minutes(30))) {
      failure = absl::DeadlineExceededError("requests did not finish within 30 minutes");
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (*engine)->Shutdown(absl::Seconds(10));
  result.stats = (*engine)->stats();
  absl::MutexLock lock(&mu);
  if (!failure.ok()) return failure;
  for (const auto& o : result.outputs) result.tokens += static_cast<int64_t>(o.size());
  return result;
}

int Run(const Flags& f) {
  const auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "spec_e2e_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  absl::StatusOr<ModelConfig> config = LoadModelConfig(f.model_dir);
  if (!config.ok()) return fail(config.status());
  const int vocab = config->vocab_size;
  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(f.requests);
  for (auto& p : prompts) {
    p.resize(f.prompt_len);
    for (int32_t& t : p) t = token(rng);
  }
  nlohmann::json out = {{"model", f.model_dir},
                        {"device", f.device},
                        {"requests", f.requests},
                        {"concurrency", f.concurrency},
                        {"prompt_len", f.prompt_len},
                        {"output_len", f.output_len},
                        {"k", f.k}};
  absl::StatusOr<RunResult> plain = RunAll(f, prompts, EngineOptions{});
  if (!plain.ok()) return fail(plain.status());
  const double plain_tps = plain->tokens / plain->seconds;
  std::printf("%-10s %10s %8s %12s %12s %12s\n", "run", "tokens/s", "speedup", "acceptance",
              "steps/token", "outputs");
  std::printf("%-10s %10.1f %8.2f %12s %12.3f %12s\n", "plain", plain_tps, 1.0, "-",
              static_cast<double>(plain->stats.steps) / plain->tokens, "reference");
  out["plain"] = {{"tokens_per_s", plain_tps},
                  {"seconds", plain->seconds},
                  {"tokens", plain->tokens},
                  {"steps", plain->stats.steps}};
  // Plain decoding of the same prompts all at once: whether this runner's greedy outputs depend
  // on the batch at all (GPU kernels of other shapes round differently; where a model's top two
  // logits are that close, no verification can match plain decoding either).
  if (f.check_batching) {
    Flags together = f;
    together.concurrency = f.requests;
    absl::StatusOr<RunResult> batched = RunAll(together, prompts, EngineOptions{});
    if (!batched.ok()) return fail(batched.status());
    int same = 0;
    for (size_t i = 0; i < prompts.size(); ++i) same += batched->outputs[i] == plain->outputs[i];
    std::printf("%-10s %10.1f %8s %12s %12s %5d/%-6zu\n", "plain, all",
                batched->tokens / batched->seconds, "-", "-", "-", same, prompts.size());
    out["plain_all_at_once_identical"] = same;
  }
  std::map<std::vector<int32_t>, std::vector<int32_t>> reference;
  for (size_t i = 0; i < prompts.size(); ++i) reference[prompts[i]] = plain->outputs[i];
  bool identical = true;
  nlohmann::json runs = nlohmann::json::array();
  for (double a : f.acceptance) {
    EngineOptions o;
    o.drafter = std::make_shared<ControlledDrafter>(&reference, a, vocab, f.seed);
    o.num_speculative_tokens = f.k;
    absl::StatusOr<RunResult> spec = RunAll(f, prompts, o);
    if (!spec.ok()) return fail(spec.status());
    const bool same = spec->outputs == plain->outputs;
    identical &= same;
    const double tps = spec->tokens / spec->seconds;
    const double measured =
        spec->stats.spec_draft_tokens > 0
            ? static_cast<double>(spec->stats.spec_accepted_tokens) / spec->stats.spec_draft_tokens
            : 0;
    const std::string name = absl::StrCat("a=", a);
    std::printf("%-10s %10.1f %8.2f %12.3f %12.3f %12s\n", name.c_str(), tps, tps / plain_tps,
                measured, static_cast<double>(spec->stats.steps) / spec->tokens,
                same ? "identical" : "DIFFERENT");
    runs.push_back({{"acceptance_set", a},
                    {"acceptance_measured", measured},
                    {"tokens_per_s", tps},
                    {"speedup", tps / plain_tps},
                    {"steps", spec->stats.steps},
                    {"draft_tokens", spec->stats.spec_draft_tokens},
                    {"accepted_tokens", spec->stats.spec_accepted_tokens},
                    {"verifications", spec->stats.spec_verifications},
                    {"identical_to_plain", same}});
  }
  out["speculative"] = runs;
  if (!f.json_path.empty()) {
    std::ofstream(f.json_path) << out.dump(2) << "\n";
  }
  if (!identical) {
    std::fprintf(stderr, "spec_e2e_bench: speculative outputs differ from plain decoding\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Flags f;
  CLI::App app{"The engine end to end with speculative decoding at a controlled acceptance rate"};
  app.add_option("--model", f.model_dir, "Hugging Face model directory")->required();
  app.add_option("--device", f.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--requests", f.requests, "Prompts")->check(CLI::Range(1, 100000));
  app.add_option("--concurrency", f.concurrency, "Requests in flight (the batch)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--prompt-len", f.prompt_len, "Prompt tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--output-len", f.output_len, "Output tokens")->check(CLI::Range(2, 1 << 20));
  app.add_option("--k", f.k, "Most drafts per step (adaptive below it)")->check(CLI::Range(1, 64));
  app.add_option("--acceptance", f.acceptance, "Acceptance rates to run")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--kv-cache-mib", f.kv_cache_mib, "KV cache")->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", f.seed, "Prompts and draft decisions");
  app.add_option("--json", f.json_path, "Write every number here");
  app.add_flag("--check-batching", f.check_batching,
               "Also run plain decoding with every request at once and count the outputs that "
               "equal the one-at-a-time (or --concurrency) run");
  CLI11_PARSE(app, argc, argv);
  return tandem::Run(f);
}
