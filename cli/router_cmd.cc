// `tandem router`: the OpenAI HTTP frontend over the decode and prefill pools.
//   tandem router --model DIR [--port 8000] [--host 127.0.0.1] [--served-model-name NAME]
//                 [--chat-template FILE] [--generation-config auto|vllm|none|DIR]
//                 [--tool-call-parser auto|hermes|llama3_json|none]
//                 (--decode-workers H:P,... | --decode-dns NAME:PORT)
//                 [--prefill-workers H:P,...] [--prefill-dns NAME:PORT] [--dns-refresh-s 10]
//                 [--routing least-loaded|round-robin|kv-aware] [--local-prefill-threshold N]
//                 [--kv-aware-request-cost N] [--kv-aware-replicate-weight W]
//                 [--api-key KEY]... [--api-key-file FILE] [--allowed-host HOST]...
//                 (--service-token-file F | --tls-ca CA --tls-cert C --tls-key K |
//                  --insecure-services)
// The service flags (cli/access_flags.h) are required: they are what the router presents to
// every worker.
// With no prefill workers every prompt is prefilled on its decode worker (aggregated serving).
// Prints "tandem router: serving on http://HOST:PORT/v1 ..." to stdout once it accepts requests
// (after waiting up to --wait-ready-s for a healthy decode worker), then serves until SIGINT or
// SIGTERM, and stops cleanly. Exit status: 0 after a signal, 1 runtime error, 2 usage error.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "planning/online_planner.h"
#include "planning/profile.h"
#include "prometheus/registry.h"
#include "runtime/base/logging.h"
#include "runtime/metrics/metrics.h"
#include "runtime/router/access_policy.h"
#include "runtime/router/discovery.h"
#include "runtime/router/frontend.h"
#include "runtime/router/grpc_generation_backend.h"
#include "runtime/router/routing_policy.h"
#include "runtime/router/worker_pool.h"

namespace tandem::cli {
namespace {

struct RouterFlags {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  AccessFlags access;
  ServiceAuthFlags service_auth;
  std::string log_format = "text";
  double drain_seconds = 20;
  FrontendModelFlags frontend;
  std::string prefill_workers;
  std::string decode_workers;
  std::vector<std::string> prefill_dns;
  std::vector<std::string> decode_dns;
  double dns_refresh_s = 10;
  std::string routing = "kv-aware";
  int local_prefill_threshold = 0;
  double kv_aware_request_cost = router::KvAwareOptions{}.request_cost_tokens;
  double kv_aware_replicate_weight = router::KvAwareOptions{}.replicate_weight;
  int max_model_len = 0;
  double request_timeout_s = 0;
  int http_threads = 4;
  double http_idle_timeout_s = 75;
  double wait_ready_s = 10;
  // The online planner (docs/planning.md): recommended replicas from these profiles.
  std::string plan_profile;
  std::string plan_decode_profile;
  double plan_ttft_ms = 400, plan_tpot_ms = 25, plan_percentile = 90;
  int plan_max_workers = 16;
  double plan_interval_s = 15;
};

// Publishes the online planner's layout as the pools' recommended replicas (1 + 1 while idle).
void PublishPlan(planning::OnlinePlanner& planner, metrics::RouterMetrics& m,
                 planning::Layout* last) {
  const std::optional<planning::Recommendation> rec = planner.Recommend(absl::Now());
  const planning::Layout layout = rec.has_value() ? rec->layout : planning::Layout{1, 1, 0};
  m.pool_recommended_replicas.Add({{"pool", "prefill"}}).Set(layout.prefill);
  m.pool_recommended_replicas.Add({{"pool", "decode"}}).Set(layout.decode);
  if (layout.prefill != last->prefill || layout.decode != last->decode) {
    LOG(INFO) << "router: planner recommends " << layout.prefill << " prefill + " << layout.decode
              << " decode workers"
              << (rec.has_value()
                      ? absl::StrCat(
                            " for ", absl::StrFormat("%.2f", rec->rate),
                            " requests/s (predicted TTFT p90 ",
                            absl::StrFormat("%.0f", rec->at_rate.ttft_p90), " ms, TPOT p90 ",
                            absl::StrFormat("%.1f", rec->at_rate.tpot_p90), " ms",
                            rec->sustained ? "" : "; the SLOs are NOT met at the limit", ")")
                      : " (no traffic)");
    *last = layout;
  }
}

// Blocks until SIGINT or SIGTERM (blocked in every thread), or `timeout` passes; true on a signal.
bool WaitForSignal(const sigset_t& signals, absl::Duration timeout) {
  const int64_t ns = absl::ToInt64Nanoseconds(timeout);
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  return sigtimedwait(&signals, nullptr, &ts) > 0;
}

int RunRouter(const RouterFlags& flags) {
  ApplyLogFormat(flags.log_format);
  const auto usage = [](const std::string& message) {
    std::cerr << "tandem router: " << message << "\n";
    return 2;
  };
  // Every thread started from here on inherits the blocked mask; the main thread takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto policy = router::ParseRoutingPolicy(flags.routing);
  if (!policy.ok()) return usage(std::string(policy.status().message()));
  auto decode_static = router::ParseWorkerList(flags.decode_workers);
  if (!decode_static.ok()) return usage(std::string(decode_static.status().message()));
  auto prefill_static = router::ParseWorkerList(flags.prefill_workers);
  if (!prefill_static.ok()) return usage(std::string(prefill_static.status().message()));
  if (decode_static->empty() && flags.decode_dns.empty()) {
    return usage("no decode workers: give --decode-workers or --decode-dns");
  }
  const bool disaggregated = !prefill_static->empty() || !flags.prefill_dns.empty();
  auto identity = MakeServiceIdentity(flags.service_auth);
  if (!identity.ok()) return usage(std::string(identity.status().message()));

  router::WorkerPoolOptions decode_pool_options;
  decode_pool_options.role = "decode";
  decode_pool_options.identity = *identity;
  decode_pool_options.track_prefix_cache = *policy == router::RoutingPolicy::kKvAware;
  std::unique_ptr<planning::OnlinePlanner> planner;
  if (!flags.plan_profile.empty()) {
    absl::StatusOr<planning::DeviceProfile> prefill_profile =
        planning::LoadProfile(flags.plan_profile);
    if (!prefill_profile.ok()) return usage(std::string(prefill_profile.status().message()));
    absl::StatusOr<planning::DeviceProfile> decode_profile =
        flags.plan_decode_profile.empty() ? prefill_profile
                                          : planning::LoadProfile(flags.plan_decode_profile);
    if (!decode_profile.ok()) return usage(std::string(decode_profile.status().message()));
    planning::OnlinePlannerOptions plan_options;
    plan_options.slo = {flags.plan_ttft_ms, flags.plan_tpot_ms, flags.plan_percentile};
    plan_options.max_workers = flags.plan_max_workers;
    plan_options.limits.max_num_batched_tokens = prefill_profile->max_num_batched_tokens;
    planner =
        std::make_unique<planning::OnlinePlanner>(*prefill_profile, *decode_profile, plan_options);
    decode_pool_options.publish_recommended = false;
  }
  router::WorkerPool decode_pool(decode_pool_options);
  std::unique_ptr<router::WorkerPool> prefill_pool;
  if (disaggregated) {
    router::WorkerPoolOptions prefill_pool_options = decode_pool_options;
    prefill_pool_options.role = "prefill";
    prefill_pool = std::make_unique<router::WorkerPool>(prefill_pool_options);
  }
  router::GrpcBackendOptions backend_options;
  backend_options.policy = *policy;
  backend_options.local_prefill_threshold = flags.local_prefill_threshold;
  backend_options.kv_aware.request_cost_tokens = flags.kv_aware_request_cost;
  backend_options.kv_aware.replicate_weight = flags.kv_aware_replicate_weight;
  router::GrpcGenerationBackend backend(&decode_pool, prefill_pool.get(), backend_options);

  prometheus::Registry registry;
  router::RouterFrontendOptions frontend_options;
  frontend_options.http.host = flags.host;
  frontend_options.http.port = flags.port;
  frontend_options.http.num_threads = flags.http_threads;
  frontend_options.http.idle_timeout = absl::Seconds(flags.http_idle_timeout_s);
  if (planner != nullptr) {
    frontend_options.on_choice_done = [p = planner.get()](int prompt_tokens, int output_tokens) {
      p->Record(prompt_tokens, output_tokens, absl::Now());
    };
  }
  frontend_options.model_dir = flags.model_dir;
  frontend_options.served_model_name = flags.frontend.served_model_name;
  frontend_options.model_options.chat_template_file = flags.frontend.chat_template;
  frontend_options.model_options.generation_config = flags.frontend.generation_config;
  frontend_options.model_options.tool_call_parser = flags.frontend.tool_call_parser;
  frontend_options.max_model_len = flags.max_model_len;
  if (flags.request_timeout_s > 0) {
    frontend_options.request_timeout = absl::Seconds(flags.request_timeout_s);
  }
  frontend_options.access.api_keys = flags.access.api_keys;
  if (!flags.access.api_key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> keys =
        router::ReadApiKeyFile(flags.access.api_key_file);
    if (!keys.ok()) {
      std::cerr << "tandem router: " << keys.status().message() << "\n";
      return 2;
    }
    frontend_options.access.api_keys.insert(frontend_options.access.api_keys.end(), keys->begin(),
                                            keys->end());
  }
  frontend_options.access.allowed_hosts = flags.access.allowed_hosts;
  frontend_options.access.cors_origins = flags.access.cors_origins;
  auto frontend = router::RouterFrontend::Create(frontend_options, &backend, &registry);
  if (!frontend.ok()) {
    std::cerr << "tandem router: " << frontend.status().message() << "\n";
    return 1;
  }
  decode_pool.SetMetrics(&(*frontend)->metrics());
  if (prefill_pool != nullptr) prefill_pool->SetMetrics(&(*frontend)->metrics());
  backend.SetMetrics(&(*frontend)->metrics());

  const auto make_discovery =
      [&](const std::vector<std::string>& addresses, const std::vector<std::string>& dns,
          router::WorkerPool* pool) -> absl::StatusOr<std::unique_ptr<router::Discovery>> {
    router::Discovery::Options options;
    options.static_workers = addresses;
    options.dns_names = dns;
    options.refresh = absl::Seconds(flags.dns_refresh_s);
    return router::Discovery::Create(
        options, [pool](const std::vector<std::string>& members) { pool->SetMembers(members); });
  };
  auto decode_discovery = make_discovery(*decode_static, flags.decode_dns, &decode_pool);
  if (!decode_discovery.ok()) return usage(std::string(decode_discovery.status().message()));
  std::unique_ptr<router::Discovery> prefill_discovery;
  if (prefill_pool != nullptr) {
    auto created = make_discovery(*prefill_static, flags.prefill_dns, prefill_pool.get());
    if (!created.ok()) return usage(std::string(created.status().message()));
    prefill_discovery = *std::move(created);
  }
  (*decode_discovery)->Start();
  if (prefill_discovery != nullptr) prefill_discovery->Start();

  int exit_code = 0;
  if (absl::Status started = (*frontend)->Start(); !started.ok()) {
    std::cerr << "tandem router: " << started.message() << "\n";
    exit_code = 1;
  } else {
    // The first requests should find the workers connected: wait (bounded) for a healthy decode
    // worker before announcing readiness.
    bool signalled = false;
    const absl::Time ready_deadline = absl::Now() + absl::Seconds(flags.wait_ready_s);
    while (!backend.Ready().ok() && absl::Now() < ready_deadline && !signalled) {
      signalled = WaitForSignal(signals, absl::Milliseconds(50));
    }
    if (!signalled) {
      if (absl::Status ready = backend.Ready(); !ready.ok()) {
        std::cerr << "tandem router: not ready yet (" << ready.message()
                  << "); serving anyway, /health answers 503 until a decode worker is healthy\n";
      }
      std::cout << "tandem router: serving on http://" << flags.host << ":" << (*frontend)->port()
                << "/v1 (model " << (*frontend)->served_model_name() << ", " << decode_pool.size()
                << " decode + " << (prefill_pool != nullptr ? prefill_pool->size() : 0)
                << " prefill workers, routing " << router::RoutingPolicyName(*policy)
                << (disaggregated ? "" : ", aggregated") << ")" << std::endl;
      planning::Layout published{0, 0, 0};
      absl::Time next_plan = absl::Now();
      while (!WaitForSignal(signals, absl::Seconds(1))) {
        if (planner != nullptr && absl::Now() >= next_plan) {
          PublishPlan(*planner, (*frontend)->metrics(), &published);
          next_plan = absl::Now() + absl::Seconds(flags.plan_interval_s);
        }
      }
    }
    std::cerr << "tandem router: shutting down\n";
  }
  // In dependency order: requests end (new ones are refused; running ones get the drain time,
  // then a final error event), discovery stops feeding the pools, the pools stop publishing into
  // the frontend's metrics, then the frontend (and its metrics) go.
  (*frontend)->Drain(absl::Seconds(flags.drain_seconds));
  (*frontend)->Stop();
  (*decode_discovery)->Stop();
  if (prefill_discovery != nullptr) prefill_discovery->Stop();
  decode_pool.Stop();
  if (prefill_pool != nullptr) prefill_pool->Stop();
  frontend->reset();
  return exit_code;
}

}  // namespace

void AddRouterCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<RouterFlags>();
  CLI::App* cmd = app.add_subcommand(
      "router", "OpenAI HTTP frontend routing requests to prefill and decode worker pools");
  cmd->add_option("--model", flags->model_dir,
                  "Model directory (tokenizer, chat template, config.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--host", flags->host,
                  "HTTP bind address (default 127.0.0.1; 0.0.0.0 for every interface)");
  AddAccessFlags(cmd, &flags->access);
  AddServiceAuthFlags(cmd, &flags->service_auth);
  AddLogFormatFlag(cmd, &flags->log_format);
  cmd->add_option("--drain-seconds", flags->drain_seconds,
                  "on SIGINT/SIGTERM: new requests get 503 at once, running ones get this long to "
                  "finish, then end with an error event (default 20)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--port", flags->port, "HTTP port (default 8000; 0: a free one)")
      ->check(CLI::Range(0, 65535));
  AddFrontendModelFlags(cmd, &flags->frontend);
  cmd->add_option("--decode-workers", flags->decode_workers,
                  "Decode workers, comma-separated host:port");
  cmd->add_option("--prefill-workers", flags->prefill_workers,
                  "Prefill workers, comma-separated host:port (none: decode workers prefill)");
  cmd->add_option("--decode-dns", flags->decode_dns,
                  "DNS name:port whose A/AAAA records are decode workers (e.g. a Kubernetes "
                  "headless Service); repeatable")
      ->delimiter(',');
  cmd->add_option("--prefill-dns", flags->prefill_dns,
                  "DNS name:port whose A/AAAA records are prefill workers; repeatable")
      ->delimiter(',');
  cmd->add_option("--dns-refresh-s", flags->dns_refresh_s,
                  "Seconds between DNS re-resolutions (default 10)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--routing", flags->routing,
                  "Worker choice: kv-aware (the default: cached prompt prefix against load), "
                  "least-loaded (KV headroom, then load) or round-robin (docs/routing.md)")
      ->check(CLI::IsMember({"least-loaded", "round-robin", "kv-aware"}));
  cmd->add_option("--local-prefill-threshold", flags->local_prefill_threshold,
                  "Prompts whose uncached part is shorter than this many tokens are prefilled on "
                  "the decode worker (default 0: never)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-aware-request-cost", flags->kv_aware_request_cost,
                  "kv-aware routing: what one request already on a worker costs, in prompt "
                  "tokens (default 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-aware-replicate-weight", flags->kv_aware_replicate_weight,
                  "kv-aware routing: weight of missed prefix tokens on a worker with empty room "
                  "for them, 0..1 (default 0.25; 1 never replicates a cached prefix early)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-model-len", flags->max_model_len,
                  "Context limit, prompt + output tokens (default: config.json)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout-s", flags->request_timeout_s,
                  "Deadline of each request in seconds (default 0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--http-threads", flags->http_threads, "HTTP io threads (default 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--http-idle-timeout-s", flags->http_idle_timeout_s,
                  "How long an idle keep-alive connection (or a request header) may take; behind "
                  "a proxy, set it above the proxy's idle timeout (default 75)")
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--plan-profile", flags->plan_profile,
                  "A tandem profile of the workers: tandem_pool_recommended_replicas then comes "
                  "from the planner's model over the last minute's traffic (docs/planning.md) "
                  "instead of the pools' saturation")
      ->check(CLI::ExistingFile);
  cmd->add_option("--plan-decode-profile", flags->plan_decode_profile,
                  "The decode workers' profile, when it differs (default: --plan-profile)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--plan-ttft-ms", flags->plan_ttft_ms, "Planner: TTFT objective")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--plan-tpot-ms", flags->plan_tpot_ms, "Planner: TPOT objective")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--plan-percentile", flags->plan_percentile,
                  "Planner: percent of requests meeting both")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--plan-max-workers", flags->plan_max_workers,
                  "Planner: the most workers (prefill + decode) it recommends")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  cmd->add_option("--plan-interval-s", flags->plan_interval_s,
                  "Planner: seconds between recommendations")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--wait-ready-s", flags->wait_ready_s,
                  "At start-up, wait this long for a healthy decode worker before announcing "
                  "readiness (default 10)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([flags, exit_code] { *exit_code = RunRouter(*flags); });
}

}  // namespace tandem::cli
