#include "speculative/remote_drafter.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "runtime/base/logging.h"

namespace tandem::speculative {

RemoteDrafter::RemoteDrafter(std::vector<Server> servers, const RemoteDrafterOptions& options)
    : servers_(std::move(servers)), options_(options) {
  std::random_device rd;
  client_ = absl::StrCat("worker-",
                         absl::Hex(static_cast<uint64_t>(rd()) << 32 | rd(), absl::kZeroPad16));
}

absl::StatusOr<std::unique_ptr<RemoteDrafter>> RemoteDrafter::Create(
    const std::vector<std::string>& addresses,
    std::shared_ptr<const auth::ServiceIdentity> identity, const RemoteDrafterOptions& options) {
  if (addresses.empty()) return absl::InvalidArgumentError("remote drafter: no address");
  if (identity == nullptr) return absl::InvalidArgumentError("remote drafter: no identity");
  std::vector<Server> servers;
  for (const std::string& address : addresses) {
    if (address.empty()) return absl::InvalidArgumentError("remote drafter: an empty address");
    Server s;
    s.address = address;
    s.stub = tandem::v1::Drafter::NewStub(identity->Dial(address));
    servers.push_back(std::move(s));
  }
  return std::unique_ptr<RemoteDrafter>(new RemoteDrafter(std::move(servers), options));
}

size_t RemoteDrafter::ServerOf(int64_t key) const {
  return absl::Hash<int64_t>{}(key) % servers_.size();
}

void RemoteDrafter::Failed(Server& server, absl::Time now) {
  server.backoff = server.backoff == absl::ZeroDuration()
                       ? options_.backoff_initial
                       : std::min(server.backoff * 2, options_.backoff_max);
  server.retry_at = now + server.backoff;
  // What it held is unknown now: resend its sequences from the start.
  for (auto it = sent_.begin(); it != sent_.end();) {
    auto next = std::next(it);
    if (&servers_[ServerOf(it->first)] == &server) sent_.erase(it);
    it = next;
  }
}

void RemoteDrafter::Release(int64_t key, std::span<const int32_t>, int) {
  sent_.erase(key);
  Server& server = servers_[ServerOf(key)];
  if (server.released.size() < 65536) server.released.push_back(static_cast<uint64_t>(key));
}

absl::StatusOr<std::vector<std::vector<int32_t>>> RemoteDrafter::Propose(
    std::span<const DraftRequest> requests, absl::Time deadline) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<int32_t>> drafts(requests.size());
  struct Call {
    tandem::v1::ProposeRequest request;
    std::vector<size_t> indices;  // into requests
    grpc::ClientContext context;
    tandem::v1::ProposeResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<tandem::v1::ProposeResponse>> rpc;
  };
  std::vector<std::unique_ptr<Call>> calls(servers_.size());
  int needed = 0, skipped = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    const size_t s = ServerOf(r.key);
    if (calls[s] == nullptr) {
      ++needed;
      if (now < servers_[s].retry_at) {
        ++skipped;
        ++stats_.skipped_calls;
        calls[s] = std::make_unique<Call>();  // marks it skipped: no rpc
        continue;
      }
      calls[s] = std::make_unique<Call>();
      calls[s]->request.set_client(client_);
      for (uint64_t k : servers_[s].released) calls[s]->request.add_released(k);
      servers_[s].released.clear();
    }
    Call& call = *calls[s];
    if (now < servers_[s].retry_at) continue;
    std::vector<int32_t>& sent = sent_[r.key];
    const size_t agree =
        std::mismatch(sent.begin(), sent.end(), r.tokens.begin(), r.tokens.end()).first -
        sent.begin();
    tandem::v1::DraftSequence* seq = call.request.add_sequences();
    seq->set_sequence(static_cast<uint64_t>(r.key));
    seq->set_start(static_cast<uint32_t>(agree));
    seq->mutable_tokens()->Add(r.tokens.begin() + static_cast<std::ptrdiff_t>(agree),
                               r.tokens.end());
    seq->set_num_prompt_tokens(static_cast<uint32_t>(r.num_prompt_tokens));
    seq->set_max_tokens(static_cast<uint32_t>(std::clamp(r.max_tokens, 1, 64)));
    stats_.tokens_sent += static_cast<int64_t>(r.tokens.size() - agree);
    sent.assign(r.tokens.begin(), r.tokens.end());  // what the server holds once it answers
    call.indices.push_back(i);
  }
  grpc::CompletionQueue cq;
  int in_flight = 0;
  for (size_t s = 0; s < calls.size(); ++s) {
    if (calls[s] == nullptr || calls[s]->indices.empty()) continue;
    Call& call = *calls[s];
    call.context.set_deadline(absl::ToChronoTime(deadline));
    call.rpc = servers_[s].stub->AsyncPropose(&call.context, call.request, &cq);
    call.rpc->Finish(&call.response, &call.status, reinterpret_cast<void*>(s));
    ++in_flight;
    ++stats_.calls;
  }
  int failed = skipped;
  std::vector<std::string> errors;
  for (; in_flight > 0; --in_flight) {
    void* tag = nullptr;
    bool ok = false;
    // Each call ends by its deadline (gRPC cancels it then), so Next returns.
    if (!cq.Next(&tag, &ok)) break;
    const size_t s = reinterpret_cast<size_t>(tag);
    Call& call = *calls[s];
    Server& server = servers_[s];
    if (!ok || !call.status.ok() ||
        call.response.drafts_size() != static_cast<int>(call.indices.size())) {
      ++failed;
      ++stats_.failed_calls;
      errors.push_back(absl::StrCat(
          server.address, ": ",
          !ok || !call.status.ok()
              ? absl::StrCat(absl::StatusCodeToString(
                                 static_cast<absl::StatusCode>(call.status.error_code())),
                             ": ", call.status.error_message())
              : absl::StrCat(call.response.drafts_size(), " answers for ", call.indices.size())));
      Failed(server, absl::Now());
      continue;
    }
    server.backoff = absl::ZeroDuration();
    server.retry_at = absl::InfinitePast();
    for (size_t j = 0; j < call.indices.size(); ++j) {
      const tandem::v1::SequenceDrafts& d = call.response.drafts(static_cast<int>(j));
      const size_t i = call.indices[j];
      if (d.resync()) {
        ++stats_.resyncs;
        sent_.erase(requests[i].key);
        continue;
      }
      drafts[i].assign(d.tokens().begin(), d.tokens().end());  // the engine validates them
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  if (needed > 0 && failed == needed) {
    return absl::UnavailableError(errors.empty()
                                      ? std::string("every drafter is backing off after failures")
                                      : absl::StrJoin(errors, "; "));
  }
  return drafts;
}

}  // namespace tandem::speculative
