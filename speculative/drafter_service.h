#pragma once
// DrafterService: tandem.v1.Drafter (proto/tandem/v1/drafter.proto) over one local Drafter (the
// n-gram index or a draft model), for many decode workers.
//
// - State: for each (client, sequence) the tokens it sent, so a call sends only what changed
//   (from `start`). A sequence the server does not hold up to `start` answers resync. At most
//   max_sequences are kept; the least recently used is evicted (and released in the drafter).
// - Batching: handlers queue their sequences; one drafter thread takes everything queued, from
//   every worker, and asks the drafter once (the earliest deadline of the batch), so a draft
//   model steps all of them together, and only that thread touches it (and its device).
// - Untrusted input: every call is authenticated first (UNAUTHENTICATED touches nothing); then a
//   bad client id, more than max_sequences_per_call sequences, max_tokens outside 1..64, a
//   negative token or one outside `vocab_size`, num_prompt_tokens past the sequence, or more
//   than max_tokens_per_sequence tokens is INVALID_ARGUMENT naming the field, and changes
//   nothing. A call that is cancelled or past its deadline before the drafter gets to it is
//   answered DEADLINE_EXCEEDED without drafting.
//
// Threading: gRPC handler threads and the drafter thread; Shutdown (or destruction) stops the
// thread after answering what is queued with UNAVAILABLE.

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "runtime/auth/service_identity.h"
#include "speculative/drafter.h"
#include "tandem/v1/drafter.grpc.pb.h"

namespace tandem::speculative {

struct DrafterServiceOptions {
  int vocab_size = 0;  // tokens must be below it; 0: not checked (n-gram drafts any id)
  int max_sequences = 4096;
  int max_sequences_per_call = 4096;
  int max_tokens_per_sequence = 1 << 20;
};

struct DrafterServiceStats {
  int64_t calls = 0;
  int64_t batches = 0;          // drafter invocations
  int64_t sequences = 0;        // sequences drafted for
  int64_t tokens_received = 0;  // sequence tokens sent by clients
  int64_t resyncs = 0;
  int64_t evictions = 0;
  int64_t rejected = 0;  // INVALID_ARGUMENT or UNAUTHENTICATED calls
};

class DrafterService final : public tandem::v1::Drafter::Service {
 public:
  DrafterService(std::unique_ptr<Drafter> drafter,
                 std::shared_ptr<const auth::ServiceIdentity> identity,
                 const DrafterServiceOptions& options);
  ~DrafterService() override;
  DrafterService(const DrafterService&) = delete;
  DrafterService& operator=(const DrafterService&) = delete;

  grpc::Status Propose(grpc::ServerContext* context, const tandem::v1::ProposeRequest* request,
                       tandem::v1::ProposeResponse* response) override;

  void Shutdown();
  DrafterServiceStats stats() const;
  int live_sequences() const;

 private:
  struct Key {
    std::string client;
    uint64_t sequence;
    bool operator==(const Key& o) const { return client == o.client && sequence == o.sequence; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.client, k.sequence);
    }
  };
  struct State {
    int64_t id = 0;  // the drafter's key
    std::vector<int32_t> tokens;
    std::list<Key>::iterator lru;  // position in lru_ (front: most recent)
  };
  // One queued call: its sequences' tokens (copies: the states may change meanwhile), the
  // requests over them, and the answer. Shared by the handler and the drafter thread, so a
  // handler that gives up waiting leaves nothing dangling.
  struct Job {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<DraftRequest> requests;
    absl::Time deadline;
    bool done = false;  // guarded by mu_
    absl::Status status;
    std::vector<std::vector<int32_t>> drafts;
  };

  void Loop();
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  const DrafterServiceOptions options_;
  std::unique_ptr<Drafter> drafter_;  // the drafter thread's alone

  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, State> states_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> to_release_ ABSL_GUARDED_BY(mu_);  // drafter keys to Release
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  DrafterServiceStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::speculative
