#include "runtime/mlp/remote_mlp_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/base/logging.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/mlp/shard_info_client.h"

namespace tandem::mlp {
namespace {

std::string GrpcMessage(const grpc::Status& s) {
  return absl::StrCat("gRPC ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> RemoteMlpBackend::Create(
    const std::vector<std::string>& addresses,
    std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
    const std::string& model_fingerprint, std::unique_ptr<MlpBackend> fallback,
    const RemoteMlpOptions& options) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("remote MLP: no shard address (remote:HOST:PORT,...)");
  }
  if (fallback != nullptr) {
    const MlpShape f = fallback->shape();
    if (f.first_layer > expected.first_layer || f.end_layer < expected.end_layer) {
      return absl::InvalidArgumentError("remote MLP: the fallback does not serve every layer");
    }
  }
  std::vector<Shard> shards;
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  for (const std::string& address : addresses) {
    if (address.empty()) return absl::InvalidArgumentError("remote MLP: an empty shard address");
    Shard shard;
    shard.address = address;
    shard.stub = tandem::v1::MlpShard::NewStub(identity->Dial(address));
    absl::StatusOr<tandem::v1::MlpInfo> info = FetchShardInfo(
        *shard.stub, address, expected, model_fingerprint, give_up, "remote MLP", &shard.shape);
    if (!info.ok()) return info.status();
    shards.push_back(std::move(shard));
  }
  std::vector<MlpShape> served;
  for (const Shard& s : shards) served.push_back(s.shape);
  if (const std::vector<int> unserved = UnservedLayers(expected, served); !unserved.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote MLP: no shard serves layer(s) ", absl::StrJoin(unserved, ","),
                     " (shards: ", absl::StrJoin(addresses, ","), ")"));
  }
  return std::unique_ptr<RemoteMlpBackend>(
      new RemoteMlpBackend(std::move(shards), expected, std::move(fallback), options));
}

RemoteMlpBackend::RemoteMlpBackend(std::vector<Shard> shards, const MlpShape& expected,
                                   std::unique_ptr<MlpBackend> fallback,
                                   const RemoteMlpOptions& options)
    : shards_(std::move(shards)),
      expected_(expected),
      fallback_(std::move(fallback)),
      options_(options) {}

RemoteMlpBackend::~RemoteMlpBackend() {
  // Cancel what is in flight and wait for every callback (cancelled calls complete promptly)
  // before the calls, stubs and channels go.
  std::vector<std::shared_ptr<Call>> calls = std::move(abandoned_);
  for (auto& [handle, p] : pending_) {
    if (p.call != nullptr) calls.push_back(p.call);
  }
  for (const auto& call : calls) call->context.TryCancel();
  for (const auto& call : calls) {
    absl::MutexLock lock(&call->mu);
    if (!call->mu.AwaitWithTimeout(absl::Condition(&call->done), absl::Seconds(10))) {
      LOG(ERROR) << "remote MLP: a cancelled call did not complete in 10 s; leaking it";
      new std::shared_ptr<Call>(call);  // never destroyed under a live callback
    }
  }
}

void RemoteMlpBackend::Reap() {
  std::erase_if(abandoned_, [](const std::shared_ptr<Call>& call) {
    absl::MutexLock lock(&call->mu);
    return call->done;
  });
}

int RemoteMlpBackend::PickShard(int layer, const std::vector<size_t>& tried, absl::Time now) {
  const size_t n = shards_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (round_robin_ + k) % n;
    if (!shards_[i].shape.Serves(layer) || shards_[i].retry_at > now ||
        std::find(tried.begin(), tried.end(), i) != tried.end()) {
      continue;
    }
    round_robin_ = i + 1;
    return static_cast<int>(i);
  }
  return -1;
}

void RemoteMlpBackend::StartCall(Pending& p, size_t shard, absl::Time now) {
  auto call = std::make_shared<Call>();
  call->context.set_deadline(absl::ToChronoTime(std::min(p.deadline, now + options_.call_timeout)));
  call->request.set_layer(static_cast<uint32_t>(p.layer));
  call->request.set_rows(static_cast<uint32_t>(p.rows));
  call->request.set_activations(
      reinterpret_cast<const char*>(p.x),
      static_cast<size_t>(p.rows) * static_cast<size_t>(expected_.hidden_size) * sizeof(float));
  p.tried.push_back(shard);
  p.call = call;
  Call* raw = call.get();
  shards_[shard].stub->async()->Compute(&call->context, &call->request, &call->response,
                                        [raw](grpc::Status status) {
                                          absl::MutexLock lock(&raw->mu);
                                          raw->status = std::move(status);
                                          raw->done = true;
                                        });
}

void RemoteMlpBackend::Failed(size_t shard, absl::Time now) {
  Shard& s = shards_[shard];
  s.backoff = s.backoff == absl::ZeroDuration() ? options_.backoff_initial
                                                : std::min(options_.backoff_max, s.backoff * 2);
  s.retry_at = now + s.backoff;
}

void RemoteMlpBackend::Succeeded(size_t shard) {
  shards_[shard].backoff = absl::ZeroDuration();
  shards_[shard].retry_at = absl::InfinitePast();
}

absl::StatusOr<MlpBackend::Handle> RemoteMlpBackend::Submit(int layer, const float* x, int rows,
                                                            float* out, absl::Time deadline) {
  if (!expected_.Serves(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("remote MLP: layer ", layer, " is not in ",
                                                   expected_.first_layer, ":",
                                                   expected_.end_layer));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("remote MLP: ", rows, " rows"));
  Reap();
  const absl::Time now = absl::Now();
  Pending p;
  p.layer = layer;
  p.x = x;
  p.rows = rows;
  p.out = out;
  p.deadline = deadline;
  const int shard = PickShard(layer, {}, now);
  if (shard < 0) {
    if (fallback_ == nullptr) {
      ++stats_.failures;
      return absl::UnavailableError(absl::StrCat(
          "remote MLP: every shard serving layer ", layer,
          " failed recently and is backing off; no fallback (--mlp-fallback cpu keeps one)"));
    }
    ++stats_.failovers;
    absl::StatusOr<Handle> h = fallback_->Submit(layer, x, rows, out, deadline);
    if (!h.ok()) return h.status();
    p.on_fallback = true;
    p.fallback_handle = *h;
  } else {
    StartCall(p, static_cast<size_t>(shard), now);
  }
  ++stats_.calls;
  stats_.rows += rows;
  const Handle handle = next_++;
  pending_.emplace(handle, std::move(p));
  return handle;
}

absl::Status RemoteMlpBackend::Wait(Handle handle) {
  auto it = pending_.find(handle);
  if (it == pending_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("remote MLP: unknown handle ", handle));
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  if (p.on_fallback) {
    absl::Status s = fallback_->Wait(p.fallback_handle);
    if (!s.ok()) ++stats_.failures;
    return s;
  }
  const size_t bytes = ComputeBytes(p.rows, expected_);
  std::vector<std::string> errors;
  while (true) {
    const size_t shard = p.tried.back();
    Call& call = *p.call;
    grpc::Status status;
    bool done;
    {
      absl::MutexLock lock(&call.mu);
      // The call's own deadline ends it; a little grace for its callback to run.
      done = call.mu.AwaitWithDeadline(
          absl::Condition(&call.done),
          absl::FromChrono(call.context.deadline()) + absl::Milliseconds(500));
      if (done) status = call.status;
    }
    const absl::Time now = absl::Now();
    if (!done) {
      call.context.TryCancel();
      abandoned_.push_back(p.call);  // its callback has not run: keep it until it has
      status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer by the deadline");
    }
    if (status.ok() && call.response.output().size() != bytes) {
      status = grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("answered ", call.response.output().size(), " bytes for ", bytes));
    }
    if (status.ok()) {
      std::memcpy(p.out, call.response.output().data(), bytes);
      Succeeded(shard);
      return absl::OkStatus();
    }
    Failed(shard, now);
    errors.push_back(absl::StrCat(shards_[shard].address, ": ", GrpcMessage(status)));
    if (now >= p.deadline) {
      ++stats_.failures;
      return absl::DeadlineExceededError(absl::StrCat(
          "remote MLP: layer ", p.layer, " past its deadline (", absl::StrJoin(errors, "; "), ")"));
    }
    const int next = PickShard(p.layer, p.tried, now);
    if (next >= 0) {
      ++stats_.failovers;
      StartCall(p, static_cast<size_t>(next), now);
      continue;
    }
    if (fallback_ != nullptr) {
      ++stats_.failovers;
      absl::Status s = fallback_->Run(p.layer, p.x, p.rows, p.out, p.deadline);
      if (!s.ok()) ++stats_.failures;
      return s;
    }
    ++stats_.failures;
    return absl::UnavailableError(absl::StrCat("remote MLP: no shard computed layer ", p.layer,
                                               " (", absl::StrJoin(errors, "; "), ")"));
  }
}

}  // namespace tandem::mlp
