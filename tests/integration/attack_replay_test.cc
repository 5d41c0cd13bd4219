// The attacks of issue 21, replayed against a real prefill + decode worker pair (tiny model on
// CPU engines, real gRPC, the ucx or loopback KV transfer backend). Between the two workers sits
// a recording relay: the decode worker's only allowed prefill worker, forwarding every call to
// the real one and keeping a copy, as an attacker who could read the traffic would.
//
// Each attack must end in a clean error, the workers must keep serving, and a greedy request
// that hits the prefix-cached blocks an attacker aimed at must return the same tokens before and
// after.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "decode/decode_worker.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_backend.h"
#include "prefill/prefill_worker.h"
#include "runtime/auth/kv_grant.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/logging.h"
#include "runtime/model/synth.h"
#include "runtime/server/model_loader.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"
#include "tests/integration/disagg_stack.h"

namespace tandem {
namespace {

using testing_util::GreedyGenerate;
using testing_util::Streamed;
using testing_util::TestIdentity;
using testing_util::UniqueId;
using testing_util::WithIdentity;

// Forwards Prefill.* to the real prefill worker and records what passed.
class RecordingRelay final : public v1::Prefill::Service {
 public:
  explicit RecordingRelay(const std::string& target)
      : stub_(v1::Prefill::NewStub(TestIdentity()->Dial(target))) {}

  grpc::Status Connect(grpc::ServerContext* server, const v1::ConnectRequest* request,
                       v1::ConnectResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      connect_ = *request;
    }
    grpc::ClientContext context;
    context.set_deadline(server->deadline());
    return stub_->Connect(&context, *request, response);
  }
  grpc::Status Prefill(grpc::ServerContext* server, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      prefills_.push_back(*request);
    }
    grpc::ClientContext context;
    context.set_deadline(server->deadline());
    return stub_->Prefill(&context, *request, response);
  }
  grpc::Status Fence(grpc::ServerContext* server, const v1::FenceRequest* request,
                     v1::FenceResponse* response) override {
    grpc::ClientContext context;
    context.set_deadline(server->deadline());
    return stub_->Fence(&context, *request, response);
  }

  std::vector<v1::PrefillRequest> prefills() {
    absl::MutexLock lock(&mu_);
    return prefills_;
  }
  v1::ConnectRequest connect() {
    absl::MutexLock lock(&mu_);
    return connect_;
  }

 private:
  std::unique_ptr<v1::Prefill::Stub> stub_;
  absl::Mutex mu_;
  v1::ConnectRequest connect_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PrefillRequest> prefills_ ABSL_GUARDED_BY(mu_);
};

class AttackReplayTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/attack_replay_tiny_", getpid());
    SynthOptions synth;
    synth.like = "tiny";
    synth.out_dir = dir_;
    synth.seed = 5;
    synth.num_threads = 2;
    ASSERT_TRUE(SynthesizeModel(synth, nullptr).ok());
    p_model_ = Load();
    d_model_ = Load();
    auto p = prefill::PrefillWorker::Create(p_model_->engine.get(), Backend("p"),
                                            WithIdentity(prefill::PrefillWorkerOptions{}));
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);

    relay_ = std::make_unique<RecordingRelay>(prefill_->address());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &relay_port_);
    builder.RegisterService(relay_.get());
    relay_server_ = builder.BuildAndStart();
    ASSERT_NE(relay_server_, nullptr);
    relay_address_ = absl::StrCat("127.0.0.1:", relay_port_);

    decode::DecodeWorkerOptions d_options;
    d_options.service.allowed_prefill_workers = {relay_address_};
    auto d =
        decode::DecodeWorker::Create(d_model_->engine.get(), Backend("d"), WithIdentity(d_options));
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    decode_stub_ = v1::Decode::NewStub(TestIdentity()->Dial(decode_->address()));
    prefill_stub_ = v1::Prefill::NewStub(TestIdentity()->Dial(prefill_->address()));
  }
  void TearDown() override {
    decode_stub_.reset();
    prefill_stub_.reset();
    if (decode_ != nullptr) decode_->Shutdown(absl::ZeroDuration());
    if (relay_server_ != nullptr) relay_server_->Shutdown();
    if (prefill_ != nullptr) prefill_->Shutdown(absl::ZeroDuration());
    for (auto* model : {&p_model_, &d_model_}) {
      if (*model != nullptr) (*model)->engine->Shutdown(absl::ZeroDuration());
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<server::LoadedModel> Load() {
    server::ModelLoadOptions options;
    options.model_dir = dir_;
    options.block_size = 16;
    options.num_blocks = 64;
    options.engine.enable_prefix_caching = true;
    auto model = server::LoadModel(options);
    CHECK(model.ok()) << model.status();
    return std::make_unique<server::LoadedModel>(std::move(*model));
  }
  std::unique_ptr<kvtransfer::TransferBackend> Backend(const std::string& role) {
    kvtransfer::BackendOptions options;
    options.agent_name = UniqueId(absl::StrCat(role, "-", GetParam()));
    options.ucx_transports = "tcp,sm,self";
    auto backend = kvtransfer::CreateTransferBackend(GetParam(), options);
    CHECK(backend.ok()) << backend.status();
    return std::move(*backend);
  }
  // Greedy through the relay (remote prefill).
  Streamed Greedy(const std::vector<int32_t>& prompt) {
    return GreedyGenerate(*decode_stub_, prompt, 8, relay_address_);
  }
  grpc::Status Prefill(const v1::PrefillRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::PrefillResponse response;
    return prefill_stub_->Prefill(&context, request, &response);
  }

  std::string dir_;
  std::unique_ptr<server::LoadedModel> p_model_;
  std::unique_ptr<server::LoadedModel> d_model_;
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::unique_ptr<RecordingRelay> relay_;
  std::unique_ptr<grpc::Server> relay_server_;
  int relay_port_ = 0;
  std::string relay_address_;
  std::unique_ptr<v1::Decode::Stub> decode_stub_;
  std::unique_ptr<v1::Prefill::Stub> prefill_stub_;
};

std::vector<int32_t> Prompt(int length, int seed) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back(3 + (seed * 31 + i * 17) % 240);
  return prompt;
}

TEST_P(AttackReplayTest, EveryAttackFailsCleanlyAndNoOutputChanges) {
  // A 48-token prompt (three full blocks, prefix-cached on D afterwards), greedy, twice: the
  // second run reads D's cached blocks. This is the output an attacker wants to change.
  const std::vector<int32_t> victim = Prompt(48, 1);
  const Streamed before = Greedy(victim);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  ASSERT_TRUE(before.prefilled_remotely);
  ASSERT_EQ(before.tokens.size(), 8u);
  const Streamed cached = Greedy(victim);
  ASSERT_TRUE(cached.status.ok());
  EXPECT_EQ(cached.tokens, before.tokens);

  // Another request, whose Prefill call the relay captured: its pair id, epoch, blocks, grant.
  const Streamed other = Greedy(Prompt(40, 2));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  const std::vector<v1::PrefillRequest> captured = relay_->prefills();
  ASSERT_FALSE(captured.empty());
  const v1::PrefillRequest& seen = captured.back();
  ASSERT_FALSE(seen.pair_id().empty());
  ASSERT_EQ(seen.grant().size(), auth::kGrantBytes);

  // 1. Arbitrary-address write: a request carrying its own region (base + length).
  {
    v1::PrefillRequest forged = seen;
    forged.set_transfer_epoch(seen.transfer_epoch() + 100);
    forged.mutable_target()->set_region("0x40000000:1099511627776");
    const grpc::Status s = Prefill(forged);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // 2. A garbage 16-byte agent address at the handshake: a clean refusal, not an abort.
  {
    v1::ConnectRequest connect = relay_->connect();
    ASSERT_GT(connect.endpoints_size(), 0);
    for (v1::KvEndpoint& endpoint : *connect.mutable_endpoints()) {
      endpoint.set_agent_address(std::string(16, '\x7f'));
      endpoint.set_region(std::string(16, '\x11'));
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::ConnectResponse response;
    const grpc::Status s = prefill_stub_->Connect(&context, connect, &response);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  // 3. KV-cache poisoning: the captured request replayed as-is, with a new epoch, and with the
  //    victim's cached blocks substituted (blocks 0..2 hold the victim's prefix: the first ones
  //    a fresh engine hands out).
  {
    EXPECT_EQ(Prefill(seen).error_code(), grpc::StatusCode::ALREADY_EXISTS) << "plain replay";
    v1::PrefillRequest later = seen;
    later.set_transfer_epoch(seen.transfer_epoch() + 1);
    EXPECT_EQ(Prefill(later).error_code(), grpc::StatusCode::PERMISSION_DENIED) << "new epoch";
    v1::PrefillRequest poison = later;
    poison.mutable_target()->clear_block_ids();
    for (int b = 0; b < 3; ++b) poison.mutable_target()->add_block_ids(b);
    poison.mutable_target()->set_num_cached_tokens(0);
    EXPECT_EQ(Prefill(poison).error_code(), grpc::StatusCode::PERMISSION_DENIED) << "chosen blocks";
  }
  // 4. SSRF: a Generate naming a prefill worker the decode worker does not know.
  {
    const Streamed ssrf = GreedyGenerate(*decode_stub_, Prompt(20, 3), 4, "127.0.0.1:1");
    EXPECT_EQ(ssrf.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << ssrf.status.error_message();
  }
  // 5. Cancelling another caller's request: its id without its cancel token does nothing.
  {
    v1::GenerateRequest request = testing_util::GreedyRequest(Prompt(30, 4), 24, relay_address_);
    request.set_cancel_token(std::string(16, '\x33'));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = decode_stub_->Generate(&context, request);
    v1::GenerateResponse message;
    ASSERT_TRUE(reader->Read(&message));  // running now
    for (const std::string& token : {std::string(), std::string(16, '\x34')}) {
      v1::CancelRequest cancel;
      cancel.set_request_id(request.request_id());
      cancel.set_cancel_token(token);
      grpc::ClientContext c;
      v1::CancelResponse response;
      ASSERT_TRUE(decode_stub_->Cancel(&c, cancel, &response).ok());
      EXPECT_FALSE(response.found()) << "a foreign cancel was honoured";
    }
    {
      auto anonymous =
          v1::Decode::NewStub(auth::ServiceIdentity::Unauthenticated()->Dial(decode_->address()));
      v1::CancelRequest cancel;
      cancel.set_request_id(request.request_id());
      cancel.set_cancel_token(request.cancel_token());
      grpc::ClientContext c;
      v1::CancelResponse response;
      EXPECT_EQ(anonymous->Cancel(&c, cancel, &response).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    std::string finish = message.finish_reason();
    int tokens = message.token_ids_size();
    while (reader->Read(&message)) {
      tokens += message.token_ids_size();
      if (!message.finish_reason().empty()) finish = message.finish_reason();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(finish, "length");
    EXPECT_EQ(tokens, 24);
  }
  // ... while the owner's cancel, with its token, is honoured.
  {
    v1::GenerateRequest request = testing_util::GreedyRequest(Prompt(30, 5), 150, relay_address_);
    request.set_cancel_token(std::string(16, '\x35'));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = decode_stub_->Generate(&context, request);
    v1::GenerateResponse message;
    ASSERT_TRUE(reader->Read(&message));
    v1::CancelRequest cancel;
    cancel.set_request_id(request.request_id());
    cancel.set_cancel_token(request.cancel_token());
    grpc::ClientContext c;
    v1::CancelResponse response;
    ASSERT_TRUE(decode_stub_->Cancel(&c, cancel, &response).ok());
    EXPECT_TRUE(response.found());
    std::string finish;
    while (reader->Read(&message)) {
      if (!message.finish_reason().empty()) finish = message.finish_reason();
    }
    reader->Finish();
    EXPECT_EQ(finish, "abort");
  }
  // 6. No credential at all: nothing is served (service_auth_test covers every method).
  {
    auto anonymous =
        v1::Prefill::NewStub(auth::ServiceIdentity::Unauthenticated()->Dial(prefill_->address()));
    grpc::ClientContext context;
    v1::PrefillResponse response;
    EXPECT_EQ(anonymous->Prefill(&context, seen, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // Both workers still serve, and the victim's output is unchanged (from its cached blocks).
  const Streamed after = Greedy(victim);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, before.tokens);
  const Streamed fresh = Greedy(Prompt(33, 6));
  EXPECT_TRUE(fresh.status.ok()) << fresh.status.error_message();
  EXPECT_TRUE(fresh.prefilled_remotely);
}

std::vector<std::string> Backends() {
  std::vector<std::string> params = {"loopback"};
  if (kvtransfer::TransferBackendBuilt("ucx")) params.push_back("ucx");
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, AttackReplayTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
