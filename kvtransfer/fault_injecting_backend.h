#pragma once
// A TransferBackend wrapper that makes chosen stages fail, for tests of everything that moves KV
// (STYLE.md 10: every handoff test also runs once per failure point). It forwards every call to
// the wrapped backend except where its FaultPlan says to fail:
//   kRegister, kExport, kConnect, kPost: the call returns an injected error and does nothing.
//   kAccept: the target's Accept returns an injected error and does nothing (ConnectReply is
//     always forwarded).
//   kMidTransfer: the next posted transfer is posted WITHOUT its notification (as if the link
//     died mid-way, the target never hears of it), reports kInProgress for `polls_before_failure`
//     polls and then kFailed; Release still releases the inner transfer. The wrapped transfer
//     runs on meanwhile: mid_transfers_landed() counts those the wrapped backend reported kDone.
//   kRelease: Release releases the inner transfer (nothing leaks) and then returns an error.
//   kNotificationDrop: the next notification is lost: stripped from a posted transfer (which
//     still completes kDone) or dropped from GetNotifications, whichever comes first.
//   kLateWrite: the next posted write is held back: the wrapped backend sees nothing of it until
//     `late_write_delay` after PostWrite, and Poll reports kInProgress meanwhile. The first Poll
//     or Progress call after that posts it (notification included), and it completes as the
//     wrapped transfer does. PostWrite checks only the local region and the ops' local bounds; a
//     request the wrapped backend rejects later reports kFailed. Released before it was posted,
//     the write is by default STILL posted when due (a write landing after the initiator gave
//     up): Release returns OK, the wrapper posts it and releases it once it finished; with
//     `late_write_survives_release = false` Release drops it instead. Until then DeregisterMemory
//     of its local region and Disconnect of its peer fail with FailedPrecondition.
//   kCorruptBytes: the next posted write whose first op is not empty completes, and then, before
//     Poll reports kDone, the wrapper writes min(16, length) bytes in the middle of that first
//     op's remote range: the source's bytes with every bit flipped when the local region is host
//     memory, else 0xA5 bytes (which may match the source by chance). Nothing outside the op's
//     range changes. The notification travels with that extra write, so the target sees it after
//     the corrupted bytes. The bytes come from a small host scratch buffer that the wrapper
//     registers with the wrapped backend on first use (and deregisters when destroyed).
// `once` = the fault fires once and the plan disarms; otherwise it fires on every such call.
// Injected errors are absl::UnavailableError with "injected fault" in the message.
//
// Handles are the wrapper's own (a held write has one before the wrapped backend sees it).
// Destroying the wrapper releases every wrapped transfer it still holds and drops held writes.
//
// Threading: calls to the TransferBackend methods follow the wrapped backend's rule (one owning
// thread). SetPlan, faults_injected, late_writes_pending and mid_transfers_landed may be called
// from any thread
// (mutex-guarded), so a test can arm a fault while a worker's transfer thread owns the backend.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  kLateWrite,
  kCorruptBytes,
};

struct FaultPlan {
  FaultStage stage = FaultStage::kNone;
  bool once = true;
  int polls_before_failure = 0;  // kMidTransfer only
  // kLateWrite only: how long a write is held back, from PostWrite on.
  absl::Duration late_write_delay = absl::Milliseconds(200);
  // kLateWrite only: whether a write released before it was posted is still posted when due.
  bool late_write_survives_release = true;
};

class FaultInjectingBackend final : public TransferBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<TransferBackend> inner, FaultPlan plan = {});
  ~FaultInjectingBackend() override;

  void SetPlan(FaultPlan plan);
  // How many faults fired so far.
  int faults_injected() const;
  // kLateWrite writes whose bytes may still land: held ones, and released ones the wrapper still
  // has to post or finish. Tests wait for 0 (calling Progress) to see a late write drain.
  int late_writes_pending() const;
  // kMidTransfer transfers whose wrapped transfer finished (bytes landed, nothing in flight),
  // though this wrapper still reports them in progress.
  int mid_transfers_landed() const;
  TransferBackend& inner() { return *inner_; }

  std::string_view name() const override { return inner_->name(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  const std::string& agent_name() const override { return inner_->agent_name(); }
  absl::StatusOr<std::string> LocalAddress() override { return inner_->LocalAddress(); }
  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override;
  absl::Status DeregisterMemory(uint64_t region_id) override;
  absl::Status Connect(const std::string& peer, const std::string& address) override;
  absl::StatusOr<std::string> ConnectReply(const std::string& peer) override {
    return inner_->ConnectReply(peer);
  }
  absl::Status Accept(const std::string& peer, const std::string& reply) override;
  absl::Status Disconnect(const std::string& peer) override;
  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override;
  absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) override;
  absl::StatusOr<TransferState> Poll(TransferHandle handle) override;
  absl::Status Release(TransferHandle handle) override;
  // True for a released late write still to post or finish, and for a released transfer the
  // wrapped backend still has in flight.
  bool Lingering(TransferHandle released) override;
  void Progress() override;
  std::vector<Notification> GetNotifications() override;

 private:
  static constexpr size_t kCorruptBytes = 16;  // the most bytes kCorruptBytes overwrites
  static constexpr int kScratchSlots = 64;     // corrupting writes in flight at once

  // kLateWrite: a write not posted yet.
  struct HeldWrite {
    TransferRequest request;
    absl::Time due;
  };
  // kCorruptBytes: the extra write over the middle of the first op's remote range.
  struct Corruption {
    uint64_t local_region = 0;
    size_t local_offset = 0;  // the source bytes it flips (in the transfer's local region)
    size_t remote_offset = 0;
    size_t length = 0;
    std::string peer;
    std::string remote_region;
    std::string notification;
    std::optional<TransferHandle> write;  // the corrupting write, once posted
    int slot = -1;                        // its scratch slot, until the write finished
    bool failed = false;                  // it could not be posted
  };
  // One transfer of this wrapper: a wrapped transfer plus what its fault adds.
  struct Transfer {
    TransferHandle handle = 0;             // this wrapper's handle (kept by an orphan)
    std::optional<TransferHandle> inner;   // the wrapped transfer, once posted
    std::optional<HeldWrite> held;         // kLateWrite, until posted
    bool late = false;                     // kLateWrite, counted in late_pending_ until finished
    bool survives_release = true;          // kLateWrite
    bool post_failed = false;              // kLateWrite: the held write's post failed
    int polls_before_failure = -1;         // kMidTransfer: polls left before kFailed; -1: none
    bool landed = false;                   // kMidTransfer: counted in mid_landed_
    std::optional<Corruption> corruption;  // kCorruptBytes
  };

  // True (and counts the fault, disarming a `once` plan) when `stage` should fail now.
  bool Fire(FaultStage stage);
  FaultPlan plan() const;
  absl::StatusOr<TransferHandle> Post(const TransferRequest& request, bool write);
  // kLateWrite: InvalidArgument / NotFound for a request whose local side is wrong.
  absl::Status CheckHeldWrite(const TransferRequest& request) const;
  // Posts t.held to the wrapped backend (setting t.inner, or t.post_failed).
  void PostHeld(Transfer& t);
  // The corrupting write's state once the transfer itself is kDone.
  absl::StatusOr<TransferState> AdvanceCorruption(Corruption& c);
  // Posts the corrupting write; false when every scratch slot is busy (try again later).
  absl::StatusOr<bool> PostCorruption(Corruption& c);
  void FreeSlot(Corruption& c);
  // Marks a kLateWrite transfer finished (once).
  void FinishLate(Transfer& t);
  // Posts held writes that are due and finishes orphans (Poll, Progress, GetNotifications).
  void Pump();
  // Advances a released transfer the wrapper finishes on its own; true once nothing is left.
  bool AdvanceOrphan(Transfer& t, absl::Time now);
  // True when a held write (owned or released) satisfies `pred`.
  bool AnyHeldWrite(absl::FunctionRef<bool(const TransferRequest&)> pred) const;

  // Declared before inner_ so it outlives the wrapped backend, whose teardown may still drain a
  // released corrupting write that reads it.
  std::array<uint8_t, kScratchSlots * kCorruptBytes> scratch_{};
  const std::unique_ptr<TransferBackend> inner_;
  mutable absl::Mutex mu_;
  FaultPlan plan_ ABSL_GUARDED_BY(mu_);
  int faults_injected_ ABSL_GUARDED_BY(mu_) = 0;
  int late_pending_ ABSL_GUARDED_BY(mu_) = 0;
  int mid_landed_ ABSL_GUARDED_BY(mu_) = 0;

  // Owning thread only (as the wrapped backend).
  absl::flat_hash_map<TransferHandle, Transfer> transfers_;
  TransferHandle next_handle_ = 1;
  int held_owned_ = 0;             // transfers_ entries with a held write
  std::vector<Transfer> orphans_;  // released, still to post or finish
  // Released transfers whose wrapped transfer was still lingering: handle -> wrapped handle.
  absl::flat_hash_map<TransferHandle, TransferHandle> lingering_inner_;
  absl::flat_hash_map<uint64_t, MemoryRegion> regions_;  // registered through the wrapper
  std::optional<uint64_t> scratch_region_;
  uint64_t scratch_busy_ = 0;  // bit i: slot i holds bytes of an unfinished corrupting write
};

}  // namespace tandem::kvtransfer
