#include "kvtransfer/fault_injecting_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

absl::Status Injected(std::string_view what) {
  return absl::UnavailableError(absl::StrCat("injected fault: ", std::string(what)));
}

}  // namespace

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<TransferBackend> inner, FaultPlan plan)
    : inner_(std::move(inner)), plan_(plan) {}

void FaultInjectingBackend::SetPlan(FaultPlan plan) {
  absl::MutexLock lock(&mu_);
  plan_ = plan;
}

int FaultInjectingBackend::faults_injected() const {
  absl::MutexLock lock(&mu_);
  return faults_injected_;
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
  return inner_->RegisterMemory(base, length, kind);
}

absl::StatusOr<std::string> FaultInjectingBackend::ExportRegion(uint64_t region_id) {
  if (Fire(FaultStage::kExport)) return Injected("ExportRegion");
  return inner_->ExportRegion(region_id);
}

absl::Status FaultInjectingBackend::Connect(const std::string& peer, const std::string& address) {
  if (Fire(FaultStage::kConnect)) return Injected(absl::StrCat("Connect to '", peer, "'"));
  return inner_->Connect(peer, address);
}

absl::Status FaultInjectingBackend::Accept(const std::string& peer, const std::string& reply) {
  if (Fire(FaultStage::kAccept)) return Injected(absl::StrCat("Accept of '", peer, "'"));
  return inner_->Accept(peer, reply);
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::PostWrite(const TransferRequest& request) {
  return Post(request, /*write=*/true);
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::PostRead(const TransferRequest& request) {
  return Post(request, /*write=*/false);
}

absl::StatusOr<TransferHandle> FaultInjectingBackend::Post(const TransferRequest& request,
                                                           bool write) {
  if (Fire(FaultStage::kPost)) return Injected(write ? "PostWrite" : "PostRead");
  int polls_before_failure = 0;
  bool doomed = false;
  {
    absl::MutexLock lock(&mu_);
    polls_before_failure = plan_.polls_before_failure;
  }
  TransferRequest forwarded = request;
  if (Fire(FaultStage::kMidTransfer)) {
    doomed = true;
    forwarded.notification.clear();
  } else if (!request.notification.empty() && Fire(FaultStage::kNotificationDrop)) {
    forwarded.notification.clear();
  }
  ASSIGN_OR_RETURN(TransferHandle handle,
                   write ? inner_->PostWrite(forwarded) : inner_->PostRead(forwarded));
  if (doomed) doomed_[handle] = polls_before_failure;
  return handle;
}

absl::StatusOr<TransferState> FaultInjectingBackend::Poll(TransferHandle handle) {
  ASSIGN_OR_RETURN(TransferState state, inner_->Poll(handle));
  auto it = doomed_.find(handle);
  if (it == doomed_.end() || state == TransferState::kFailed) return state;
  if (it->second > 0) {
    --it->second;
    return TransferState::kInProgress;
  }
  return TransferState::kFailed;
}

absl::Status FaultInjectingBackend::Release(TransferHandle handle) {
  RETURN_IF_ERROR(inner_->Release(handle));
  doomed_.erase(handle);
  if (Fire(FaultStage::kRelease)) return Injected("Release");
  return absl::OkStatus();
}

std::vector<Notification> FaultInjectingBackend::GetNotifications() {
  std::vector<Notification> kept;
  for (Notification& notification : inner_->GetNotifications()) {
    if (!Fire(FaultStage::kNotificationDrop)) kept.push_back(std::move(notification));
  }
  return kept;
}

}  // namespace tandem::kvtransfer
