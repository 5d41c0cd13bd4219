#pragma once
// A TransferBackend wrapper that makes chosen stages fail, for tests of everything that moves KV
// (STYLE.md 10: every handoff test also runs once per failure point). It forwards every call to
// the wrapped backend except where its FaultPlan says to fail:
//   kRegister, kExport, kConnect, kPost: the call returns an injected error and does nothing.
//   kAccept: the target's Accept returns an injected error and does nothing (ConnectReply is
//     always forwarded).
//   kMidTransfer: the next posted transfer is posted WITHOUT its notification (as if the link
//     died mid-way, the target never hears of it), reports kInProgress for `polls_before_failure`
//     polls and then kFailed; Release still releases the inner transfer.
//   kRelease: Release releases the inner transfer (nothing leaks) and then returns an error.
//   kNotificationDrop: the next notification is lost: stripped from a posted transfer (which
//     still completes kDone) or dropped from GetNotifications, whichever comes first.
// `once` = the fault fires once and the plan disarms; otherwise it fires on every such call.
// Injected errors are absl::UnavailableError with "injected fault" in the message.
//
// Threading: calls to the TransferBackend methods follow the wrapped backend's rule (one owning
// thread). SetPlan and faults_injected may be called from any thread (mutex-guarded), so a test
// can arm a fault while a worker's transfer thread owns the backend.

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

enum class FaultStage {
  kNone,
  kRegister,
  kExport,
  kConnect,
  kPost,
  kMidTransfer,
  kRelease,
  kNotificationDrop,
  kAccept,
};

struct FaultPlan {
  FaultStage stage = FaultStage::kNone;
  bool once = true;
  int polls_before_failure = 0;  // kMidTransfer only
};

class FaultInjectingBackend final : public TransferBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<TransferBackend> inner, FaultPlan plan = {});

  void SetPlan(FaultPlan plan);
  // How many faults fired so far.
  int faults_injected() const;
  TransferBackend& inner() { return *inner_; }

  std::string_view name() const override { return inner_->name(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  const std::string& agent_name() const override { return inner_->agent_name(); }
  absl::StatusOr<std::string> LocalAddress() override { return inner_->LocalAddress(); }
  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override;
  absl::Status DeregisterMemory(uint64_t region_id) override {
    return inner_->DeregisterMemory(region_id);
  }
  absl::Status Connect(const std::string& peer, const std::string& address) override;
  absl::StatusOr<std::string> ConnectReply(const std::string& peer) override {
    return inner_->ConnectReply(peer);
  }
  absl::Status Accept(const std::string& peer, const std::string& reply) override;
  absl::Status Disconnect(const std::string& peer) override { return inner_->Disconnect(peer); }
  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override;
  absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) override;
  absl::StatusOr<TransferState> Poll(TransferHandle handle) override;
  absl::Status Release(TransferHandle handle) override;
  void Progress() override { inner_->Progress(); }
  std::vector<Notification> GetNotifications() override;

 private:
  // True (and counts the fault, disarming a `once` plan) when `stage` should fail now.
  bool Fire(FaultStage stage);
  absl::StatusOr<TransferHandle> Post(const TransferRequest& request, bool write);

  const std::unique_ptr<TransferBackend> inner_;
  mutable absl::Mutex mu_;
  FaultPlan plan_ ABSL_GUARDED_BY(mu_);
  int faults_injected_ ABSL_GUARDED_BY(mu_) = 0;
  // Doomed transfers (kMidTransfer): handle -> polls left before kFailed.
  absl::flat_hash_map<TransferHandle, int> doomed_;
};

}  // namespace tandem::kvtransfer
