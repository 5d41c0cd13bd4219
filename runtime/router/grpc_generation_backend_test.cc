#include "runtime/router/grpc_generation_backend.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

enum class Behavior {
  kNormal,           // `num_tokens` tokens, one per message, then finish "length"
  kFailImmediately,  // UNAVAILABLE before any message (a worker dying before its first token)
  kFailAfterTwo,     // two tokens, then INTERNAL
  kErrorFinish,      // an "error" finish before any token
  kInvalidArgument,  // rejects the request
  kEndless,          // a token every 5 ms until cancelled
  kHang,             // nothing at all until cancelled
  kHangIfRemote,     // kHang when the request names a prefill worker (it froze), else kNormal
};

class FakeStats final : public v1::Worker::Service {
 public:
  std::atomic<int> running{0};
  std::atomic<bool> silent{false};  // stream open, no stats: a hung worker
  grpc::Status StreamStats(grpc::ServerContext* context, const v1::StatsRequest*,
                           grpc::ServerWriter<v1::WorkerStats>* writer) override {
    while (!context->IsCancelled()) {
      v1::WorkerStats stats;
      stats.set_running_sequences(running);
      stats.set_kv_blocks_total(100);
      stats.set_kv_blocks_free(100);
      stats.set_block_size(16);
      if (!silent && !writer->Write(stats)) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return grpc::Status::OK;
  }
};

class FakeDecode final : public v1::Decode::Service {
 public:
  std::atomic<Behavior> behavior{Behavior::kNormal};
  std::atomic<int> num_tokens{4};
  std::atomic<int> generate_calls{0};
  std::atomic<int> cancel_calls{0};
  std::atomic<bool> cancel_tokens_match{false};

  v1::GenerateRequest last_request() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    ++generate_calls;
    {
      absl::MutexLock lock(&mu_);
      last_ = *request;
    }
    const int prompt = request->prompt_token_ids_size();
    const auto token = [&](int i, bool last) {
      v1::GenerateResponse r;
      r.add_token_ids(100 + i);
      r.set_text(absl::StrCat("t", i));
      if (request->sampling().logprobs() >= 0) {
        v1::TokenLogprobs* lp = r.add_logprobs();
        lp->set_token_id(100 + i);
        lp->set_logprob(-0.5f * (i + 1));
        v1::TopLogprob* top = lp->add_top();
        top->set_token_id(7);
        top->set_logprob(-0.25f);
      }
      r.mutable_usage()->set_prompt_tokens(prompt);
      r.mutable_usage()->set_completion_tokens(i + 1);
      if (i == 0) {
        r.mutable_ttft()->set_queue_us(11);
        r.mutable_ttft()->set_prefill_us(22);
        r.mutable_ttft()->set_transfer_us(33);
        r.mutable_ttft()->set_first_decode_us(44);
      }
      if (last) r.set_finish_reason("length");
      return writer->Write(r);
    };
    Behavior b = behavior.load();
    if (b == Behavior::kHangIfRemote) {
      b = request->prefill_worker().empty() ? Behavior::kNormal : Behavior::kHang;
    }
    switch (b) {
      case Behavior::kNormal: {
        const int max = request->sampling().max_tokens();
        const int n = max > 0 ? std::min<int>(num_tokens, max) : num_tokens.load();
        for (int i = 0; i < n; ++i) {
          if (!token(i, i + 1 == n)) break;
        }
        return grpc::Status::OK;
      }
      case Behavior::kFailImmediately:
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker going away");
      case Behavior::kFailAfterTwo:
        token(0, false);
        token(1, false);
        return grpc::Status(grpc::StatusCode::INTERNAL, "engine exploded");
      case Behavior::kErrorFinish: {
        v1::GenerateResponse r;
        r.set_finish_reason("error");
        r.set_error_message("kv transfer failed");
        writer->Write(r);
        return grpc::Status::OK;
      }
      case Behavior::kInvalidArgument:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt longer than the context");
      case Behavior::kEndless:
        for (int i = 0; !context->IsCancelled(); ++i) {
          if (!token(i, false)) break;
          absl::SleepFor(absl::Milliseconds(5));
        }
        return grpc::Status::CANCELLED;
      case Behavior::kHang:
      case Behavior::kHangIfRemote:
        while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      cancel_tokens_match =
          request->cancel_token().size() >= 16 && request->cancel_token() == last_.cancel_token();
    }
    ++cancel_calls;
    response->set_found(true);
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  v1::GenerateRequest last_;
};

// A decode (or prefill) worker in-process: Decode + Worker + health.
class FakeWorker {
 public:
  FakeWorker() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&decode);
    builder.RegisterService(&stats);
    server_ = builder.BuildAndStart();
  }
  ~FakeWorker() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  FakeDecode decode;
  FakeStats stats;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Collects one request's events and checks there is exactly one final event, last.
class Collector {
 public:
  BackendEventCallback callback() {
    return [this](absl::StatusOr<BackendChunk> event) {
      absl::MutexLock lock(&mu_);
      EXPECT_FALSE(final_.has_value()) << "event after the final event";
      if (!event.ok()) {
        final_ = event.status();
        return;
      }
      chunks_.push_back(*event);
      if (event->finish_reason.has_value()) final_ = absl::OkStatus();
    };
  }
  bool WaitFinal(absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(this, &Collector::has_final), timeout);
  }
  absl::Status final_status() {
    absl::MutexLock lock(&mu_);
    return *final_;
  }
  std::vector<BackendChunk> chunks() {
    absl::MutexLock lock(&mu_);
    return chunks_;
  }
  int tokens() {
    int n = 0;
    for (const BackendChunk& c : chunks()) n += static_cast<int>(c.token_ids.size());
    return n;
  }

 private:
  bool has_final() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return final_.has_value(); }
  absl::Mutex mu_;
  std::vector<BackendChunk> chunks_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
};

WorkerPoolOptions PoolOptions(const std::string& role) {
  WorkerPoolOptions options;
  options.role = role;
  options.health_interval = absl::Milliseconds(50);
  options.stats_stale_after = absl::Milliseconds(500);
  options.reconnect_min = absl::Milliseconds(20);
  options.reconnect_max = absl::Milliseconds(100);
  return options;
}

BackendRequest Request(const std::string& id, int prompt_tokens = 5) {
  BackendRequest request;
  request.request_id = id;
  for (int i = 0; i < prompt_tokens; ++i) request.prompt_token_ids.push_back(1 + i);
  request.params.temperature = 0.0f;
  request.params.max_tokens = 4;
  return request;
}

class BackendTest : public ::testing::Test {
 protected:
  // Decode pool over `n` fake workers, all healthy before the test body runs.
  void StartDecode(int n) {
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) {
      decode_workers_.push_back(std::make_unique<FakeWorker>());
      addresses.push_back(decode_workers_.back()->address());
    }
    decode_pool_ = std::make_unique<WorkerPool>(PoolOptions("decode"));
    decode_pool_->SetMembers(addresses);
    ASSERT_TRUE(WaitFor([&] { return decode_pool_->HealthyCount() == n; }));
  }
  void StartPrefill(int n) {
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) {
      prefill_workers_.push_back(std::make_unique<FakeWorker>());
      addresses.push_back(prefill_workers_.back()->address());
    }
    prefill_pool_ = std::make_unique<WorkerPool>(PoolOptions("prefill"));
    prefill_pool_->SetMembers(addresses);
    ASSERT_TRUE(WaitFor([&] { return prefill_pool_->HealthyCount() == n; }));
  }
  // Two decode workers: [0] fails after two tokens and is picked first (least-loaded: [1] reports
  // 5 running sequences), [1] serves normally.
  void StartFailingThenHealthy() {
    StartDecode(2);
    decode_workers_[0]->decode.behavior = Behavior::kFailAfterTwo;
    decode_workers_[1]->stats.running = 5;
    absl::SleepFor(absl::Milliseconds(100));
  }

  std::unique_ptr<GrpcGenerationBackend> MakeBackend(GrpcBackendOptions options = {}) {
    return std::make_unique<GrpcGenerationBackend>(decode_pool_.get(), prefill_pool_.get(),
                                                   options);
  }

  std::vector<std::unique_ptr<FakeWorker>> decode_workers_;
  std::vector<std::unique_ptr<FakeWorker>> prefill_workers_;
  std::unique_ptr<WorkerPool> decode_pool_;
  std::unique_ptr<WorkerPool> prefill_pool_;
};

TEST_F(BackendTest, StreamsChunksWithTtftUsageLogprobsAndOneFinal) {
  StartDecode(1);
  auto backend = MakeBackend();
  EXPECT_TRUE(backend->Ready().ok());
  Collector c;
  BackendRequest request = Request("r1", 7);
  request.params.logprobs = 1;
  request.params.stop = {"\n\n"};
  request.params.seed = 42;
  backend->Generate(request, c.callback());
  ASSERT_TRUE(c.WaitFinal());
  ASSERT_TRUE(c.final_status().ok()) << c.final_status();
  const std::vector<BackendChunk> chunks = c.chunks();
  ASSERT_EQ(chunks.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(chunks[i].token_ids, std::vector<int32_t>{100 + i});
    EXPECT_EQ(chunks[i].text, absl::StrCat("t", i));
    ASSERT_EQ(chunks[i].logprobs.size(), 1u);
    EXPECT_FLOAT_EQ(chunks[i].logprobs[0].logprob, -0.5f * (i + 1));
    ASSERT_EQ(chunks[i].logprobs[0].top.size(), 1u);
    EXPECT_EQ(chunks[i].logprobs[0].top[0].token_id, 7);
    EXPECT_EQ(chunks[i].usage.prompt_tokens, 7);
    EXPECT_EQ(chunks[i].usage.completion_tokens, i + 1);
    EXPECT_EQ(chunks[i].ttft.has_value(), i == 0);
    EXPECT_EQ(chunks[i].finish_reason.has_value(), i == 3);
  }
  EXPECT_EQ(chunks[0].ttft->queue_us, 11);
  EXPECT_EQ(chunks[0].ttft->prefill_us, 22);
  EXPECT_EQ(chunks[0].ttft->transfer_us, 33);
  EXPECT_EQ(chunks[0].ttft->first_decode_us, 44);
  EXPECT_EQ(*chunks[3].finish_reason, "length");

  const v1::GenerateRequest sent = decode_workers_[0]->decode.last_request();
  EXPECT_EQ(sent.request_id(), "r1");
  EXPECT_EQ(sent.prompt_token_ids_size(), 7);
  EXPECT_EQ(sent.sampling().max_tokens(), 4);
  EXPECT_EQ(sent.sampling().logprobs(), 1);
  EXPECT_TRUE(sent.sampling().has_seed());
  EXPECT_EQ(sent.sampling().seed(), 42u);
  ASSERT_EQ(sent.sampling().stop_size(), 1);
  EXPECT_EQ(sent.sampling().stop(0), "\n\n");
  EXPECT_EQ(sent.prefill_worker(), "");  // no prefill pool: local prefill
  EXPECT_TRUE(WaitFor([&] { return backend->active_requests() == 0; }));
}

TEST_F(BackendTest, UnsetSamplingFieldsUseTheProtoConventions) {
  StartDecode(1);
  auto backend = MakeBackend();
  Collector c;
  BackendRequest request = Request("r");
  request.params.max_tokens.reset();
  backend->Generate(request, c.callback());
  ASSERT_TRUE(c.WaitFinal());
  const v1::GenerateRequest sent = decode_workers_[0]->decode.last_request();
  EXPECT_EQ(sent.sampling().max_tokens(), 0);
  EXPECT_EQ(sent.sampling().logprobs(), -1);
  EXPECT_FALSE(sent.sampling().has_seed());
}

TEST_F(BackendTest, NoHealthyDecodeWorkerIsUnavailable) {
  decode_pool_ = std::make_unique<WorkerPool>(PoolOptions("decode"));
  auto backend = MakeBackend();
  EXPECT_EQ(backend->Ready().code(), absl::StatusCode::kUnavailable);
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(BackendTest, RetriesOnAnotherDecodeWorkerBeforeTheFirstToken) {
  StartDecode(2);
  FakeWorker& bad = *decode_workers_[0];
  FakeWorker& good = *decode_workers_[1];
  bad.decode.behavior = Behavior::kFailImmediately;
  good.stats.running = 5;  // least-loaded tries the idle-looking bad worker first
  absl::SleepFor(absl::Milliseconds(100));
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.tokens(), 4);
  EXPECT_EQ(bad.decode.generate_calls, 1);
  EXPECT_EQ(good.decode.generate_calls, 1);
}

TEST_F(BackendTest, HungDecodeWorkerIsLeftAndTheRequestRetried) {
  StartDecode(2);
  FakeWorker& hung = *decode_workers_[0];
  FakeWorker& good = *decode_workers_[1];
  hung.decode.behavior = Behavior::kHang;
  good.stats.running = 5;  // least-loaded picks the hung one first
  absl::SleepFor(absl::Milliseconds(100));
  GrpcBackendOptions options;
  options.unresponsive_timeout = absl::Milliseconds(200);
  options.watchdog_interval = absl::Milliseconds(20);
  auto backend = MakeBackend(options);
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(WaitFor([&] { return hung.decode.generate_calls == 1; }));
  hung.stats.silent = true;  // its stats go stale: the watchdog takes the request off it
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.tokens(), 4);
  EXPECT_EQ(good.decode.generate_calls, 1);
}

// A prefill worker that freezes (its stats stop) while a request waits on it: the request is
// retried on the same decode worker, prefilled there, under a new attempt id.
TEST_F(BackendTest, FrozenPrefillWorkerIsLeftAndThePromptPrefilledOnDecode) {
  StartDecode(1);
  StartPrefill(1);
  FakeDecode& decode = decode_workers_[0]->decode;
  decode.behavior = Behavior::kHangIfRemote;
  GrpcBackendOptions options;
  options.unresponsive_timeout = absl::Milliseconds(200);
  options.watchdog_interval = absl::Milliseconds(20);
  auto backend = MakeBackend(options);
  Collector c;
  backend->Generate(Request("r", 20), c.callback());
  ASSERT_TRUE(WaitFor([&] { return decode.generate_calls == 1; }));
  EXPECT_EQ(decode.last_request().prefill_worker(), prefill_workers_[0]->address());
  prefill_workers_[0]->stats.silent = true;
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.tokens(), 4);
  EXPECT_EQ(decode.generate_calls, 2);
  EXPECT_EQ(decode.last_request().prefill_worker(), "");
  EXPECT_EQ(decode.last_request().request_id(), "r#2");
}

TEST_F(BackendTest, DecodeWorkerHungMidStreamIsAnError) {
  StartDecode(1);
  FakeWorker& worker = *decode_workers_[0];
  worker.decode.behavior = Behavior::kEndless;
  GrpcBackendOptions options;
  options.unresponsive_timeout = absl::Milliseconds(200);
  options.watchdog_interval = absl::Milliseconds(20);
  auto backend = MakeBackend(options);
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(WaitFor([&] { return c.tokens() >= 2; }));
  worker.stats.silent = true;
  ASSERT_TRUE(c.WaitFinal());
  // Greedy, so it would migrate, but there is no other decode worker to continue on.
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.final_status().message().find("mid-stream"), std::string::npos) << c.final_status();
  EXPECT_NE(c.final_status().message().find("unresponsive"), std::string::npos) << c.final_status();
}

TEST_F(BackendTest, ErrorFinishBeforeTheFirstTokenIsRetried) {
  StartDecode(2);
  decode_workers_[0]->decode.behavior = Behavior::kErrorFinish;
  decode_workers_[1]->decode.behavior = Behavior::kErrorFinish;
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.final_status().message().find("kv transfer failed"), std::string::npos)
      << c.final_status();
  EXPECT_EQ(decode_workers_[0]->decode.generate_calls + decode_workers_[1]->decode.generate_calls,
            2);
}

TEST_F(BackendTest, MidStreamFailureOutOfMigrationsIsAnInternalError) {
  StartDecode(2);
  decode_workers_[0]->decode.behavior = Behavior::kFailAfterTwo;
  decode_workers_[1]->decode.behavior = Behavior::kFailAfterTwo;
  GrpcBackendOptions options;
  options.max_migrations = 0;
  auto backend = MakeBackend(options);
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(c.final_status().message().find("engine exploded"), std::string::npos);
  EXPECT_NE(c.final_status().message().find("migrations exhausted"), std::string::npos);
  EXPECT_EQ(c.tokens(), 2);
  EXPECT_EQ(decode_workers_[0]->decode.generate_calls + decode_workers_[1]->decode.generate_calls,
            1);
}

// A sampled request without a seed gets one from the router, and its migration carries that seed
// and the resume fields: the tokens and text bytes the client already has. The new decode worker
// prefills it itself (it samples the next token at the seed position).
TEST_F(BackendTest, SampledRequestMigratesWithItsSeedAndResumeFields) {
  StartFailingThenHealthy();
  FakeWorker& failing = *decode_workers_[0];
  FakeWorker& other = *decode_workers_[1];
  auto backend = MakeBackend();
  Collector c;
  BackendRequest sampled = Request("r");
  sampled.params.temperature = 0.7f;
  sampled.params.presence_penalty = 0.5f;
  sampled.params.stop = {"zz"};
  backend->Generate(sampled, c.callback());
  ASSERT_TRUE(c.WaitFinal());
  ASSERT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.tokens(), 4);
  const v1::GenerateRequest first = failing.decode.last_request();
  const v1::GenerateRequest moved = other.decode.last_request();
  ASSERT_TRUE(first.sampling().has_seed()) << "the router fixes the seed of a sampled request";
  ASSERT_TRUE(moved.sampling().has_seed());
  EXPECT_EQ(moved.sampling().seed(), first.sampling().seed());
  EXPECT_EQ(first.resumed_output_tokens(), 0);
  EXPECT_EQ(moved.resumed_output_tokens(), 2);
  int64_t delivered = 0;
  const std::vector<BackendChunk> chunks = c.chunks();
  for (size_t i = 0; i < 2; ++i) delivered += static_cast<int64_t>(chunks[i].text.size());
  EXPECT_GT(delivered, 0);
  EXPECT_EQ(moved.resumed_text_bytes(), delivered);
  EXPECT_EQ(moved.prefill_worker(), "");
  EXPECT_EQ(moved.sampling().presence_penalty(), 0.5f);
  EXPECT_EQ(moved.sampling().max_tokens(), 2);
}

// A greedy request whose decode worker fails mid-stream moves to another one, which gets the
// prompt plus the tokens delivered so far and the remaining budget; the client sees every token
// once, its own usage, and one final event.
TEST_F(BackendTest, GreedyRequestMigratesMidStream) {
  StartFailingThenHealthy();
  FakeWorker& failing = *decode_workers_[0];
  FakeWorker& other = *decode_workers_[1];
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());  // greedy, 5 prompt tokens, max_tokens 4
  ASSERT_TRUE(c.WaitFinal());
  ASSERT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.tokens(), 4);
  EXPECT_EQ(failing.decode.generate_calls, 1);
  ASSERT_EQ(other.decode.generate_calls, 1);
  const v1::GenerateRequest moved = other.decode.last_request();
  ASSERT_EQ(moved.prompt_token_ids_size(), 7);
  EXPECT_EQ(moved.prompt_token_ids(5), 100);  // the two tokens the client already has
  EXPECT_EQ(moved.prompt_token_ids(6), 101);
  EXPECT_EQ(moved.sampling().max_tokens(), 2);
  EXPECT_EQ(moved.request_id(), "r#2");
  const std::vector<BackendChunk> chunks = c.chunks();
  EXPECT_EQ(chunks.back().finish_reason.value_or(""), "length");
  EXPECT_EQ(chunks.back().usage.prompt_tokens, 5);
  EXPECT_EQ(chunks.back().usage.completion_tokens, 4);
  int with_ttft = 0;
  for (const BackendChunk& chunk : chunks) with_ttft += chunk.ttft.has_value();
  EXPECT_EQ(with_ttft, 1);  // only the first token's
}

TEST_F(BackendTest, RequestErrorsPassThroughWithoutRetry) {
  StartDecode(2);
  decode_workers_[0]->decode.behavior = Behavior::kInvalidArgument;
  decode_workers_[1]->decode.behavior = Behavior::kInvalidArgument;
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.final_status().message(), "prompt longer than the context");
  EXPECT_EQ(decode_workers_[0]->decode.generate_calls + decode_workers_[1]->decode.generate_calls,
            1);
}

TEST_F(BackendTest, CancelEndsWithAbortAndTellsTheDecodeWorker) {
  StartDecode(1);
  decode_workers_[0]->decode.behavior = Behavior::kEndless;
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(WaitFor([&] { return c.tokens() >= 3; }));
  backend->Cancel("r");
  ASSERT_TRUE(c.WaitFinal());
  ASSERT_TRUE(c.final_status().ok()) << c.final_status();
  EXPECT_EQ(c.chunks().back().finish_reason.value_or(""), "abort");
  EXPECT_TRUE(WaitFor([&] { return decode_workers_[0]->decode.cancel_calls == 1; }));
  // Decode.Cancel presents the random token the Generate call carried (the worker honours no
  // other).
  EXPECT_TRUE(decode_workers_[0]->decode.cancel_tokens_match.load());
  backend->Cancel("r");  // late and unknown ids are no-ops
  backend->Cancel("nope");
}

TEST_F(BackendTest, DeadlineIsEnforced) {
  StartDecode(1);
  decode_workers_[0]->decode.behavior = Behavior::kEndless;
  auto backend = MakeBackend();
  Collector c;
  BackendRequest request = Request("r");
  request.deadline = absl::Now() + absl::Milliseconds(100);
  backend->Generate(request, c.callback());
  ASSERT_TRUE(c.WaitFinal());
  EXPECT_EQ(c.final_status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(BackendTest, DestructorCancelsRunningRequests) {
  StartDecode(1);
  decode_workers_[0]->decode.behavior = Behavior::kEndless;
  auto backend = MakeBackend();
  Collector c;
  backend->Generate(Request("r"), c.callback());
  ASSERT_TRUE(WaitFor([&] { return c.tokens() >= 1; }));
  backend.reset();
  ASSERT_TRUE(c.WaitFinal(absl::ZeroDuration()));
  EXPECT_EQ(c.chunks().back().finish_reason.value_or(""), "abort");
}

TEST_F(BackendTest, NamesAPrefillWorkerUnlessThePromptIsShortOrThePoolIsDown) {
  StartDecode(1);
  StartPrefill(1);
  GrpcBackendOptions options;
  options.local_prefill_threshold = 10;
  auto backend = MakeBackend(options);
  FakeDecode& decode = decode_workers_[0]->decode;
  {
    Collector c;
    backend->Generate(Request("long", 10), c.callback());
    ASSERT_TRUE(c.WaitFinal());
    EXPECT_EQ(decode.last_request().prefill_worker(), prefill_workers_[0]->address());
  }
  {
    Collector c;
    backend->Generate(Request("short", 9), c.callback());
    ASSERT_TRUE(c.WaitFinal());
    EXPECT_EQ(decode.last_request().prefill_worker(), "");
  }
  prefill_workers_.clear();  // the prefill pool loses its only worker
  ASSERT_TRUE(WaitFor([&] { return prefill_pool_->HealthyCount() == 0; }));
  {
    Collector c;
    backend->Generate(Request("long2", 50), c.callback());
    ASSERT_TRUE(c.WaitFinal());
    EXPECT_TRUE(c.final_status().ok()) << c.final_status();
    EXPECT_EQ(decode.last_request().prefill_worker(), "");
  }
}

TEST_F(BackendTest, SixtyFourConcurrentStreams) {
  StartDecode(2);
  for (auto& w : decode_workers_) w->decode.num_tokens = 20;
  GrpcBackendOptions options;
  options.policy = RoutingPolicy::kRoundRobin;
  auto backend = MakeBackend(options);
  constexpr int kRequests = 64;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < kRequests; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    BackendRequest request = Request(absl::StrCat("r", i));
    request.params.max_tokens = 20;
    backend->Generate(request, collectors.back()->callback());
  }
  for (auto& c : collectors) {
    ASSERT_TRUE(c->WaitFinal());
    EXPECT_TRUE(c->final_status().ok()) << c->final_status();
    EXPECT_EQ(c->tokens(), 20);
  }
  EXPECT_EQ(decode_workers_[0]->decode.generate_calls, kRequests / 2);
  EXPECT_EQ(decode_workers_[1]->decode.generate_calls, kRequests / 2);
}

TEST_F(BackendTest, AtCapacityRequestsAreRefused) {
  StartDecode(1);
  decode_workers_[0]->decode.behavior = Behavior::kEndless;
  GrpcBackendOptions options;
  options.max_streams = 1;
  auto backend = MakeBackend(options);
  Collector first;
  Collector second;
  backend->Generate(Request("a"), first.callback());
  // The refusal may come on this thread; a callback that calls back into the backend (as the
  // frontend cancels a request's sibling choices) must not deadlock.
  BackendEventCallback record = second.callback();
  backend->Generate(Request("b"), [&](absl::StatusOr<BackendChunk> event) {
    backend->Cancel("b-sibling");
    record(std::move(event));
  });
  ASSERT_TRUE(second.WaitFinal());
  EXPECT_EQ(second.final_status().code(), absl::StatusCode::kResourceExhausted);
  backend->Cancel("a");
  ASSERT_TRUE(first.WaitFinal());
}

}  // namespace
}  // namespace tandem::router
