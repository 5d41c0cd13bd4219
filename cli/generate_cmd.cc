// `tandem generate`: one prompt through the engine on this machine (debugging, reference checks,
// an interactive demo).
//   tandem generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
//                   [--temperature T] [--seed S] [--top-k K] [--top-p P] [--ignore-eos]
//                   [--device cpu|cuda|cuda:N] [--cuda-tuning KEY=VALUE,...] [--json]
// Without --json the text streams to stdout as it is generated, then a stats line goes to stderr.
// With --json one object is printed: {"token_ids": [...], "text": "...", "finish_reason": "..."}.
// Exit status: 0 ok, 1 runtime error (model load, engine), 2 usage error (flags, bad prompt).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/runner_factory.h"
#include "runtime/model/tokenizer.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;

// A generation that makes no progress for this long is reported as an error.
constexpr absl::Duration kStallTimeout = absl::Seconds(300);

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string prompt_ids;
  int max_tokens = 64;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int top_k = 0;
  float top_p = 1.0f;
  bool ignore_eos = false;
  std::string device = "cpu";
  std::string cuda_tuning;  // "": the default plan
  bool json_output = false;
  bool has_prompt = false;
  bool has_prompt_ids = false;
  bool has_seed = false;
};

// An error with the exit status it maps to.
struct Failure {
  int exit_code;
  std::string message;
};

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int32_t id;
    if (piece.empty() || !absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", piece, "' is not a token id (expected e.g. 1,2,3)"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The final state of the one request, filled by the engine thread.
struct Progress {
  absl::Mutex mu;
  std::vector<int32_t> ids ABSL_GUARDED_BY(mu);
  std::string text ABSL_GUARDED_BY(mu);
  std::optional<FinishReason> finish ABSL_GUARDED_BY(mu);
  absl::Status error ABSL_GUARDED_BY(mu);
  Usage usage ABSL_GUARDED_BY(mu);
  std::optional<absl::Time> first_token_at ABSL_GUARDED_BY(mu);
};

std::optional<Failure> Run(const GenerateOptions& opts) {
  if (opts.has_prompt == opts.has_prompt_ids) {
    return Failure{2, "give exactly one of --prompt TEXT or --prompt-ids 1,2,3"};
  }
  if (!ParseRunnerDevice(opts.device).ok()) {
    return Failure{2,
                   absl::StrCat("--device: unknown device '", opts.device, "' (cpu|cuda|cuda:N)")};
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(opts.model_dir, ec)) {
    return Failure{2, absl::StrCat("--model: '", opts.model_dir, "' is not a directory")};
  }
  std::vector<int32_t> prompt;
  if (opts.has_prompt_ids) {
    auto ids = ParseIds(opts.prompt_ids);
    if (!ids.ok()) return Failure{2, std::string(ids.status().message())};
    prompt = std::move(*ids);
  }

  // Tokenizer: required for --prompt; for --prompt-ids it only provides the text.
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto tok = Tokenizer::FromModelDir(opts.model_dir); tok.ok()) {
    tokenizer = std::move(*tok);
  } else if (opts.has_prompt) {
    return Failure{1, std::string(tok.status().message())};
  } else {
    std::cerr << "tandem generate: no usable tokenizer (" << tok.status().message()
              << "); printing token ids only\n";
  }
  if (opts.has_prompt) prompt = tokenizer->Encode(opts.prompt, /*add_special_tokens=*/true);

  RunnerOptions runner_options;
  runner_options.progress = !opts.json_output;
  absl::StatusOr<CudaTuning> cuda_tuning = ParseCudaTuning(opts.cuda_tuning);
  if (!cuda_tuning.ok()) return Failure{2, std::string(cuda_tuning.status().message())};
  runner_options.cuda_tuning = *cuda_tuning;
  auto runner = CreateModelRunner(opts.device, opts.model_dir, runner_options);
  if (!runner.ok()) return Failure{1, std::string(runner.status().message())};

  Progress progress;  // declared before the engine: its callback outlives no request
  EngineOptions engine_options;
  engine_options.max_num_seqs = 1;
  auto engine = Engine::Create(std::move(*runner), tokenizer.get(), engine_options);
  if (!engine.ok()) return Failure{1, std::string(engine.status().message())};

  GenerateRequest request;
  request.request_id = "generate";
  request.prompt_token_ids = prompt;
  request.params.temperature = opts.temperature;
  request.params.top_k = opts.top_k;
  request.params.top_p = opts.top_p;
  request.params.max_tokens = opts.max_tokens;
  request.params.ignore_eos = opts.ignore_eos;
  if (opts.has_seed) request.params.seed = opts.seed;
  const bool stream = !opts.json_output;
  request.on_output = [&progress, stream](const GenerationOutput& out) {
    if (stream && !out.text.empty()) std::cout << out.text << std::flush;
    absl::MutexLock lock(&progress.mu);
    if (!progress.first_token_at.has_value() && !out.token_ids.empty()) {
      progress.first_token_at = absl::Now();
    }
    progress.ids.insert(progress.ids.end(), out.token_ids.begin(), out.token_ids.end());
    progress.text += out.text;
    progress.usage = out.usage;
    if (out.finish_reason.has_value()) {
      progress.finish = out.finish_reason;
      progress.error = out.error;
    }
  };
  const absl::Time start = absl::Now();
  if (absl::Status s = (*engine)->Submit(std::move(request)); !s.ok()) {
    return Failure{2, std::string(s.message())};
  }

  {
    absl::MutexLock lock(&progress.mu);
    size_t seen = 0;
    auto done = [&progress]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) {
      return progress.finish.has_value();
    };
    while (!done()) {
      if (!progress.mu.AwaitWithTimeout(absl::Condition(&done), kStallTimeout) &&
          progress.ids.size() == seen) {
        progress.mu.Unlock();
        (*engine)->Shutdown(absl::ZeroDuration());
        progress.mu.Lock();
        return Failure{
            1, absl::StrCat("no token for ", absl::FormatDuration(kStallTimeout), "; giving up")};
      }
      seen = progress.ids.size();
    }
  }
  const absl::Time end = absl::Now();
  (*engine)->Shutdown(absl::Seconds(1));

  absl::MutexLock lock(&progress.mu);
  if (*progress.finish == FinishReason::kError) {
    return Failure{1, absl::StrCat("generation failed: ", progress.error.message())};
  }
  if (opts.json_output) {
    json out = {{"token_ids", progress.ids},
                {"text", progress.text},
                {"finish_reason", FinishReasonName(*progress.finish)}};
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n" << std::flush;
  } else {
    std::cout << "\n" << std::flush;
  }
  const double seconds = absl::ToDoubleSeconds(end - start);
  const double decode_seconds = progress.first_token_at.has_value()
                                    ? absl::ToDoubleSeconds(end - *progress.first_token_at)
                                    : 0.0;
  const int generated = progress.usage.completion_tokens;
  std::cerr << absl::StrFormat(
      "tandem generate: %d prompt tokens, %d generated tokens (%s) in %.2f s: %.1f tokens/s "
      "overall, %.1f tokens/s after the first token\n",
      progress.usage.prompt_tokens, generated, FinishReasonName(*progress.finish), seconds,
      seconds > 0 ? generated / seconds : 0.0,
      decode_seconds > 0 && generated > 1 ? (generated - 1) / decode_seconds : 0.0);
  return std::nullopt;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate a continuation of one prompt with the engine on this machine");
  cmd->add_option("--model", opts->model_dir, "Hugging Face model directory")->required();
  CLI::Option* prompt =
      cmd->add_option("--prompt", opts->prompt, "prompt text (encoded with BOS, as HF does)");
  CLI::Option* prompt_ids = cmd->add_option("--prompt-ids", opts->prompt_ids,
                                            "comma-separated prompt token ids (no special tokens)");
  cmd->add_option("--max-tokens", opts->max_tokens, "tokens to generate at most (default 64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", opts->temperature, "sampling temperature (default 0: greedy)");
  CLI::Option* seed = cmd->add_option("--seed", opts->seed, "sampling seed");
  cmd->add_option("--top-k", opts->top_k, "sample from the K most likely tokens (0: off)");
  cmd->add_option("--top-p", opts->top_p, "nucleus sampling mass (1: off)");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating past the EOS token");
  cmd->add_option("--device", opts->device, "cpu, cuda or cuda:N (default cpu)");
  AddCudaTuningFlag(cmd, &opts->cuda_tuning);
  cmd->add_flag("--json", opts->json_output,
                "print one JSON object {\"token_ids\": [...], \"text\": \"...\"} at the end");
  cmd->callback([opts, prompt, prompt_ids, seed, exit_code] {
    opts->has_prompt = prompt->count() > 0;
    opts->has_prompt_ids = prompt_ids->count() > 0;
    opts->has_seed = seed->count() > 0;
    std::optional<Failure> failure = Run(*opts);
    if (failure.has_value()) {
      std::cerr << "tandem generate: " << failure->message << "\n";
      *exit_code = failure->exit_code;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tandem::cli
