// The services' authentication drift test: every method of every gRPC service a worker serves
// (found by reflection over the generated descriptors, so a method added later is covered without
// editing this file) is called without a credential and with a wrong one, on a real prefill and
// decode worker. Each call must end UNAUTHENTICATED and touch nothing: no request reaches either
// engine, no pair is made, no stats stream is opened. With the right token every method gets
// past authentication (so the test cannot pass by refusing everything).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/fake_model_runner.h"
#include "tests/integration/disagg_stack.h"

namespace tandem {
namespace {

using testing_util::DisaggStack;
using testing_util::TestIdentity;
using testing_util::WaitIdle;

constexpr int kVocab = 64;
constexpr int kBlock = 4;

std::unique_ptr<Engine> NewEngine() {
  auto created = Engine::Create(std::make_unique<FakeModelRunner>(kVocab, 64, kBlock, 1024),
                                nullptr, EngineOptions{});
  CHECK(created.ok()) << created.status();
  return std::move(*created);
}

struct CallResult {
  grpc::Status status;
  int responses = 0;
};

// One call of `method` ("/package.Service/Method") with `request` as its only message, through
// the generic API (works for unary and streaming methods alike), with a deadline.
CallResult CallMethod(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                      const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  CallResult out;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  if (ok) {
    grpc::Slice slice(request);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    // Two messages are enough to tell a stream that went past authentication; then cancel.
    grpc::ByteBuffer response;
    while (out.responses < 2) {
      call->Read(&response, reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
      if (!ok) break;
      ++out.responses;
    }
    if (out.responses == 2) context.TryCancel();
  }
  call->Finish(&out.status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

// A realistic request for each method that could change state if it got through; an empty
// message for the rest.
std::string RequestFor(const std::string& full_method, const std::string& prefill_address) {
  if (full_method == "tandem.v1.Decode.Generate") {
    return testing_util::GreedyRequest({1, 2, 3, 4, 5, 6, 7, 8, 9}, 4, prefill_address)
        .SerializeAsString();
  }
  if (full_method == "tandem.v1.Prefill.Prefill") {
    v1::PrefillRequest request;
    request.set_request_id("intruder");
    for (int t = 1; t < 10; ++t) request.add_prompt_token_ids(t);
    request.set_pair_id("00000000000000000000000000000000");
    request.set_transfer_epoch(1);
    request.mutable_target()->add_block_ids(0);
    request.mutable_target()->add_block_ids(1);
    request.mutable_target()->add_block_ids(2);
    return request.SerializeAsString();
  }
  if (full_method == "tandem.v1.Decode.Cancel") {
    v1::CancelRequest request;
    request.set_request_id("anything");
    return request.SerializeAsString();
  }
  return "";
}

struct ServedMethod {
  std::string address;    // the worker serving it
  std::string path;       // "/tandem.v1.Decode/Generate"
  std::string full_name;  // "tandem.v1.Decode.Generate"
};

class ServiceAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(stack_.Start(p_.get(), d_.get()).ok());
    const auto* pool = google::protobuf::DescriptorPool::generated_pool();
    const std::vector<std::pair<std::string, std::vector<std::string>>> servers = {
        {stack_.prefill().address(),
         {"tandem.v1.Prefill", "tandem.v1.Worker", "grpc.health.v1.Health"}},
        {stack_.decode().address(),
         {"tandem.v1.Decode", "tandem.v1.Worker", "grpc.health.v1.Health"}},
    };
    for (const auto& [address, services] : servers) {
      for (const std::string& name : services) {
        const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
        ASSERT_NE(service, nullptr) << name << " is not linked in";
        for (int i = 0; i < service->method_count(); ++i) {
          const google::protobuf::MethodDescriptor* method = service->method(i);
          methods_.push_back(
              {address, absl::StrCat("/", name, "/", method->name()), method->full_name()});
        }
      }
    }
    // Prefill 3, Decode 2, Worker 1 twice, Health 2 twice.
    ASSERT_GE(methods_.size(), 11u);
  }
  void TearDown() override {
    stack_.Stop();
    p_->Shutdown(absl::ZeroDuration());
    d_->Shutdown(absl::ZeroDuration());
  }
  // Both engines idle and never asked for anything.
  void ExpectUntouched() {
    for (Engine* engine : {p_.get(), d_.get()}) {
      const EngineStats stats = engine->stats();
      EXPECT_EQ(stats.waiting, 0);
      EXPECT_EQ(stats.running, 0);
      EXPECT_EQ(stats.blocks_used, 0);
      EXPECT_EQ(stats.held_kv, 0);
    }
  }

  std::unique_ptr<Engine> p_ = NewEngine();
  std::unique_ptr<Engine> d_ = NewEngine();
  DisaggStack stack_;
  std::vector<ServedMethod> methods_;
};

TEST_F(ServiceAuthTest, EveryMethodRefusesCallsWithoutTheServiceCredential) {
  auto wrong = auth::ServiceIdentity::FromTokens({"not-this-deployment-0123456789"});
  ASSERT_TRUE(wrong.ok());
  const std::vector<std::pair<std::string, std::shared_ptr<const auth::ServiceIdentity>>> callers =
      {{"no credential", auth::ServiceIdentity::Unauthenticated()}, {"a wrong token", *wrong}};
  for (const auto& [who, identity] : callers) {
    for (const ServedMethod& m : methods_) {
      const CallResult result = CallMethod(identity->Dial(m.address), m.path,
                                           RequestFor(m.full_name, stack_.prefill().address()));
      EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << m.path << " on " << m.address << " with " << who << ": "
          << result.status.error_message();
      EXPECT_EQ(result.responses, 0) << m.path << " with " << who;
    }
  }
  ExpectUntouched();
}

TEST_F(ServiceAuthTest, EveryMethodAdmitsTheDeploymentsCredential) {
  for (const ServedMethod& m : methods_) {
    const CallResult result = CallMethod(TestIdentity()->Dial(m.address), m.path,
                                         RequestFor(m.full_name, stack_.prefill().address()));
    EXPECT_NE(result.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << m.path << ": " << result.status.error_message();
  }
  // The authenticated Generate ran (through the prefill worker) and everything came back.
  EXPECT_TRUE(WaitIdle(*p_));
  EXPECT_TRUE(WaitIdle(*d_));
}

}  // namespace
}  // namespace tandem
