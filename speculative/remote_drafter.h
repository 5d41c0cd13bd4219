#pragma once
// RemoteDrafter ("remote:ADDR[,ADDR...]"): the Drafter interface over `tandem drafter` services
// (drafter_service.h, proto/tandem/v1/drafter.proto).
//
// - Each sequence goes to one server (its key's hash picks it), which keeps its tokens: a call
//   sends only the tokens after what that server already holds; an answer of resync (the server
//   restarted or evicted the sequence) resends it from the start next time.
// - The calls of one Propose go to their servers at once and are waited for until the engine's
//   deadline; finished sequences are reported in the next call to their server.
// - A server that fails (error, deadline) is skipped for a backoff that doubles from
//   backoff_initial to backoff_max while it keeps failing, so a dead or frozen drafter costs at
//   most one deadline per backoff, not one per step; its sequences get no drafts meanwhile and
//   are resent from the start once it answers again. Propose fails only when every server it
//   needed failed or was skipped.
// - Every call presents the deployment's service credential (auth::ServiceIdentity).
//
// Thread-compatible (the engine thread).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "speculative/drafter.h"
#include "tandem/v1/drafter.grpc.pb.h"

namespace tandem::speculative {

struct RemoteDrafterOptions {
  absl::Duration backoff_initial = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(10);
};

struct RemoteDrafterStats {
  int64_t calls = 0;
  int64_t failed_calls = 0;
  int64_t skipped_calls = 0;  // a server in backoff
  int64_t tokens_sent = 0;
  int64_t resyncs = 0;
};

class RemoteDrafter : public Drafter {
 public:
  // InvalidArgument for no address or an empty one.
  static absl::StatusOr<std::unique_ptr<RemoteDrafter>> Create(
      const std::vector<std::string>& addresses,
      std::shared_ptr<const auth::ServiceIdentity> identity,
      const RemoteDrafterOptions& options = {});
  std::string_view name() const override { return "remote"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(std::span<const DraftRequest> requests,
                                                            absl::Time deadline) override;
  void Release(int64_t key, std::span<const int32_t> tokens, int num_prompt_tokens) override;

  const RemoteDrafterStats& stats() const { return stats_; }

 private:
  struct Server {
    std::string address;
    std::unique_ptr<tandem::v1::Drafter::Stub> stub;
    absl::Time retry_at = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    std::vector<uint64_t> released;  // to report in the next call
  };
  RemoteDrafter(std::vector<Server> servers, const RemoteDrafterOptions& options);
  size_t ServerOf(int64_t key) const;
  void Failed(Server& server, absl::Time now);

  std::vector<Server> servers_;
  RemoteDrafterOptions options_;
  std::string client_;                                       // this instance's id (random)
  absl::flat_hash_map<int64_t, std::vector<int32_t>> sent_;  // what each server holds per key
  RemoteDrafterStats stats_;
};

}  // namespace tandem::speculative
