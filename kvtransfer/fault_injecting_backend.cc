#include "kvtransfer/fault_injecting_backend.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

absl::Status Injected(std::string_view what) {
  return absl::UnavailableError(absl::StrCat("injected fault: ", std::string(what)));
}

absl::Status UnknownHandle(TransferHandle handle) {
  return absl::NotFoundError(absl::StrCat("fault-injecting: unknown transfer handle ", handle));
}

}  // namespace

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<TransferBackend> inner, FaultPlan plan)
    : inner_(std::move(inner)), plan_(plan) {}

FaultInjectingBackend::~FaultInjectingBackend() {
  const auto release = [&](Transfer& t) {
    if (t.inner) (void)inner_->Release(*t.inner);
    if (t.corruption && t.corruption->write) (void)inner_->Release(*t.corruption->write);
  };
  for (auto& [handle, t] : transfers_) release(t);
  for (Transfer& t : orphans_) release(t);
  // Best effort: the wrapped backend's own teardown unmaps what is left.
  if (scratch_region_) (void)inner_->DeregisterMemory(*scratch_region_);
}

void FaultInjectingBackend::SetPlan(FaultPlan plan) {
  absl::MutexLock lock(&mu_);
  plan_ = plan;
}

FaultPlan FaultInjectingBackend::plan() const {
  absl::MutexLock lock(&mu_);
  return plan_;
}

int FaultInjectingBackend::faults_injected() const {
  absl::MutexLock lock(&mu_);
  return faults_injected_;
}

int FaultInjectingBackend::late_writes_pending() const {
  absl::MutexLock lock(&mu_);
  return late_pending_;
}

int FaultInjectingBackend::mid_transfers_landed() const {
  absl::MutexLock lock(&mu_);
  return mid_landed_;
}

bool FaultInjectingBackend::Fire(FaultStage stage) {
  absl::MutexLock lock(&mu_);
  if (plan_.stage != stage || stage == FaultStage::kNone) return false;
  ++faults_injected_;
  if (plan_.once) plan_.stage = FaultStage::kNone;
  return true;
}

absl::StatusOr<MemoryRegion> FaultInjectingBackend::RegisterMemory(void* base, size_t length,
                                                                   MemoryKind kind) {
  if (Fire(FaultStage::kRegister)) return Injected("RegisterMemory");
  ASSIGN_OR_RETURN(MemoryRegion region, inner_->RegisterMemory(base, length, kind));
  regions_[region.id] = region;
  return region;
}

absl::StatusOr<std::string> FaultInjectingBackend::ExportRegion(uint64_t region_id) {
  if (Fire(FaultStage::kExport)) return Injected("ExportRegion");
  return inner_->ExportRegion(region_id);
}

absl::Status FaultInjectingBackend::DeregisterMemory(uint64_t region_id) {
  if (AnyHeldWrite([&](const TransferRequest& r) { return r.local_region == region_id; })) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fault-injecting: region ", region_id, " is used by a held late write not posted yet"));
  }
  RETURN_IF_ERROR(inner_->DeregisterMemory(region_id));
  regions_.erase(region_id);
  return absl::OkStatus();
}

absl::Status FaultInjectingBackend::Connect(const std::string& peer, const std::string& address) {
  if (Fire(FaultStage::kConnect)) return Injected(absl::StrCat("Connect to '", peer, "'"));
  return inner_->Connect(peer, address);
}

absl::Status FaultInjectingBackend::Accept(const std::string& peer, const std::string& reply) {
  if (Fire(FaultStage::kAccept)) return Injected(absl::StrCat("Accept of '", peer, "'"));
  return inner_->Accept(peer, reply);
}

absl::Status FaultInjectingBackend::Disconnect(const std::string& peer) {
  if (AnyHeldWrite([&](const TransferRequest& r) { return r.peer == peer; })) {
    return absl::FailedPreconditionError(
        absl::StrCat("fault-injecting: peer '", peer, "' has a held late write not posted yet"));
  }
  return inner_->Disconnect(peer);
}

bool FaultInjectingBackend::AnyHeldWrite(
    absl::FunctionRef<bool(const TransferRequest&)> pred) const {
  for (const auto& [handle, t] : transfers_) {
    if (t.held && pred(t.held->request)) return true;
  }
  for (const Transfer& t : orphans_) {
    if (t.held && pred(t.held->request)) return true;
  }
  return false;
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::PostWrite(const TransferRequest& request) {
  return Post(request, /*write=*/true);
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::PostRead(const TransferRequest& request) {
  return Post(request, /*write=*/false);
}

absl::Status FaultInjectingBackend::CheckHeldWrite(const TransferRequest& request) const {
  auto it = regions_.find(request.local_region);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("fault-injecting: unknown local region ", request.local_region));
  }
  // The remote length is known only to the wrapped backend; this still catches overflow.
  return CheckOpsInRegions("fault-injecting", request.ops, it->second.length, UINT64_MAX);
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::Post(const TransferRequest& request,
                                                           bool write) {
  if (Fire(FaultStage::kPost)) return Injected(write ? "PostWrite" : "PostRead");
  const FaultPlan current = plan();
  if (write && current.stage == FaultStage::kLateWrite) {
    RETURN_IF_ERROR(CheckHeldWrite(request));
  }
  const bool corruptible = write && !request.ops.empty() && request.ops[0].length > 0;

  Transfer t;
  TransferRequest forwarded = request;
  if (Fire(FaultStage::kMidTransfer)) {
    t.polls_before_failure = current.polls_before_failure;
    forwarded.notification.clear();
  } else if (write && Fire(FaultStage::kLateWrite)) {
    t.held = HeldWrite{.request = request, .due = absl::Now() + current.late_write_delay};
    t.late = true;
    t.survives_release = current.late_write_survives_release;
  } else if (corruptible && Fire(FaultStage::kCorruptBytes)) {
    const CopyOp& first = request.ops[0];
    const size_t length = std::min(kCorruptBytes, first.length);
    const size_t middle = (first.length - length) / 2;
    // (Assigned, not emplace()d: clang 14 judges the nested struct not default-constructible.)
    t.corruption = Corruption{};
    Corruption& c = *t.corruption;
    c.local_region = request.local_region;
    c.local_offset = first.local_offset + middle;
    c.remote_offset = first.remote_offset + middle;
    c.length = length;
    c.peer = request.peer;
    c.remote_region = request.remote_region;
    c.notification = request.notification;
    forwarded.notification.clear();  // sent with the corrupting write, after its bytes
  } else if (!request.notification.empty() && Fire(FaultStage::kNotificationDrop)) {
    forwarded.notification.clear();
  }
  if (!t.held) {
    ASSIGN_OR_RETURN(t.inner, write ? inner_->PostWrite(forwarded) : inner_->PostRead(forwarded));
  } else {
    ++held_owned_;
    absl::MutexLock lock(&mu_);
    ++late_pending_;
  }
  const TransferHandle handle = next_handle_++;
  transfers_.emplace(handle, std::move(t));
  return handle;
}

void FaultInjectingBackend::PostHeld(Transfer& t) {
  absl::StatusOr<TransferHandle> inner = inner_->PostWrite(t.held->request);
  t.held.reset();
  if (inner.ok()) {
    t.inner = *inner;
  } else {
    t.post_failed = true;
  }
}

void FaultInjectingBackend::FinishLate(Transfer& t) {
  if (!t.late) return;
  t.late = false;
  absl::MutexLock lock(&mu_);
  --late_pending_;
}

absl::StatusOr<TransferState> FaultInjectingBackend::Poll(TransferHandle handle) {
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) return UnknownHandle(handle);
  Pump();
  Transfer& t = it->second;
  if (t.held) {
    if (absl::Now() < t.held->due) return TransferState::kInProgress;
    PostHeld(t);
    --held_owned_;
  }
  if (t.post_failed) {
    FinishLate(t);
    return TransferState::kFailed;
  }
  ASSIGN_OR_RETURN(TransferState state, inner_->Poll(*t.inner));
  if (t.polls_before_failure >= 0 && state == TransferState::kDone && !t.landed) {
    t.landed = true;
    absl::MutexLock lock(&mu_);
    ++mid_landed_;
  }
  if (t.polls_before_failure >= 0 && state != TransferState::kFailed) {
    if (t.polls_before_failure > 0) {
      --t.polls_before_failure;
      return TransferState::kInProgress;
    }
    return TransferState::kFailed;
  }
  if (state == TransferState::kDone && t.corruption) {
    ASSIGN_OR_RETURN(state, AdvanceCorruption(*t.corruption));
  }
  if (state != TransferState::kInProgress) FinishLate(t);
  return state;
}

absl::StatusOr<TransferState> FaultInjectingBackend::AdvanceCorruption(Corruption& c) {
  if (c.failed) return TransferState::kFailed;
  if (!c.write) {
    absl::StatusOr<bool> posted = PostCorruption(c);
    if (!posted.ok()) {
      c.failed = true;
      return TransferState::kFailed;
    }
    if (!*posted) return TransferState::kInProgress;
  }
  ASSIGN_OR_RETURN(TransferState state, inner_->Poll(*c.write));
  if (state != TransferState::kInProgress) FreeSlot(c);
  return state;
}

absl::StatusOr<bool> FaultInjectingBackend::PostCorruption(Corruption& c) {
  if (!scratch_region_) {
    ASSIGN_OR_RETURN(MemoryRegion region,
                     inner_->RegisterMemory(scratch_.data(), scratch_.size(), MemoryKind::kHost));
    scratch_region_ = region.id;
  }
  if (scratch_busy_ == ~uint64_t{0}) return false;
  const int slot = std::countr_one(scratch_busy_);
  uint8_t* bytes = scratch_.data() + static_cast<size_t>(slot) * kCorruptBytes;
  auto region = regions_.find(c.local_region);
  if (region != regions_.end() && region->second.kind == MemoryKind::kHost) {
    // The transfer itself was posted, so the wrapped backend checked this range.
    const auto* source = static_cast<const uint8_t*>(region->second.base) + c.local_offset;
    for (size_t i = 0; i < c.length; ++i) bytes[i] = static_cast<uint8_t>(~source[i]);
  } else {
    std::memset(bytes, 0xA5, c.length);
  }
  ASSIGN_OR_RETURN(c.write, inner_->PostWrite(
                                {.local_region = *scratch_region_,
                                 .peer = c.peer,
                                 .remote_region = c.remote_region,
                                 .ops = {{.local_offset = static_cast<size_t>(slot) * kCorruptBytes,
                                          .remote_offset = c.remote_offset,
                                          .length = c.length}},
                                 .notification = c.notification}));
  scratch_busy_ |= uint64_t{1} << slot;
  c.slot = slot;
  return true;
}

void FaultInjectingBackend::FreeSlot(Corruption& c) {
  if (c.slot < 0) return;
  scratch_busy_ &= ~(uint64_t{1} << c.slot);
  c.slot = -1;
}

absl::Status FaultInjectingBackend::Release(TransferHandle handle) {
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) return UnknownHandle(handle);
  Transfer t = std::move(it->second);
  transfers_.erase(it);
  absl::Status status = absl::OkStatus();
  t.handle = handle;
  if (t.inner) {
    status = inner_->Release(*t.inner);
    if (inner_->Lingering(*t.inner)) lingering_inner_[handle] = *t.inner;
    t.inner.reset();
  }
  bool orphan = false;
  if (t.held) {
    --held_owned_;
    if (t.survives_release) {
      orphan = true;  // posted when due, by Pump
    } else {
      t.held.reset();
      FinishLate(t);
    }
  } else {
    // Posted: released like any transfer (cancelled best effort).
    FinishLate(t);
  }
  if (t.corruption && t.corruption->write) {
    if (t.corruption->slot >= 0) {
      orphan = true;  // its scratch slot is freed once the write finished
    } else {
      (void)inner_->Release(*t.corruption->write);
      t.corruption->write.reset();
    }
  }
  if (orphan) orphans_.push_back(std::move(t));
  RETURN_IF_ERROR(status);
  if (Fire(FaultStage::kRelease)) return Injected("Release");
  return absl::OkStatus();
}

bool FaultInjectingBackend::Lingering(TransferHandle released) {
  Pump();
  for (const Transfer& t : orphans_) {
    if (t.handle == released) return true;
  }
  auto it = lingering_inner_.find(released);
  if (it == lingering_inner_.end()) return false;
  if (inner_->Lingering(it->second)) return true;
  lingering_inner_.erase(it);
  return false;
}

bool FaultInjectingBackend::AdvanceOrphan(Transfer& t, absl::Time now) {
  if (t.held) {
    if (now < t.held->due) return false;
    PostHeld(t);
  }
  if (t.inner) {
    absl::StatusOr<TransferState> state = inner_->Poll(*t.inner);
    if (state.ok() && *state == TransferState::kInProgress) return false;
    (void)inner_->Release(*t.inner);
    t.inner.reset();
  }
  FinishLate(t);
  if (t.corruption && t.corruption->write) {
    absl::StatusOr<TransferState> state = inner_->Poll(*t.corruption->write);
    if (state.ok() && *state == TransferState::kInProgress) return false;
    (void)inner_->Release(*t.corruption->write);
    t.corruption->write.reset();
    FreeSlot(*t.corruption);
  }
  return true;
}

void FaultInjectingBackend::Pump() {
  if (held_owned_ == 0 && orphans_.empty()) return;
  const absl::Time now = absl::Now();
  if (held_owned_ > 0) {
    for (auto& [handle, t] : transfers_) {
      if (t.held && now >= t.held->due) {
        PostHeld(t);
        --held_owned_;
      }
    }
  }
  for (size_t i = 0; i < orphans_.size();) {
    if (AdvanceOrphan(orphans_[i], now)) {
      if (i + 1 != orphans_.size()) orphans_[i] = std::move(orphans_.back());
      orphans_.pop_back();
    } else {
      ++i;
    }
  }
}

void FaultInjectingBackend::Progress() {
  Pump();
  inner_->Progress();
}

std::vector<Notification> FaultInjectingBackend::GetNotifications() {
  Pump();
  std::vector<Notification> kept;
  for (Notification& notification : inner_->GetNotifications()) {
    if (!Fire(FaultStage::kNotificationDrop)) kept.push_back(std::move(notification));
  }
  return kept;
}

}  // namespace tandem::kvtransfer
