#include "runtime/mlp/host_plane/worker_host_plane.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/base/logging.h"
#include "runtime/mlp/mlp_shard_checks.h"

namespace tandem::mlp {

using kvtransfer::TransferBackend;
using kvtransfer::TransferThread;

// The AttachHost call: its first message opens the session, its end (any status) closes it.
// Owned by the session; destroyed only after OnDone ran (the destructor's wait).
class WorkerHostSession::Stream final
    : public grpc::ClientReadReactor<tandem::v1::MlpHostAttachResponse> {
 public:
  explicit Stream(tandem::v1::MlpHostAttachRequest request) : request_(std::move(request)) {}

  void Start(tandem::v1::MlpShard::Stub& stub) {
    stub.async()->AttachHost(&context_, &request_, this);
    StartRead(&first_);
    StartCall();
  }

  // The shard's answer, or why there is none by `deadline` (the call is then cancelled).
  absl::StatusOr<tandem::v1::MlpHostAttachResponse> First(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return (got_first_ && first_ok_) || done_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
      return absl::DeadlineExceededError("the shard did not answer AttachHost in time");
    }
    if (got_first_ && first_ok_) return first_;
    return absl::Status(static_cast<absl::StatusCode>(status_.error_code()),
                        status_.error_message());
  }

  bool alive() const {
    absl::MutexLock lock(&mu_);
    return got_first_ && first_ok_ && !ended_;
  }

  // Cancels the call and waits for OnDone; false (the stream must then leak) if it never came.
  bool End(absl::Duration timeout) {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }

  void OnReadDone(bool ok) override {
    bool more = false;
    {
      absl::MutexLock lock(&mu_);
      if (!got_first_) {
        got_first_ = true;
        first_ok_ = ok;
      } else if (!ok) {
        ended_ = true;
      }
      more = ok;  // keep reading: only the call's end matters after the first message
    }
    if (more) StartRead(&extra_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    ended_ = true;
    done_ = true;
  }

 private:
  grpc::ClientContext context_;
  const tandem::v1::MlpHostAttachRequest request_;
  tandem::v1::MlpHostAttachResponse first_;
  tandem::v1::MlpHostAttachResponse extra_;
  mutable absl::Mutex mu_;
  bool got_first_ ABSL_GUARDED_BY(mu_) = false;
  bool first_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<WorkerHostPlane>> WorkerHostPlane::Create(
    const WorkerHostPlaneOptions& options) {
  if (options.backend != "cma" && options.backend != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("host data plane: '", options.backend,
                                                   "' is not one (cma: one host, ucx: any)"));
  }
  if (!kvtransfer::TransferBackendBuilt(options.backend)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host data plane: this build has no '", options.backend, "' backend"));
  }
  if (options.slots < 1 || options.slots > 16 || options.slot_rows < 1 || options.hidden_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("host data plane: ", options.slots, " slots of ",
                                                   options.slot_rows,
                                                   " rows (slots 1..16, rows >= 1)"));
  }
  kvtransfer::BackendOptions b;
  b.agent_name = absl::StrCat("mlp-worker-", getpid());
  b.ucx_transports = options.ucx_transports;
  b.ucx_net_devices = options.ucx_net_devices;
  b.cma_threads = 1;
  absl::StatusOr<std::unique_ptr<TransferBackend>> backend =
      kvtransfer::CreateTransferBackend(options.backend, b);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("host data plane: creating the ", options.backend,
                                     " backend: ", backend.status().message()));
  }
  if (options.wrap_backend) *backend = options.wrap_backend(*std::move(backend));
  absl::StatusOr<std::string> address = (*backend)->LocalAddress();
  if (!address.ok()) return address.status();
  auto thread =
      std::make_shared<TransferThread>(*std::move(backend), options.busy_tick, options.idle_tick);
  return std::shared_ptr<WorkerHostPlane>(
      new WorkerHostPlane(options, std::move(thread), *std::move(address)));
}

WorkerHostPlane::WorkerHostPlane(const WorkerHostPlaneOptions& options,
                                 std::shared_ptr<TransferThread> thread, std::string address)
    : options_(options), thread_(std::move(thread)), address_(std::move(address)) {}

WorkerHostPlane::~WorkerHostPlane() { thread_->Stop(); }

absl::StatusOr<std::shared_ptr<WorkerHostSession>> WorkerHostPlane::Attach(
    tandem::v1::MlpShard::Stub& stub, const std::string& shard_address, absl::Time deadline) {
  absl::StatusOr<std::shared_ptr<SessionBuffers>> buffers = SessionBuffers::Create(
      thread_, options_.slots, options_.slot_rows, options_.hidden_size, deadline);
  if (!buffers.ok()) return buffers.status();
  tandem::v1::MlpHostAttachRequest request;
  request.set_backend(options_.backend);
  request.set_agent(absl::StrCat("mlp-worker-", getpid(), "-", ++attached_));
  request.set_address(address_);
  request.set_input_region((*buffers)->input_blob());
  request.set_slots(static_cast<uint32_t>(options_.slots));
  request.set_slot_rows(static_cast<uint32_t>(options_.slot_rows));
  auto stream = std::make_unique<WorkerHostSession::Stream>(request);
  stream->Start(stub);
  // From here every failure ends the call before the stream goes.
  auto fail = [&](absl::Status status) -> absl::Status {
    if (!stream->End(absl::Seconds(10))) {
      LOG(ERROR) << "host data plane: an AttachHost call to " << shard_address
                 << " did not end in 10 s; leaking it";
      (void)stream.release();
    }
    return status;
  };
  absl::StatusOr<tandem::v1::MlpHostAttachResponse> answer = stream->First(deadline);
  if (!answer.ok()) {
    return fail(absl::Status(answer.status().code(),
                             absl::StrCat("host data plane: shard ", shard_address, " over ",
                                          options_.backend, ": ", answer.status().message())));
  }
  if (absl::Status bad = CheckHostAttachResponse(*answer); !bad.ok()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "host data plane: shard ", shard_address, "'s AttachHost answer: ", bad.message())));
  }
  const std::string peer = absl::StrCat(shard_address, "#", answer->session());
  // By value: a task that timed out may still run after this returns.
  const absl::Status connected =
      thread_->Run([peer, address = answer->address()](
                       TransferBackend& backend) { return backend.Connect(peer, address); },
                   std::max(absl::ZeroDuration(), deadline - absl::Now()));
  (*buffers)->set_peer(peer);  // disconnected when the buffers retire
  if (!connected.ok()) {
    return fail(absl::Status(connected.code(),
                             absl::StrCat("host data plane: connecting to shard ", shard_address,
                                          " over ", options_.backend, ": ", connected.message())));
  }
  return std::shared_ptr<WorkerHostSession>(new WorkerHostSession(
      answer->session(), *std::move(buffers), peer, answer->output_region(), std::move(stream)));
}

WorkerHostSession::WorkerHostSession(uint64_t id, std::shared_ptr<SessionBuffers> buffers,
                                     std::string peer, std::string shard_output_region,
                                     std::unique_ptr<Stream> stream)
    : id_(id),
      buffers_(std::move(buffers)),
      peer_(std::move(peer)),
      shard_output_region_(std::move(shard_output_region)),
      stream_(std::move(stream)),
      taken_(static_cast<size_t>(buffers_->slots()), false) {}

WorkerHostSession::~WorkerHostSession() {
  if (stream_ != nullptr && !stream_->End(absl::Seconds(10))) {
    LOG(ERROR) << "host data plane: session " << id_ << "'s AttachHost call did not end in 10 s; "
               << "leaking it";
    (void)stream_.release();
  }
}

bool WorkerHostSession::alive() const { return stream_ != nullptr && stream_->alive(); }

std::optional<int> WorkerHostSession::AcquireSlot(int rows) {
  if (rows < 1 || rows > slot_rows()) return std::nullopt;
  for (size_t i = 0; i < taken_.size(); ++i) {
    if (!taken_[i]) {
      taken_[i] = true;
      return static_cast<int>(i);
    }
  }
  return std::nullopt;
}

void WorkerHostSession::ReleaseSlot(int slot) {
  if (slot >= 0 && static_cast<size_t>(slot) < taken_.size()) taken_[slot] = false;
}

void WorkerHostSession::ReadOutput(int slot, int rows, absl::Time deadline,
                                   std::function<void(absl::Status)> done) {
  const size_t offset = static_cast<size_t>(slot) * buffers_->slot_bytes();
  const size_t bytes =
      buffers_->slot_bytes() / static_cast<size_t>(slot_rows()) * static_cast<size_t>(rows);
  ReadSlot(buffers_, buffers_->output_region(), offset, peer_, shard_output_region_, offset, bytes,
           deadline, std::move(done));
}

}  // namespace tandem::mlp
