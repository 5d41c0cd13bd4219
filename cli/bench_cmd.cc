// `tandem bench`: load generator for any OpenAI-compatible endpoint (flags named as vLLM's
// benchmark_serving). The work is done by bench/serving/ (tandem_bench_client); this file parses
// flags, builds the workload, handles Ctrl-C and the progress bar, and writes the outputs.
//
//   tandem bench --url http://HOST:PORT/v1 [--model NAME] [--endpoint chat|completions]
//                [--request-rate R|inf] [--arrival poisson|constant] [--max-concurrency C]
//                [--num-prompts N] [--input-len L] [--output-len L] [--range-ratio X]
//                [--dataset FILE.jsonl] [--tokenizer DIR] [--seed S] [--warmup N]
//                [--duration S] [--request-timeout S] [--slo ttft=MS,tpot=MS]
//                [--json FILE] [--plot FILE.svg] [--rates 1,2,4,8] [--extra-body JSON]
//
// Exit status: 0 when the run finished (request failures are results, shown in the summary), 1 on
// a runtime error (unreachable host, unreadable dataset, unwritable output), 2 on bad flags,
// 130 when stopped by Ctrl-C (after printing the summary of what finished). A second Ctrl-C
// exits at once.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/serving/client.h"
#include "bench/serving/plot.h"
#include "bench/serving/report.h"
#include "bench/serving/stats.h"
#include "bench/serving/workload.h"
#include "cli/commands.h"
#include "runtime/model/tokenizer.h"

namespace tandem::cli {
namespace {

using bench::LoadOptions;

struct BenchFlags {
  std::string url = "http://127.0.0.1:8000/v1";
  std::string model;
  std::string endpoint = "chat";
  std::string request_rate = "inf";
  std::string arrival = "poisson";
  int max_concurrency = 0;
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0;
  int prefix_groups = 0;
  int prefix_len = 0;
  std::string dataset;
  std::string tokenizer;
  uint64_t seed = 0;
  int warmup = 0;
  double duration_s = 0;
  double request_timeout_s = 600;
  std::string slo;
  std::string json_path;
  std::string plot_path;
  std::string rates;
  std::string api_key;
  bool ignore_eos = false;
  double temperature = 0;
  std::string extra_body;
  bool no_progress = false;
  bool num_prompts_given = false;
};

std::atomic<bool> g_interrupted{false};

void OnSigint(int) {
  if (g_interrupted.exchange(true)) _exit(130);  // second Ctrl-C: leave now
}

absl::StatusOr<double> ParseRate(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "inf") return std::numeric_limits<double>::infinity();
  double r = 0;
  if (!absl::SimpleAtod(text, &r) || !(r > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request rate must be a positive number or 'inf', got '", text, "'"));
  }
  return r;
}

std::string Now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// "out.svg" -> "out-rate4.svg" for sweep runs.
std::string WithRate(const std::string& path, double rate) {
  const std::string tag = std::isinf(rate) ? "inf" : absl::StrFormat("%g", rate);
  const size_t dot = path.rfind('.');
  const size_t slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return absl::StrCat(path, "-rate", tag);
  }
  return absl::StrCat(path.substr(0, dot), "-rate", tag, path.substr(dot));
}

// Draws a progress bar on a terminal; elsewhere prints a line every 10 s.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

  void Update(const bench::Progress& p) {
    if (!enabled_) return;
    std::string done;
    double frac = 0;
    if (p.total > 0) {
      frac = static_cast<double>(p.finished) / p.total;
      done = absl::StrCat(p.finished, "/", p.total);
    } else {
      done = absl::StrCat(p.finished);
    }
    if (p.duration_s > 0) frac = std::max(frac, std::min(1.0, p.elapsed_s / p.duration_s));
    const std::string text = absl::StrFormat("%s req  in flight %d  failed %d  %.1f s", done,
                                             p.in_flight, p.failed, p.elapsed_s);
    if (tty_) {
      const int width = 30;
      const int fill = static_cast<int>(frac * width);
      std::string bar = absl::StrCat("\r[", std::string(fill, '#'), std::string(width - fill, ' '),
                                     "] ", text, "   ");
      std::fputs(bar.c_str(), stderr);
      drawn_ = true;
    } else if (p.elapsed_s >= next_line_s_) {
      next_line_s_ = p.elapsed_s + 10;
      std::fprintf(stderr, "progress: %s\n", text.c_str());
    }
    std::fflush(stderr);
  }
  void End() {
    if (drawn_) std::fputs("\n", stderr);
    drawn_ = false;
    next_line_s_ = 0;
  }

 private:
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  double next_line_s_ = 0;
};

// Each stream holds a socket: lift the soft open-file limit to the hard one (often 1024 vs more).
void RaiseFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int Run(BenchFlags flags) {
  auto fail = [](absl::string_view message, int code) {
    std::cerr << "tandem bench: " << message << "\n";
    return code;
  };
  // Validate everything before sending anything.
  std::vector<double> rates;
  if (!flags.rates.empty()) {
    for (absl::string_view r : absl::StrSplit(flags.rates, ',', absl::SkipWhitespace())) {
      absl::StatusOr<double> rate = ParseRate(r);
      if (!rate.ok()) return fail(absl::StrCat("--rates: ", rate.status().message()), 2);
      rates.push_back(*rate);
    }
    if (rates.empty()) return fail("--rates: no rate given", 2);
  } else {
    absl::StatusOr<double> rate = ParseRate(flags.request_rate);
    if (!rate.ok()) return fail(absl::StrCat("--request-rate: ", rate.status().message()), 2);
    rates.push_back(*rate);
  }
  bench::Slo slo;
  if (!flags.slo.empty()) {
    absl::StatusOr<bench::Slo> parsed = bench::ParseSlo(flags.slo);
    if (!parsed.ok()) return fail(parsed.status().message(), 2);
    slo = *parsed;
  }
  absl::StatusOr<bench::ParsedUrl> url = bench::ParseUrl(flags.url);
  if (!url.ok()) return fail(absl::StrCat("--url: ", url.status().message()), 2);
  if (flags.api_key.empty()) {
    if (const char* key = std::getenv("OPENAI_API_KEY")) flags.api_key = key;
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (!flags.tokenizer.empty()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromModelDir(flags.tokenizer);
    if (!t.ok()) return fail(t.status().ToString(), 1);
    tokenizer = *std::move(t);
  }
  // --duration alone runs until the time is up; --num-prompts (default 1000) bounds it otherwise.
  const bool count_given =
      flags.num_prompts > 0 && (flags.num_prompts_given || !(flags.duration_s > 0));
  std::vector<bench::WorkItem> items;
  if (!flags.dataset.empty()) {
    absl::StatusOr<std::vector<bench::WorkItem>> loaded =
        bench::LoadDataset(flags.dataset, flags.output_len, tokenizer.get());
    if (!loaded.ok()) return fail(loaded.status().ToString(), 1);
    items = *std::move(loaded);
  } else {
    bench::SyntheticSpec spec;
    // With only --duration, a pool of prompts is cycled.
    spec.num_prompts = count_given ? flags.num_prompts : 1000;
    spec.input_len = flags.input_len;
    spec.output_len = flags.output_len;
    spec.range_ratio = flags.range_ratio;
    spec.seed = flags.seed;
    spec.prefix_groups = flags.prefix_groups;
    spec.prefix_len = flags.prefix_len;
    items = bench::SyntheticWorkload(spec, tokenizer.get());
  }

  if (flags.model.empty()) {
    absl::StatusOr<std::string> model = bench::FetchFirstModel(flags.url, flags.api_key, 30);
    if (!model.ok()) {
      return fail(absl::StrCat("no --model given and ", model.status().message()), 1);
    }
    flags.model = *model;
  }

  LoadOptions options;
  options.url = flags.url;
  options.model = flags.model;
  options.endpoint =
      flags.endpoint == "chat" ? bench::ApiEndpoint::kChat : bench::ApiEndpoint::kCompletions;
  options.api_key = flags.api_key;
  options.ignore_eos = flags.ignore_eos;
  options.temperature = flags.temperature;
  options.extra_body = flags.extra_body;
  options.arrival =
      flags.arrival == "constant" ? bench::Arrival::kConstant : bench::Arrival::kPoisson;
  options.seed = flags.seed;
  options.max_concurrency = flags.max_concurrency;
  options.request_timeout_s = flags.request_timeout_s;

  struct sigaction sa {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct Restore {
    struct sigaction i, t;
    ~Restore() {
      sigaction(SIGINT, &i, nullptr);
      sigaction(SIGTERM, &t, nullptr);
    }
  } restore{old_int, old_term};

  RaiseFileLimit();
  ProgressBar bar(!flags.no_progress);
  auto on_progress = [&bar](const bench::Progress& p) { bar.Update(p); };

  if (flags.warmup > 0) {
    LoadOptions warm = options;
    warm.request_rate = std::numeric_limits<double>::infinity();
    warm.num_requests = flags.warmup;
    warm.duration_s = 0;
    std::cerr << "warming up with " << flags.warmup << " requests\n";
    absl::StatusOr<bench::LoadResult> w = bench::RunLoad(warm, items, &g_interrupted, on_progress);
    bar.End();
    if (!w.ok()) return fail(w.status().ToString(), 1);
    int failed = 0;
    for (const auto& r : w->records) failed += r.ok() ? 0 : 1;
    if (failed > 0) std::cerr << "warmup: " << failed << " requests failed\n";
  }

  const bool sweep = !flags.rates.empty();
  std::vector<std::string> run_jsons;
  bool interrupted = g_interrupted.load();
  if (sweep) std::cout << bench::SweepHeader() << std::flush;
  for (double rate : rates) {
    if (interrupted) break;
    options.request_rate = rate;
    options.num_requests = count_given ? flags.num_prompts : 0;
    options.duration_s = flags.duration_s;
    if (options.num_requests == 0 && !(options.duration_s > 0)) {
      options.num_requests = static_cast<int>(items.size());
    }
    absl::StatusOr<bench::LoadResult> result =
        bench::RunLoad(options, items, &g_interrupted, on_progress);
    bar.End();
    if (!result.ok()) {
      return fail(result.status().message(), absl::IsInvalidArgument(result.status()) ? 2 : 1);
    }
    interrupted = result->interrupted;

    bench::RunInfo info;
    info.backend = options.endpoint == bench::ApiEndpoint::kChat ? "openai-chat" : "openai";
    info.model = flags.model;
    info.url = flags.url;
    info.date = Now();
    info.request_rate = rate;
    info.arrival = flags.arrival;
    info.max_concurrency = flags.max_concurrency;
    info.num_prompts = options.num_requests;
    info.duration_limit_s = flags.duration_s;
    info.seed = flags.seed;
    info.slo = slo;
    info.max_concurrent = result->max_concurrent;
    info.interrupted = result->interrupted;
    const bench::Summary summary = bench::Summarize(result->records, result->duration_s, slo);
    if (sweep) {
      std::cout << bench::SweepLine(info, summary) << std::flush;
    } else {
      std::cout << bench::FormatSummary(info, summary) << std::flush;
    }
    if (!flags.json_path.empty()) {
      run_jsons.push_back(bench::ResultJson(info, summary, result->records));
    }
    if (!flags.plot_path.empty()) {
      const std::string path = sweep ? WithRate(flags.plot_path, rate) : flags.plot_path;
      const std::string title =
          absl::StrCat("tandem bench: ", flags.model, " at ", flags.url, ", rate ",
                       std::isinf(rate) ? "inf" : absl::StrFormat("%g", rate), " req/s");
      if (absl::Status s = WriteFile(path, bench::RenderSvg(result->records, title)); !s.ok()) {
        return fail(s.message(), 1);
      }
    }
  }
  if (!flags.json_path.empty() && !run_jsons.empty()) {
    const std::string text = sweep ? bench::SweepJson(run_jsons) : run_jsons.front();
    if (absl::Status s = WriteFile(flags.json_path, text); !s.ok()) return fail(s.message(), 1);
  }
  if (interrupted) {
    std::cerr << "tandem bench: interrupted; the summary covers the requests that finished\n";
    return 130;
  }
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Load-test an OpenAI-compatible endpoint (TTFT, ITL, TPOT, throughput, goodput)");
  cmd->add_option("--url,--base-url", flags->url, "Endpoint base URL, e.g. http://HOST:PORT/v1")
      ->capture_default_str();
  cmd->add_option("--model", flags->model, "Model name (default: first of GET /models)");
  cmd->add_option("--endpoint", flags->endpoint, "API to call")
      ->check(CLI::IsMember({"chat", "completions"}))
      ->capture_default_str();
  cmd->add_option("--request-rate", flags->request_rate, "Requests/s, or inf for a burst")
      ->capture_default_str();
  cmd->add_option("--arrival", flags->arrival, "Arrival process")
      ->check(CLI::IsMember({"poisson", "constant"}))
      ->capture_default_str();
  cmd->add_option("--max-concurrency", flags->max_concurrency,
                  "Most requests in flight (0: unlimited)")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* num_prompts = cmd->add_option("--num-prompts", flags->num_prompts,
                                             "Requests to send (0 with --duration: no count limit)")
                                 ->check(CLI::NonNegativeNumber)
                                 ->capture_default_str();
  cmd->add_option("--input-len", flags->input_len, "Synthetic prompt length in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--output-len", flags->output_len, "max_tokens per request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--range-ratio", flags->range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--shared-prefix-groups", flags->prefix_groups,
                  "Synthetic prompts share one of this many random prefixes (round-robin over "
                  "prompts, then shuffled)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shared-prefix-len", flags->prefix_len,
                  "Length of each shared prefix in tokens; prompts are prefix + --input-len")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dataset", flags->dataset,
                  "JSONL file: {\"prompt\": ..., \"output_len\": N} per line");
  cmd->add_option("--tokenizer", flags->tokenizer,
                  "Model directory whose tokenizer makes prompts of exact token length");
  cmd->add_option("--seed", flags->seed)->capture_default_str();
  cmd->add_option("--warmup", flags->warmup, "Requests sent and discarded before measuring")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--duration", flags->duration_s, "Stop sending after this many seconds")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout", flags->request_timeout_s, "Deadline of each request (s)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--slo", flags->slo, "Goodput objectives, e.g. ttft=500,tpot=50 (ms)");
  cmd->add_option("--json", flags->json_path, "Write results (summary + per request) here");
  cmd->add_option("--plot", flags->plot_path, "Write latency CDFs and throughput as SVG here");
  cmd->add_option("--rates", flags->rates, "Sweep: comma-separated request rates");
  cmd->add_option("--api-key", flags->api_key, "Bearer token (default: $OPENAI_API_KEY)");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Ask the server to ignore EOS (vLLM extension)");
  cmd->add_option("--temperature", flags->temperature)->capture_default_str();
  cmd->add_option("--extra-body", flags->extra_body,
                  "JSON object merged into every request body, e.g. "
                  "'{\"response_format\": {\"type\": \"json_object\"}}'");
  cmd->add_flag("--no-progress", flags->no_progress, "No progress output on stderr");
  cmd->callback([flags, exit_code, num_prompts] {
    flags->num_prompts_given = num_prompts->count() > 0;
    *exit_code = Run(*flags);
  });
}

}  // namespace tandem::cli
