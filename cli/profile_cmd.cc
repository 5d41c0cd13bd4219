// `tandem profile`: measures what one worker's device can do (docs/planning.md) and writes one
// JSON profile for `tandem plan`.
//   tandem profile --model DIR [--device cpu|cuda|cuda:N] [--kv-cache-mib M] [--block-size B]
//                  [--cuda-tuning KEY=VALUE,...]
//                  [--prompt-lens 16,64,...] [--batch-sizes 1,2,...] [--contexts 64,256,...]
//                  [--prefill-batch-prompts 2,4,8] [--prefill-batch-tokens 128]
//                  [--max-num-batched-tokens N] [--transfer-backend loopback|ucx|cma|none]
//                  [--repeats R] [--neighbours N] [--out FILE] [--no-progress]
// A progress bar goes to stderr (one line, redrawn); the profile goes to --out (default stdout).
//   tandem profile calibrate --profile FILE --metrics URL[,URL...] [--window-s S] [--min-steps N]
//                            [--min-prefill-chunks N] [--max-factor F] [--out FILE]
//                            [--no-progress]
// reads workers' /metrics over a window of load and writes the profile with its decode penalty
// and, when prefill workers (or aggregated ones) ran enough prefill-only steps, its prefill
// factor (planning/calibration.h, docs/planning.md).
// Exit status: 0 ok, 1 runtime error (model, device, measurement, scrape), 2 usage error.
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/serving/client.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "planning/calibration.h"
#include "planning/profiler.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/runner_factory.h"

namespace tandem::cli {
namespace {

struct ProfileFlags {
  std::string model_dir;
  std::string device = "cpu";
  std::string cuda_tuning;  // "": the default plan, as the worker's
  int kv_cache_mib = 256;
  int block_size = 16;
  std::string prompt_lens = "16,64,128,256,512,1024";
  std::string batch_sizes = "1,2,4,8,16,32";
  std::string contexts = "64,256,1024";
  int max_num_batched_tokens = 512;
  std::string prefill_batch_prompts = "2,4,8";  // "none": no batched prefill points
  int prefill_batch_tokens = 128;
  std::string transfer_backend = "loopback";
  int repeats = 5;
  int neighbours = 0;
  std::string out;
  bool no_progress = false;
};

absl::StatusOr<std::vector<int>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", piece, "' is not an integer (expected e.g. 1,2,4)"));
    }
    out.push_back(v);
  }
  return out;
}

// "[#####.....] 12/40 prefill 256 tokens", redrawn in place.
void DrawProgress(int done, int total, const std::string& what) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  std::cerr << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
            << done << "/" << total << " " << what << "\033[K" << std::flush;
  if (done == total) std::cerr << "\n";
}

// The profile as JSON to `path`, or to stdout when it is empty.
absl::Status WriteProfile(const planning::DeviceProfile& profile, const std::string& path) {
  const std::string text = planning::ProfileToJson(profile);
  if (path.empty()) {
    std::cout << text;
    return absl::OkStatus();
  }
  std::ofstream out(path);
  out << text;
  return out.good() ? absl::OkStatus()
                    : absl::UnavailableError(absl::StrCat("cannot write ", path));
}

int Run(const ProfileFlags& f) {
  const auto usage = [](const std::string& message) {
    std::cerr << "tandem profile: " << message << "\n";
    return 2;
  };
  if (f.model_dir.empty()) return usage("--model is required");
  planning::ProfilerOptions options;
  absl::StatusOr<std::vector<int>> lens = ParseList("--prompt-lens", f.prompt_lens);
  if (!lens.ok()) return usage(std::string(lens.status().message()));
  absl::StatusOr<std::vector<int>> batches = ParseList("--batch-sizes", f.batch_sizes);
  if (!batches.ok()) return usage(std::string(batches.status().message()));
  absl::StatusOr<std::vector<int>> contexts = ParseList("--contexts", f.contexts);
  if (!contexts.ok()) return usage(std::string(contexts.status().message()));
  if (f.prefill_batch_prompts != "none") {
    absl::StatusOr<std::vector<int>> prompts =
        ParseList("--prefill-batch-prompts", f.prefill_batch_prompts);
    if (!prompts.ok()) return usage(std::string(prompts.status().message()));
    options.prefill_batch_prompts = *prompts;
  } else {
    options.prefill_batch_prompts.clear();
  }
  options.prefill_batch_tokens = f.prefill_batch_tokens;
  options.prompt_lens = *lens;
  options.batch_sizes = *batches;
  options.contexts = *contexts;
  options.max_num_batched_tokens = f.max_num_batched_tokens;
  options.transfer_backend = f.transfer_backend;
  options.repeats = f.repeats;
  if (!ParseRunnerDevice(f.device).ok()) {
    return usage(absl::StrCat("--device: '", f.device, "' is not cpu, cuda or cuda:N"));
  }
  RunnerOptions runner_options;
  runner_options.block_size = f.block_size;
  runner_options.kv_cache_bytes = static_cast<size_t>(f.kv_cache_mib) << 20;
  // A batched prefill step holds more tokens than the engine's chunk budget (prefill workers
  // batch up to theirs, 8,192 by default): the runner is sized for the larger.
  int64_t batch_step = 0;
  for (int k : options.prefill_batch_prompts) {
    batch_step = std::max<int64_t>(batch_step, int64_t{k} * options.prefill_batch_tokens);
  }
  if (batch_step > 65536)
    return usage("--prefill-batch-prompts x --prefill-batch-tokens: over 65536");
  runner_options.max_batch_tokens =
      std::max(f.max_num_batched_tokens, static_cast<int>(batch_step));
  runner_options.progress = !f.no_progress;
  absl::StatusOr<CudaTuning> cuda_tuning = ParseCudaTuning(f.cuda_tuning);
  if (!cuda_tuning.ok()) return usage(std::string(cuda_tuning.status().message()));
  runner_options.cuda_tuning = *cuda_tuning;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(f.device, f.model_dir, runner_options);
  if (!runner.ok()) {
    std::cerr << "tandem profile: " << runner.status().message() << "\n";
    return 1;
  }
  std::vector<std::unique_ptr<ModelRunner>> neighbours;
  for (int i = 0; i < f.neighbours; ++i) {
    runner_options.progress = false;
    absl::StatusOr<std::unique_ptr<ModelRunner>> n =
        CreateModelRunner(f.device, f.model_dir, runner_options);
    if (!n.ok()) {
      std::cerr << "tandem profile: neighbour " << i + 1 << ": " << n.status().message() << "\n";
      return 1;
    }
    options.neighbours.push_back(n->get());
    neighbours.push_back(*std::move(n));
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planning::DeviceProfile> profile = planning::MeasureProfile(
      **runner, options, f.no_progress ? planning::ProfileProgress() : DrawProgress);
  if (!profile.ok()) {
    std::cerr << "\ntandem profile: " << profile.status().message() << "\n";
    return profile.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  profile->model = std::filesystem::path(f.model_dir).filename().string();
  if (profile->model.empty()) profile->model = f.model_dir;
  profile->device = f.device;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) {
    profile->host = absl::StrCat(host, ", ", std::thread::hardware_concurrency(), " cores");
  }
  profile->date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  if (absl::Status s = WriteProfile(*profile, f.out); !s.ok()) {
    std::cerr << "tandem profile: " << s.message() << "\n";
    return 1;
  }
  if (!f.no_progress) {
    std::cerr << "tandem profile: " << profile->prefill.size() << " prefill, "
              << profile->decode.size() << " decode and " << profile->transfer.size()
              << " transfer points in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << " s; KV capacity " << profile->kv_capacity_tokens << " tokens"
              << (f.out.empty() ? "" : absl::StrCat("; wrote ", f.out)) << "\n";
  }
  return 0;
}

struct CalibrateFlags {
  std::string profile;
  std::string metrics;
  double window_s = 60;
  int64_t min_steps = 200;
  int64_t min_prefill_chunks = 50;
  double max_factor = 4;
  std::string out;
  bool no_progress = false;
};

struct MetricsSource {
  std::string url;
  bench::ParsedUrl parsed;
  std::string path;
};

absl::StatusOr<planning::EngineCounters> Scrape(const MetricsSource& m) {
  absl::StatusOr<std::string> body =
      bench::HttpGet(m.parsed.host, m.parsed.port, m.path, /*timeout_s=*/10);
  if (!body.ok()) return body.status();
  absl::StatusOr<planning::EngineCounters> c = planning::ParseEngineCounters(*body);
  if (!c.ok())
    return absl::Status(c.status().code(), absl::StrCat(m.url, ": ", c.status().message()));
  return c;
}

int RunCalibrate(const CalibrateFlags& f) {
  const auto usage = [](const std::string& message) {
    std::cerr << "tandem profile calibrate: " << message << "\n";
    return 2;
  };
  const auto fail = [](const absl::Status& s) {
    std::cerr << "\ntandem profile calibrate: " << s.message() << "\n";
    return 1;
  };
  absl::StatusOr<planning::DeviceProfile> profile = planning::LoadProfile(f.profile);
  if (!profile.ok()) return usage(std::string(profile.status().message()));
  std::vector<MetricsSource> sources;
  for (absl::string_view url : absl::StrSplit(f.metrics, ',', absl::SkipWhitespace())) {
    MetricsSource m;
    m.url = std::string(absl::StripAsciiWhitespace(url));
    absl::StatusOr<bench::ParsedUrl> parsed = bench::ParseUrl(m.url);
    if (!parsed.ok()) return usage(absl::StrCat("--metrics: ", parsed.status().message()));
    m.parsed = *parsed;
    m.path = m.parsed.base_path.empty() ? "/metrics" : m.parsed.base_path;
    sources.push_back(std::move(m));
  }
  if (sources.empty()) return usage("--metrics: no URL");
  std::vector<planning::EngineCounters> before;
  for (const MetricsSource& m : sources) {
    absl::StatusOr<planning::EngineCounters> c = Scrape(m);
    if (!c.ok()) return fail(c.status());
    before.push_back(*c);
  }
  // The window, with a scrape every few seconds for the progress line (and to fail early when
  // a worker goes away).
  const absl::Time start = absl::Now();
  const absl::Duration window = absl::Seconds(f.window_s);
  std::vector<planning::EngineCounters> windows(sources.size());
  for (;;) {
    const absl::Duration left = window - (absl::Now() - start);
    if (left > absl::ZeroDuration()) absl::SleepFor(std::min(left, absl::Seconds(5)));
    double steps = 0, sequences = 0, prefill_steps = 0;
    for (size_t i = 0; i < sources.size(); ++i) {
      absl::StatusOr<planning::EngineCounters> c = Scrape(sources[i]);
      if (!c.ok()) return fail(c.status());
      absl::StatusOr<planning::EngineCounters> w = planning::CounterWindow(before[i], *c);
      if (!w.ok())
        return fail(absl::Status(w.status().code(),
                                 absl::StrCat(sources[i].url, ": ", w.status().message())));
      windows[i] = *w;
      steps += w->steps;
      sequences += w->sequences;
      prefill_steps += w->prefill_steps;
    }
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    if (!f.no_progress) {
      std::cerr << "\rcalibrating: " << static_cast<int>(std::min(elapsed, f.window_s)) << "/"
                << f.window_s << " s, " << static_cast<int64_t>(steps)
                << " decode steps, mean batch " << (steps > 0 ? sequences / steps : 0.0) << ", "
                << static_cast<int64_t>(prefill_steps) << " prefill steps\033[K" << std::flush;
    }
    if (elapsed >= f.window_s) break;
  }
  if (!f.no_progress) std::cerr << "\n";
  planning::CalibrationOptions options;
  options.min_steps = f.min_steps;
  options.min_prefill_chunks = f.min_prefill_chunks;
  options.max_factor = f.max_factor;
  absl::StatusOr<planning::DecodeCalibration> c =
      planning::CalibrateDecode(*profile, windows, options);
  if (!c.ok()) return fail(c.status());
  profile->calibration = *c;
  // Prefill is calibrated when the window holds enough prefill-only steps (FailedPrecondition:
  // too few; the models were checked above); otherwise the profile's prefill calibration stays
  // as it was, and the line says why.
  absl::StatusOr<planning::PrefillCalibration> pc =
      planning::CalibratePrefill(*profile, windows, options);
  if (pc.ok()) {
    profile->prefill_calibration = *pc;
  } else if (pc.status().code() != absl::StatusCode::kFailedPrecondition) {
    return fail(pc.status());
  }
  if (absl::Status s = WriteProfile(*profile, f.out); !s.ok()) return fail(s);
  std::cerr << "tandem profile calibrate: " << c->steps << " decode steps on " << c->workers
            << " worker(s) at mean batch " << c->batch << ", context " << c->context << ": served "
            << c->served_step_ms << " ms a step forward, profiled " << c->profiled_step_ms
            << " ms; decode penalty " << c->penalty_ms << " ms a step; beyond the forward pass "
            << c->step_overhead_ms << " ms a step (of which " << c->gap_ms
            << " ms between iterations)\n";
  if (pc.ok()) {
    std::cerr << "tandem profile calibrate: " << pc->steps << " prefill steps on " << pc->workers
              << " worker(s) at " << pc->chunks_per_step << " chunks a step of mean "
              << pc->chunk_tokens << " tokens after " << pc->cached_tokens << " cached: served "
              << pc->served_step_ms << " ms a step forward, profiled " << pc->profiled_step_ms
              << " ms; prefill factor " << pc->factor << "; beyond the forward pass "
              << pc->step_overhead_ms << " ms a step\n";
  } else {
    std::cerr << "tandem profile calibrate: prefill not calibrated (" << pc.status().message()
              << "); the profile's prefill calibration is unchanged\n";
  }
  if (!f.out.empty()) std::cerr << "tandem profile calibrate: wrote " << f.out << "\n";
  return 0;
}

}  // namespace

void AddProfileCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<ProfileFlags>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Measure a worker's device (prefill, decode, KV capacity, KV transfer) for "
      "`tandem plan`");
  cmd->add_option("--model", flags->model_dir, "Model directory (required unless calibrating)");
  cmd->add_option("--device", flags->device, "cpu, cuda or cuda:N")->capture_default_str();
  AddCudaTuningFlag(cmd, &flags->cuda_tuning);
  cmd->add_option("--kv-cache-mib", flags->kv_cache_mib, "KV cache size in MiB, as the worker's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "Tokens per KV block, as the worker's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prompt-lens", flags->prompt_lens, "Prompt lengths to prefill (ascending)")
      ->capture_default_str();
  cmd->add_option("--batch-sizes", flags->batch_sizes, "Decode batch sizes (ascending)")
      ->capture_default_str();
  cmd->add_option("--contexts", flags->contexts, "Decode contexts in tokens (ascending)")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "The engine's step token budget (prefill chunk size)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prefill-batch-prompts", flags->prefill_batch_prompts,
                  "Prompts per step of the batched prefill points (ascending, each >= 2; none: "
                  "no such points)")
      ->capture_default_str();
  cmd->add_option("--prefill-batch-tokens", flags->prefill_batch_tokens,
                  "Tokens of each prompt of the batched prefill points")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--transfer-backend", flags->transfer_backend,
                  "KV transfer backend measured in-process: loopback, ucx, cma, or none")
      ->capture_default_str();
  cmd->add_option("--repeats", flags->repeats, "Timed runs per point (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--neighbours", flags->neighbours,
                  "Other runners of the model measuring the same points alongside, as the other "
                  "workers of a full host would (each loads the model and a cache)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--out", flags->out, "Write the profile here (default: stdout)");
  cmd->add_flag("--no-progress", flags->no_progress, "No progress bar on stderr");
  auto calibrate_flags = std::make_shared<CalibrateFlags>();
  CLI::App* calibrate = cmd->add_subcommand(
      "calibrate",
      "Scale a profile's decode steps to a live deployment's, from its decode workers' /metrics "
      "over a window of load");
  calibrate->add_option("--profile", calibrate_flags->profile, "The profile to calibrate")
      ->required();
  calibrate
      ->add_option("--metrics", calibrate_flags->metrics,
                   "Workers' metrics URLs, comma-separated (http://HOST:PORT, path /metrics by "
                   "default): decode or aggregated workers, and prefill workers to calibrate "
                   "prefill too")
      ->required();
  calibrate->add_option("--window-s", calibrate_flags->window_s, "Seconds of load to read")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  calibrate
      ->add_option("--min-steps", calibrate_flags->min_steps,
                   "Decode-only steps the window must hold, over every worker")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  calibrate
      ->add_option("--min-prefill-chunks", calibrate_flags->min_prefill_chunks,
                   "Prompt chunks of prefill-only steps the window must hold to calibrate prefill")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  calibrate
      ->add_option("--max-factor", calibrate_flags->max_factor,
                   "Refuse a factor above this or below its inverse (a wrong profile, not load)")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  calibrate->add_option("--out", calibrate_flags->out,
                        "Write the calibrated profile here (default: stdout)");
  calibrate->add_flag("--no-progress", calibrate_flags->no_progress, "No progress line on stderr");
  calibrate->callback(
      [calibrate_flags, exit_code] { *exit_code = RunCalibrate(*calibrate_flags); });
  cmd->callback([flags, exit_code, calibrate] {
    if (calibrate->parsed()) return;
    *exit_code = Run(*flags);
  });
}

}  // namespace tandem::cli
