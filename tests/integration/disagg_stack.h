#pragma once
// Test-only: a prefill worker and a decode worker over given engines in this process, joined by
// a KV transfer backend (loopback by default; cuda_ipc for GPU runners) and driven through a real
// gRPC Decode.Generate client. Used by the KV-mirror tests (disagg_mirror_test.cc on fake
// runners) and disagg_cuda_test.cc on GPUs.
//
// Ownership: DisaggStack does not own the engines; they must outlive it (Stop() shuts the workers
// down; the caller then shuts the engines down). Not thread-safe except Generate, which any
// number of threads may call at once.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "decode/decode_worker.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kvtransfer/transfer_backend.h"
#include "prefill/prefill_worker.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/secrets.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine.h"
#include "tandem/v1/decode.grpc.pb.h"

namespace tandem::testing_util {

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string finish_reason;
  bool prefilled_remotely = false;
};

inline std::string UniqueId(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return absl::StrCat(prefix, "-", counter.fetch_add(1));
}

// Decode.Generate on `stub`: greedy, EOS ignored, prefilled on `prefill_address` ("" = locally),
// collected into one Streamed.
// A greedy Decode.GenerateRequest (EOS ignored, no logprobs) with a fresh id.
inline v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens,
                                         const std::string& prefill_address) {
  v1::GenerateRequest request;
  request.set_request_id(UniqueId("req"));
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(0.0f);
  s->set_max_tokens(max_tokens);
  s->set_ignore_eos(true);
  s->set_logprobs(-1);
  request.set_prefill_worker(prefill_address);
  return request;
}

inline Streamed GreedyGenerate(v1::Decode::Stub& stub, const std::vector<int32_t>& prompt,
                               int max_tokens, const std::string& prefill_address) {
  const v1::GenerateRequest request = GreedyRequest(prompt, max_tokens, prefill_address);
  Streamed out;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse message;
  bool first = true;
  while (reader->Read(&message)) {
    if (first) out.prefilled_remotely = message.prefilled_remotely();
    first = false;
    out.tokens.insert(out.tokens.end(), message.token_ids().begin(), message.token_ids().end());
    if (!message.finish_reason().empty()) out.finish_reason = message.finish_reason();
  }
  out.status = reader->Finish();
  return out;
}

// The service identity of every in-process worker and client of these tests: a token, fresh
// per test process (the workers refuse calls without it).
inline const std::shared_ptr<const auth::ServiceIdentity>& TestIdentity() {
  static const auto* identity = new std::shared_ptr<const auth::ServiceIdentity>(
      *auth::ServiceIdentity::FromTokens({*RandomHex(16)}));
  return *identity;
}

// `options` (a worker's) with the tests' identity.
template <typename Options>
Options WithIdentity(Options options) {
  options.identity = TestIdentity();
  return options;
}

class DisaggStack {
 public:
  // Starts P over `p` and D over `d` (`backend` agents, one each). Errors: the backends' and the
  // workers' Create errors.
  absl::Status Start(Engine* p, Engine* d, const std::string& backend = "loopback") {
    ASSIGN_OR_RETURN(auto p_backend, Backend(backend, "p"));
    ASSIGN_OR_RETURN(auto d_backend, Backend(backend, "d"));
    ASSIGN_OR_RETURN(prefill_,
                     prefill::PrefillWorker::Create(p, std::move(p_backend),
                                                    WithIdentity(prefill::PrefillWorkerOptions{})));
    ASSIGN_OR_RETURN(decode_,
                     decode::DecodeWorker::Create(d, std::move(d_backend),
                                                  WithIdentity(decode::DecodeWorkerOptions{})));
    stub_ = v1::Decode::NewStub(TestIdentity()->Dial(decode_->address()));
    return absl::OkStatus();
  }
  void Stop() {
    stub_.reset();
    if (decode_ != nullptr) decode_->Shutdown(absl::ZeroDuration());
    if (prefill_ != nullptr) prefill_->Shutdown(absl::ZeroDuration());
    decode_.reset();
    prefill_.reset();
  }
  ~DisaggStack() { Stop(); }

  prefill::PrefillWorker& prefill() { return *prefill_; }
  decode::DecodeWorker& decode() { return *decode_; }

  // Greedy, EOS ignored; through P unless `remote` is false.
  Streamed Generate(const std::vector<int32_t>& prompt, int max_tokens, bool remote = true) {
    return GreedyGenerate(*stub_, prompt, max_tokens, remote ? prefill_->address() : "");
  }

 private:
  static absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> Backend(
      const std::string& name, const std::string& role) {
    kvtransfer::BackendOptions options;
    options.agent_name = UniqueId(absl::StrCat(role, "-", name));
    return kvtransfer::CreateTransferBackend(name, options);
  }

  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

// Waits until `engine` holds no blocks (every block free or cached-idle) and runs nothing.
inline bool WaitIdle(Engine& engine, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const EngineStats s = engine.stats();
    if (s.blocks_used == 0 && s.running == 0 && s.waiting == 0 && s.held_kv == 0 &&
        s.blocks_free == s.blocks_total) {
      return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace tandem::testing_util
