#include "runtime/router/worker_pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "runtime/base/logging.h"
#include "runtime/kvcache/block_pool.h"
#include "runtime/router/pool_load.h"
#include "runtime/router/prefix_index.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// grpc.health.v1.HealthCheckRequest { string service = 1; }
grpc::ByteBuffer EncodeHealthRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty()) {
    bytes.push_back(0x0a);  // field 1, length-delimited
    size_t n = service.size();
    do {
      uint8_t b = n & 0x7f;
      n >>= 7;
      bytes.push_back(static_cast<char>(n ? (b | 0x80) : b));
    } while (n);
    bytes += service;
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; } -> the status value
// (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN).
int DecodeHealthStatus(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return 0;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t key = static_cast<uint8_t>(bytes[i++]);
    uint64_t value = 0;
    if ((key & 7) != 0) return 0;  // only varints are expected in this message
    for (int shift = 0; i < bytes.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    if ((key >> 3) == 1) return static_cast<int>(value);
  }
  return 0;
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const auth::ServiceIdentity* identity) {
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s; a restarted worker should be back in seconds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(64 << 20);
  if (identity == nullptr) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return identity->Dial(address, args);
}

struct WorkerPool::Worker {
  Worker(const std::string& address, const std::string& role, const auth::ServiceIdentity* identity)
      : channel(std::make_shared<WorkerChannel>(address, MakeWorkerChannel(address, identity))),
        stats_stub(v1::Worker::NewStub(channel->channel())),
        health_stub(channel->channel()),
        health_service(role == "prefill" ? "tandem.v1.Prefill" : "tandem.v1.Decode") {}

  std::shared_ptr<WorkerChannel> channel;
  std::unique_ptr<v1::Worker::Stub> stats_stub;
  grpc::GenericStub health_stub;
  std::thread thread;
  absl::Notification stop;

  absl::Mutex mu;
  grpc::ClientContext* stream_context ABSL_GUARDED_BY(mu) = nullptr;
  bool stream_live ABSL_GUARDED_BY(mu) = false;
  absl::Time last_stats ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  WorkerSnapshot stats ABSL_GUARDED_BY(mu);
  bool health_ok ABSL_GUARDED_BY(mu) = true;
  std::string health_service ABSL_GUARDED_BY(mu);
  bool logged_no_health_service ABSL_GUARDED_BY(mu) = false;
  bool logged_unauthenticated ABSL_GUARDED_BY(mu) = false;
  WorkerPrefixIndex prefix ABSL_GUARDED_BY(mu);

  metrics::RouterMetrics* metrics = nullptr;  // where the gauges below live (null: none)
  prometheus::Gauge* running = nullptr;
  prometheus::Gauge* waiting = nullptr;
  prometheus::Gauge* kv_used = nullptr;
  prometheus::Gauge* kv_total = nullptr;
  prometheus::Gauge* healthy = nullptr;
  prometheus::Gauge* prefix_blocks = nullptr;
  prometheus::Counter* prefix_resyncs = nullptr;
};

WorkerPool::WorkerPool(WorkerPoolOptions options)
    : options_(std::move(options)), metrics_(options_.metrics) {
  health_thread_ = std::thread([this] { HealthLoop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (health_thread_.joinable()) health_thread_.join();
  SetMembers({});
}

void WorkerPool::SetMetrics(metrics::RouterMetrics* metrics) { metrics_ = metrics; }

void WorkerPool::SetMembers(const std::vector<std::string>& addresses) {
  std::vector<std::shared_ptr<Worker>> removed;
  {
    absl::MutexLock lock(&mu_);
    const absl::flat_hash_set<std::string> wanted =
        stop_.HasBeenNotified()
            ? absl::flat_hash_set<std::string>()
            : absl::flat_hash_set<std::string>(addresses.begin(), addresses.end());
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (wanted.contains(it->first)) {
        ++it;
        continue;
      }
      removed.push_back(std::move(it->second));
      workers_.erase(it++);
    }
    for (const std::string& address : wanted) {
      if (workers_.contains(address)) continue;
      auto worker = std::make_shared<Worker>(address, options_.role, options_.identity.get());
      {
        absl::MutexLock wlock(&worker->mu);
        worker->stats.address = address;
      }
      if (metrics::RouterMetrics* m = metrics_.load(); m != nullptr) {
        const prometheus::Labels labels = {{"worker", address}, {"role", options_.role}};
        worker->metrics = m;
        worker->running = &m->worker_running.Add(labels);
        worker->waiting = &m->worker_waiting.Add(labels);
        worker->kv_used = &m->worker_kv_blocks_used.Add(labels);
        worker->kv_total = &m->worker_kv_blocks_capacity.Add(labels);
        worker->healthy = &m->worker_healthy.Add(labels);
        if (options_.track_prefix_cache) {
          worker->prefix_blocks = &m->worker_prefix_cache_blocks.Add(labels);
          worker->prefix_resyncs = &m->prefix_index_resyncs.Add({{"pool", options_.role}});
        }
      }
      LOG(INFO) << "router: " << options_.role << " worker " << address << " joined";
      Worker* raw = worker.get();
      worker->thread = std::thread([this, raw] { StatsLoop(raw); });
      workers_.emplace(address, std::move(worker));
    }
  }
  for (auto& worker : removed) {
    worker->stop.Notify();
    {
      absl::MutexLock lock(&worker->mu);
      if (worker->stream_context != nullptr) worker->stream_context->TryCancel();
    }
    worker->thread.join();
    RemoveMetrics(*worker);
    if (!stop_.HasBeenNotified()) {
      LOG(INFO) << "router: " << options_.role << " worker " << worker->channel->address()
                << " left (draining " << worker->channel->inflight() << " requests)";
    }
  }
}

void WorkerPool::RemoveMetrics(Worker& worker) {
  metrics::RouterMetrics* m = worker.metrics;
  if (m == nullptr) return;
  m->worker_running.Remove(worker.running);
  m->worker_waiting.Remove(worker.waiting);
  m->worker_kv_blocks_used.Remove(worker.kv_used);
  m->worker_kv_blocks_capacity.Remove(worker.kv_total);
  m->worker_healthy.Remove(worker.healthy);
  if (worker.prefix_blocks != nullptr) m->worker_prefix_cache_blocks.Remove(worker.prefix_blocks);
}

bool WorkerPool::IsHealthy(Worker& worker, absl::Time now) const {
  absl::MutexLock lock(&worker.mu);
  return worker.stream_live && worker.health_ok &&
         now - worker.last_stats <= options_.stats_stale_after;
}

void WorkerPool::Publish(Worker& worker, bool healthy) {
  if (worker.metrics == nullptr) return;
  WorkerSnapshot s;
  size_t prefix_blocks = 0;
  {
    absl::MutexLock lock(&worker.mu);
    s = worker.stats;
    prefix_blocks = worker.prefix.num_blocks();
  }
  if (worker.prefix_blocks != nullptr)
    worker.prefix_blocks->Set(static_cast<double>(prefix_blocks));
  worker.running->Set(s.running);
  worker.waiting->Set(s.queue_depth);
  worker.kv_used->Set(s.kv_blocks_total - s.kv_blocks_free);
  worker.kv_total->Set(s.kv_blocks_total);
  worker.healthy->Set(healthy ? 1 : 0);
}

void WorkerPool::StatsLoop(Worker* worker) {
  absl::Duration backoff = options_.reconnect_min;
  v1::StatsRequest request;
  request.set_interval_ms(options_.stats_interval_ms);
  request.set_prefix_cache_events(options_.track_prefix_cache);
  bool was_live = false;
  bool logged_down = false;
  while (!worker->stop.HasBeenNotified()) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&worker->mu);
      if (worker->stop.HasBeenNotified()) break;
      worker->stream_context = &context;
    }
    std::unique_ptr<grpc::ClientReader<v1::WorkerStats>> reader =
        worker->stats_stub->StreamStats(&context, request);
    v1::WorkerStats stats;
    bool resync = false;
    while (reader->Read(&stats)) {
      {
        absl::MutexLock lock(&worker->mu);
        worker->stream_live = true;
        worker->last_stats = absl::Now();
        WorkerSnapshot& s = worker->stats;
        s.queue_depth = stats.queue_depth();
        s.running = stats.running_sequences();
        s.kv_blocks_free = stats.kv_blocks_free();
        s.kv_blocks_total = stats.kv_blocks_total();
        s.kv_blocks_cached_idle = stats.kv_blocks_cached_idle();
        s.block_size = stats.block_size();
        s.prompt_tokens_waiting = stats.prompt_tokens_waiting();
      }
      if (options_.track_prefix_cache && !ApplyPrefixCacheEvents(*worker, stats)) {
        // Events were lost: reopen the stream now; its first message is a snapshot. The worker
        // answered, so it stays live meanwhile.
        resync = true;
        context.TryCancel();
        break;
      }
      if (!was_live) {
        LOG(INFO) << "router: " << options_.role << " worker " << worker->channel->address()
                  << " stats stream up";
        was_live = true;
        logged_down = false;
      }
      backoff = options_.reconnect_min;
      Publish(*worker, IsHealthy(*worker, absl::Now()));
    }
    const grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&worker->mu);
      worker->stream_context = nullptr;
      worker->prefix.Clear();
      if (!resync) worker->stream_live = false;
    }
    if (worker->stop.HasBeenNotified()) break;
    if (resync) continue;
    Publish(*worker, false);
    if (was_live || !logged_down) {
      LOG(WARNING) << "router: " << options_.role << " worker " << worker->channel->address()
                   << " stats stream down: "
                   << (status.ok() ? std::string("ended by the worker") : status.error_message());
      was_live = false;
      logged_down = true;
    }
    worker->stop.WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
}

bool WorkerPool::ApplyPrefixCacheEvents(Worker& worker, const v1::WorkerStats& stats) {
  if (!stats.has_prefix_cache()) return true;  // a worker that does not publish events
  const v1::PrefixCacheEvents& in = stats.prefix_cache();
  PrefixCacheDelta delta;
  delta.reset = in.reset();
  delta.first_seq = in.first_seq();
  delta.last_seq = in.last_seq();
  delta.events.reserve(in.events_size());
  for (const v1::PrefixCacheEvent& e : in.events()) {
    delta.events.push_back(
        {.kind = e.removed() ? PrefixCacheEvent::Kind::kRemoved : PrefixCacheEvent::Kind::kStored,
         .block_hash = e.block_hash()});
  }
  absl::Status status;
  {
    absl::MutexLock lock(&worker.mu);
    status = worker.prefix.Apply(delta);
  }
  if (status.ok()) return true;
  LOG(WARNING) << "router: " << options_.role << " worker " << worker.channel->address() << ": "
               << status.message() << "; resyncing its prefix-cache index";
  if (worker.prefix_resyncs != nullptr) worker.prefix_resyncs->Increment();
  return false;
}

void WorkerPool::HealthLoop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.health_interval)) CheckHealthOnce();
}

void WorkerPool::CheckHealthOnce() {
  struct Call {
    std::shared_ptr<Worker> worker;
    std::string service;
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [address, worker] : workers_) {
      auto call = std::make_unique<Call>();
      call->worker = worker;
      calls.push_back(std::move(call));
    }
  }
  for (auto& call : calls) {
    {
      absl::MutexLock lock(&call->worker->mu);
      call->service = call->worker->health_service;
    }
    call->request = EncodeHealthRequest(call->service);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.health_timeout));
    Call* raw = call.get();
    call->worker->health_stub.UnaryCall(&call->context, kHealthCheckMethod, grpc::StubOptions(),
                                        &call->request, &call->response,
                                        [raw](grpc::Status status) {
                                          raw->status = std::move(status);
                                          raw->done.Notify();
                                        });
  }
  const absl::Time now = absl::Now();
  for (auto& call : calls) {
    call->done.WaitForNotification();  // the deadline bounds this
    Worker& worker = *call->worker;
    {
      absl::MutexLock lock(&worker.mu);
      const grpc::StatusCode code = call->status.error_code();
      if (code == grpc::StatusCode::OK) {
        worker.health_ok = DecodeHealthStatus(call->response) == 1;
      } else if (code == grpc::StatusCode::NOT_FOUND && !call->service.empty()) {
        worker.health_service.clear();  // no per-service status: ask for the server's
      } else if (code == grpc::StatusCode::UNIMPLEMENTED) {
        worker.health_ok = true;  // no Health service: the stats stream decides
        if (!worker.logged_no_health_service) {
          worker.logged_no_health_service = true;
          LOG(WARNING) << "router: " << options_.role << " worker " << worker.channel->address()
                       << " has no grpc.health.v1 service; judging it by its stats stream";
        }
      } else {
        worker.health_ok = false;
        if (code == grpc::StatusCode::UNAUTHENTICATED && !worker.logged_unauthenticated) {
          worker.logged_unauthenticated = true;
          LOG(ERROR) << "router: " << options_.role << " worker " << worker.channel->address()
                     << " refuses the router's service credential (" << call->status.error_message()
                     << "): give both the same --service-token-file or --tls-* files";
        }
      }
    }
    Publish(worker, IsHealthy(worker, now));
  }
  // The pool's load and recommended size (pool_load.h), for autoscalers.
  if (metrics::RouterMetrics* m = metrics_.load()) {
    const PoolLoad load = EstimatePoolLoad(Snapshot(), options_.role);
    const prometheus::Labels labels = {{"pool", options_.role}};
    m->pool_saturation.Add(labels).Set(load.saturation);
    m->pool_replicas.Add(labels).Set(load.healthy);
    if (options_.publish_recommended)
      m->pool_recommended_replicas.Add(labels).Set(load.recommended);
  }
}

std::vector<WorkerSnapshot> WorkerPool::Snapshot() const { return Snapshot({}); }

std::vector<WorkerSnapshot> WorkerPool::Snapshot(std::span<const int32_t> prompt) const {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, worker] : workers_) workers.push_back(worker);
  }
  const absl::Time now = absl::Now();
  std::vector<WorkerSnapshot> out;
  out.reserve(workers.size());
  std::vector<std::pair<int, std::vector<uint64_t>>> hashes_by_block_size;
  for (auto& worker : workers) {
    const bool healthy = IsHealthy(*worker, now);
    absl::MutexLock lock(&worker->mu);
    WorkerSnapshot s = worker->stats;
    s.healthy = healthy;
    s.live = worker->stream_live && now - worker->last_stats <= options_.stats_stale_after;
    s.router_inflight = worker->channel->inflight();
    s.cached_prefix_tokens = 0;
    if (options_.track_prefix_cache && s.block_size > 0 && prompt.size() > 1 &&
        worker->prefix.synced()) {
      // Hash the prompt once per block size (pools normally share one).
      auto it = std::find_if(hashes_by_block_size.begin(), hashes_by_block_size.end(),
                             [&](const auto& entry) { return entry.first == s.block_size; });
      if (it == hashes_by_block_size.end()) {
        const int max_blocks = static_cast<int>(prompt.size() - 1) / s.block_size;
        hashes_by_block_size.emplace_back(s.block_size,
                                          PrefixBlockHashes(prompt, s.block_size, max_blocks));
        it = std::prev(hashes_by_block_size.end());
      }
      s.cached_prefix_tokens = worker->prefix.MatchedBlocks(it->second, now) * s.block_size;
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const WorkerSnapshot& a, const WorkerSnapshot& b) { return a.address < b.address; });
  return out;
}

void WorkerPool::NoteRouted(const std::string& address, std::span<const int32_t> prompt) {
  if (!options_.track_prefix_cache || prompt.size() <= 1) return;
  std::shared_ptr<Worker> worker;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(address);
    if (it == workers_.end()) return;
    worker = it->second;
  }
  absl::MutexLock lock(&worker->mu);
  const int block_size = worker->stats.block_size;
  if (block_size <= 0 || !worker->prefix.synced()) return;
  const int max_blocks = static_cast<int>(prompt.size() - 1) / block_size;
  worker->prefix.NoteRouted(PrefixBlockHashes(prompt, block_size, max_blocks),
                            absl::Now() + options_.prefix_pending_ttl);
}

std::shared_ptr<WorkerChannel> WorkerPool::Get(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  return it == workers_.end() ? nullptr : it->second->channel;
}

int WorkerPool::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(workers_.size());
}

int WorkerPool::HealthyCount() const {
  int n = 0;
  for (const WorkerSnapshot& s : Snapshot()) n += s.healthy ? 1 : 0;
  return n;
}

}  // namespace tandem::router
