#include "speculative/drafter_service.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::speculative {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

bool PrintableId(const std::string& id) {
  return !id.empty() && id.size() <= 64 &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

}  // namespace

DrafterService::DrafterService(std::unique_ptr<Drafter> drafter,
                               std::shared_ptr<const auth::ServiceIdentity> identity,
                               const DrafterServiceOptions& options)
    : identity_(std::move(identity)), options_(options), drafter_(std::move(drafter)) {
  thread_ = std::thread([this] { Loop(); });
}

DrafterService::~DrafterService() { Shutdown(); }

void DrafterService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

DrafterServiceStats DrafterService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

int DrafterService::live_sequences() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(states_.size());
}

void DrafterService::Evict() {
  while (static_cast<int>(states_.size()) > options_.max_sequences) {
    const Key key = lru_.back();
    lru_.pop_back();
    auto it = states_.find(key);
    to_release_.push_back(it->second.id);
    states_.erase(it);
    ++stats_.evictions;
  }
}

grpc::Status DrafterService::Propose(grpc::ServerContext* context,
                                     const tandem::v1::ProposeRequest* request,
                                     tandem::v1::ProposeResponse* response) {
  if (grpc::Status auth = identity_->Authenticate(*context); !auth.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.rejected;
    return auth;
  }
  // Validate the whole call before changing anything.
  const auto reject = [&](const std::string& message) {
    absl::MutexLock lock(&mu_);
    ++stats_.rejected;
    return Invalid(message);
  };
  if (!PrintableId(request->client())) {
    return reject("client: must be 1 to 64 printable characters");
  }
  if (request->sequences_size() > options_.max_sequences_per_call) {
    return reject(absl::StrCat("sequences: ", request->sequences_size(), " in one call, at most ",
                               options_.max_sequences_per_call));
  }
  for (int i = 0; i < request->sequences_size(); ++i) {
    const tandem::v1::DraftSequence& s = request->sequences(i);
    const std::string where = absl::StrCat("sequences[", i, "]");
    if (s.max_tokens() < 1 || s.max_tokens() > 64) {
      return reject(absl::StrCat(where, ".max_tokens: ", s.max_tokens(), " is not in 1..64"));
    }
    if (static_cast<int64_t>(s.start()) + s.tokens_size() > options_.max_tokens_per_sequence) {
      return reject(
          absl::StrCat(where, ": longer than ", options_.max_tokens_per_sequence, " tokens"));
    }
    if (s.start() == 0 && s.tokens_size() == 0) {
      return reject(absl::StrCat(where, ".tokens: empty"));
    }
    for (int32_t t : s.tokens()) {
      if (t < 0 || (options_.vocab_size > 0 && t >= options_.vocab_size)) {
        return reject(absl::StrCat(where, ".tokens: ", t, " is outside the vocabulary"));
      }
    }
    if (s.num_prompt_tokens() > s.start() + static_cast<uint32_t>(s.tokens_size())) {
      return reject(absl::StrCat(where, ".num_prompt_tokens: past the sequence's end"));
    }
  }

  auto job = std::make_shared<Job>();
  job->deadline = std::min(absl::FromChrono(context->deadline()),
                           absl::Now() + absl::Seconds(10));  // no deadline: 10 s
  std::vector<int> job_index(request->sequences_size(), -1);  // -1: resync
  {
    absl::MutexLock lock(&mu_);
    ++stats_.calls;
    for (uint64_t released : request->released()) {
      auto it = states_.find(Key{request->client(), released});
      if (it == states_.end()) continue;
      lru_.erase(it->second.lru);
      to_release_.push_back(it->second.id);
      states_.erase(it);
    }
    for (int i = 0; i < request->sequences_size(); ++i) {
      const tandem::v1::DraftSequence& s = request->sequences(i);
      stats_.tokens_received += s.tokens_size();
      const Key key{request->client(), s.sequence()};
      auto it = states_.find(key);
      if (it == states_.end() && s.start() > 0) {
        ++stats_.resyncs;
        continue;
      }
      if (it == states_.end()) {
        lru_.push_front(key);
        State state;
        state.id = next_id_++;
        state.lru = lru_.begin();
        it = states_.emplace(key, std::move(state)).first;
      } else {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
      }
      State& state = it->second;
      if (s.start() > state.tokens.size()) {
        ++stats_.resyncs;
        continue;
      }
      state.tokens.resize(s.start());
      state.tokens.insert(state.tokens.end(), s.tokens().begin(), s.tokens().end());
      if (state.tokens.empty()) {
        ++stats_.resyncs;
        continue;
      }
      job_index[i] = static_cast<int>(job->tokens.size());
      job->tokens.push_back(state.tokens);
      DraftRequest r;
      r.key = state.id;
      r.num_prompt_tokens = static_cast<int>(s.num_prompt_tokens());
      r.max_tokens = static_cast<int>(s.max_tokens());
      job->requests.push_back(r);
    }
    Evict();
    for (size_t j = 0; j < job->requests.size(); ++j) job->requests[j].tokens = job->tokens[j];
    if (!job->requests.empty()) queue_.push_back(job);
  }
  if (!job->requests.empty()) {
    absl::MutexLock lock(&mu_);
    const bool done =
        mu_.AwaitWithDeadline(absl::Condition(&job->done), job->deadline + absl::Seconds(1));
    if (!done) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the drafter did not answer");
    }
    if (!job->status.ok()) return ToGrpc(job->status);
  }
  for (int i = 0; i < request->sequences_size(); ++i) {
    tandem::v1::SequenceDrafts* d = response->add_drafts();
    if (job_index[i] < 0) {
      d->set_resync(true);
      continue;
    }
    const std::vector<int32_t>& tokens = job->drafts[static_cast<size_t>(job_index[i])];
    const size_t n =
        std::min(tokens.size(), static_cast<size_t>(request->sequences(i).max_tokens()));
    d->mutable_tokens()->Add(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return grpc::Status::OK;
}

void DrafterService::Loop() {
  while (true) {
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<int64_t> release;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty() || !to_release_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      release.swap(to_release_);
      jobs.assign(queue_.begin(), queue_.end());
      queue_.clear();
      if (stopping_) {
        for (const auto& job : jobs) {
          job->status = absl::UnavailableError("the drafter is shutting down");
          job->done = true;
        }
        return;
      }
    }
    for (int64_t id : release) drafter_->Release(id, {}, 0);
    if (jobs.empty()) continue;
    // Every worker's sequences in one call; jobs already past their deadline get none.
    const absl::Time now = absl::Now();
    std::vector<DraftRequest> all;
    absl::Time deadline = absl::InfiniteFuture();
    std::vector<std::shared_ptr<Job>> live;
    for (const auto& job : jobs) {
      if (job->deadline <= now) {
        absl::MutexLock lock(&mu_);
        job->status = absl::DeadlineExceededError("past its deadline before drafting");
        job->done = true;
        continue;
      }
      all.insert(all.end(), job->requests.begin(), job->requests.end());
      deadline = std::min(deadline, job->deadline);
      live.push_back(job);
    }
    if (live.empty()) continue;
    absl::StatusOr<std::vector<std::vector<int32_t>>> drafts = drafter_->Propose(all, deadline);
    if (drafts.ok() && drafts->size() != all.size()) {
      drafts = absl::InternalError("the drafter answered for another number of sequences");
    }
    absl::MutexLock lock(&mu_);
    ++stats_.batches;
    stats_.sequences += static_cast<int64_t>(all.size());
    size_t next = 0;
    for (const auto& job : live) {
      if (!drafts.ok()) {
        job->status = drafts.status();
      } else {
        job->drafts.assign(std::make_move_iterator(drafts->begin() + next),
                           std::make_move_iterator(drafts->begin() + next + job->requests.size()));
      }
      next += job->requests.size();
      job->done = true;
    }
  }
}

}  // namespace tandem::speculative
