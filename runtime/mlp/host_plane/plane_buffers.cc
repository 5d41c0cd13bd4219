#include "runtime/mlp/host_plane/plane_buffers.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::mlp {

using kvtransfer::TransferBackend;
using kvtransfer::TransferHandle;
using kvtransfer::TransferState;
using kvtransfer::TransferThread;

SessionBuffers::SessionBuffers(std::weak_ptr<TransferThread> thread, int slots, int slot_rows,
                               int hidden)
    : thread_(std::move(thread)),
      slots_(slots),
      slot_rows_(slot_rows),
      slot_floats_(static_cast<size_t>(slot_rows) * static_cast<size_t>(hidden)),
      input_(new float[static_cast<size_t>(slots) * slot_floats_]()),
      output_(new float[static_cast<size_t>(slots) * slot_floats_]()) {}

SessionBuffers::~SessionBuffers() = default;

bool SessionBuffers::TryRetire(SessionBuffers& b, TransferBackend& backend) {
  // Each step is dropped once it succeeded; FailedPrecondition (a transfer still uses it) is
  // tried again at the next tick, anything else (already gone) counts as done.
  for (uint64_t* region : {&b.input_region_, &b.output_region_}) {
    if (*region == 0) continue;
    const absl::Status s = backend.DeregisterMemory(*region);
    if (absl::IsFailedPrecondition(s)) return false;
    *region = 0;
  }
  if (!b.peer_.empty()) {
    const absl::Status s = backend.Disconnect(b.peer_);
    if (absl::IsFailedPrecondition(s)) return false;
    b.peer_.clear();
  }
  return true;
}

absl::StatusOr<std::shared_ptr<SessionBuffers>> SessionBuffers::Create(
    std::shared_ptr<TransferThread> thread, int slots, int slot_rows, int hidden,
    absl::Time deadline) {
  if (slots < 1 || slots > 16 || slot_rows < 1 || slot_rows > (1 << 20) || hidden < 1 ||
      static_cast<uint64_t>(slots) * static_cast<uint64_t>(slot_rows) *
              static_cast<uint64_t>(hidden) * sizeof(float) * 2 >
          (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("host data plane: ", slots, " slots of ",
                                                   slot_rows, " rows x ", hidden,
                                                   " floats is not a session this plane takes"));
  }
  // The deleter hands the buffers to the transfer thread, which drops their registrations and
  // frees them; without a running thread they are freed at once.
  std::weak_ptr<TransferThread> weak = thread;
  std::shared_ptr<SessionBuffers> buffers(
      new SessionBuffers(weak, slots, slot_rows, hidden), [weak](SessionBuffers* b) {
        std::shared_ptr<TransferThread> t = weak.lock();
        if (t == nullptr) {
          delete b;
          return;
        }
        const bool added = t->AddPoller([b](TransferBackend& backend, bool stopping) {
          if (!TryRetire(*b, backend) && !stopping) return false;
          delete b;
          return true;
        });
        if (!added) delete b;
      });
  SessionBuffers* b = buffers.get();
  const size_t bytes = static_cast<size_t>(slots) * b->slot_bytes();
  const absl::Status registered = thread->Run(
      [b, bytes](TransferBackend& backend) -> absl::Status {
        absl::StatusOr<kvtransfer::MemoryRegion> in =
            backend.RegisterMemory(b->input_.get(), bytes, kvtransfer::MemoryKind::kHost);
        if (!in.ok()) return in.status();
        b->input_region_ = in->id;
        absl::StatusOr<kvtransfer::MemoryRegion> out =
            backend.RegisterMemory(b->output_.get(), bytes, kvtransfer::MemoryKind::kHost);
        if (!out.ok()) return out.status();
        b->output_region_ = out->id;
        absl::StatusOr<std::string> in_blob = backend.ExportRegion(b->input_region_);
        if (!in_blob.ok()) return in_blob.status();
        absl::StatusOr<std::string> out_blob = backend.ExportRegion(b->output_region_);
        if (!out_blob.ok()) return out_blob.status();
        b->input_blob_ = *std::move(in_blob);
        b->output_blob_ = *std::move(out_blob);
        return absl::OkStatus();
      },
      std::max(absl::ZeroDuration(), deadline - absl::Now()));
  if (!registered.ok()) {
    // A task that timed out may still run: it then registers into buffers that the deleter's
    // poller, queued behind it, drops again.
    return absl::Status(registered.code(),
                        absl::StrCat("host data plane: registering a session's buffers with ",
                                     thread->backend_name(), ": ", registered.message()));
  }
  return buffers;
}

void ReadSlot(std::shared_ptr<SessionBuffers> keep, uint64_t local_region, size_t local_offset,
              const std::string& peer, const std::string& remote_region, size_t remote_offset,
              size_t bytes, absl::Time deadline, std::function<void(absl::Status)> done) {
  std::shared_ptr<TransferThread> thread = keep->thread();
  if (thread == nullptr) {
    done(absl::UnavailableError("host data plane: the transfer thread has stopped"));
    return;
  }
  struct Read {
    std::shared_ptr<SessionBuffers> keep;
    kvtransfer::TransferRequest request;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
    std::optional<TransferHandle> handle;
    bool released = false;
    absl::Status result;
  };
  auto read = std::make_shared<Read>();
  read->keep = std::move(keep);
  read->request.local_region = local_region;
  read->request.peer = peer;
  read->request.remote_region = remote_region;
  read->request.ops = {
      {.local_offset = local_offset, .remote_offset = remote_offset, .length = bytes}};
  read->deadline = deadline;
  read->done = std::move(done);
  const std::string name = thread->backend_name();
  const bool added = thread->AddPoller([read, name](TransferBackend& backend, bool stopping) {
    Read& r = *read;
    if (!r.handle.has_value()) {
      if (stopping) {
        r.done(absl::UnavailableError("host data plane: the transfer thread is stopping"));
        return true;
      }
      absl::StatusOr<TransferHandle> h = backend.PostRead(r.request);
      if (!h.ok()) {
        r.done(absl::UnavailableError(
            absl::StrCat("host data plane: ", name, " read not posted: ", h.status().message())));
        return true;
      }
      r.handle = *h;
    }
    if (!r.released) {
      absl::StatusOr<TransferState> state =
          stopping ? absl::StatusOr<TransferState>(
                         absl::UnavailableError("the transfer thread is stopping"))
                   : backend.Poll(*r.handle);
      if (state.ok() && *state == TransferState::kInProgress && absl::Now() < r.deadline) {
        return false;
      }
      if (!state.ok()) {
        r.result = absl::UnavailableError(
            absl::StrCat("host data plane: ", name, " read: ", state.status().message()));
      } else if (*state == TransferState::kDone) {
        r.result = absl::OkStatus();
      } else if (*state == TransferState::kFailed) {
        r.result = absl::UnavailableError(
            absl::StrCat("host data plane: ", name, " read from ", r.request.peer, " failed"));
      } else {
        r.result = absl::DeadlineExceededError(absl::StrCat("host data plane: ", name,
                                                            " read from ", r.request.peer,
                                                            " not finished by its deadline"));
      }
      (void)backend.Release(*r.handle);
      r.released = true;
    }
    // A read the backend could not recall may still land: the slot is not free until it cannot.
    if (!stopping && backend.Lingering(*r.handle)) return false;
    r.done(r.result);
    return true;
  });
  if (!added)
    read->done(absl::UnavailableError("host data plane: the transfer thread has stopped"));
}

}  // namespace tandem::mlp
