#include "kvtransfer/handoff/kv_sender.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/kv_checksum.h"
#include "kvtransfer/kv_convert.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

// Gives source blocks back exactly once: by Run, or when dropped unrun (a task the stopped thread
// never ran), so no path can keep them.
class SourceRelease {
 public:
  explicit SourceRelease(std::function<void()> fn) : fn_(std::move(fn)) {}
  SourceRelease(SourceRelease&& other) noexcept : fn_(std::exchange(other.fn_, nullptr)) {}
  SourceRelease& operator=(SourceRelease&&) = delete;
  ~SourceRelease() { Run(); }
  void Run() {
    std::function<void()> fn = std::exchange(fn_, nullptr);
    if (fn) fn();
  }

 private:
  std::function<void()> fn_;
};

// A converted prompt's KV in the destination's format, in the lane's staging memory and
// registered with its backend for one send (lane thread only).
struct Staging {
  KvStaging* owner = nullptr;
  void* buffer = nullptr;
  uint64_t length = 0;
  uint64_t region_id = 0;
  bool registered = false;

  void Free(TransferBackend& backend) {
    if (registered) {
      registered = false;
      if (absl::Status s = backend.DeregisterMemory(region_id); !s.ok()) {
        LOG(WARNING) << "kv sender: deregistering a KV conversion buffer: " << s;
      }
    }
    if (buffer != nullptr) owner->Free(std::exchange(buffer, nullptr));
  }
};

int64_t Bytes(const std::vector<CopyOp>& ops) {
  int64_t bytes = 0;
  for (const CopyOp& op : ops) bytes += static_cast<int64_t>(op.length);
  return bytes;
}

}  // namespace

std::string_view SendStageName(SendStage stage) {
  switch (stage) {
    case SendStage::kNone:
      return "none";
    case SendStage::kConnect:
      return "connect";
    case SendStage::kPlan:
      return "plan";
    case SendStage::kConvert:
      return "convert";
    case SendStage::kPost:
      return "post";
    case SendStage::kTransfer:
      return "transfer";
    case SendStage::kDeadline:
      return "deadline";
    case SendStage::kCancelled:
      return "cancelled";
    case SendStage::kShutdown:
      return "shutdown";
    case SendStage::kProducer:
      return "producer";
  }
  return "unknown";
}

struct KvSender::Core {
  std::unique_ptr<TransferThread> thread;
  const KvSource source;
  const std::unique_ptr<KvStaging> staging;  // used on the lane thread only
  const KvSenderOptions options;
  const std::string backend_name;
  // Lane thread only: connected agents, name -> address.
  absl::flat_hash_map<std::string, std::string> peers;

  Core(std::unique_ptr<TransferThread> t, KvSource s, std::unique_ptr<KvStaging> st,
       KvSenderOptions o)
      : thread(std::move(t)),
        source(std::move(s)),
        staging(std::move(st)),
        options(o),
        backend_name(thread->backend_name()) {}

  // Lane thread: connects unless connected with this address.
  absl::Status EnsurePeer(TransferBackend& backend, const KvDestination& dst) {
    auto it = peers.find(dst.agent_name);
    if (it != peers.end() && it->second == dst.agent_address) return absl::OkStatus();
    if (it != peers.end()) {
      (void)backend.Disconnect(dst.agent_name);
      peers.erase(it);
    }
    if (absl::Status s = backend.Connect(dst.agent_name, dst.agent_address); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("connecting to transfer agent '", dst.agent_name, "': ", s.message()));
    }
    peers[dst.agent_name] = dst.agent_address;
    return absl::OkStatus();
  }
  void ForgetPeer(TransferBackend& backend, const std::string& agent) {
    (void)backend.Disconnect(agent);
    peers.erase(agent);
  }
};

// One send. Immutable fields are set by Begin; `mu` guards what other threads read; the rest is
// the lane thread's.
class KvSend {
 public:
  KvSend(std::shared_ptr<KvSender::Core> c, std::string i, KvDestination d, absl::Time dl, bool s,
         KvSender::DoneCallback done)
      : core(std::move(c)),
        id(std::move(i)),
        dst(std::move(d)),
        deadline(dl),
        streamed(s),
        on_done(std::move(done)) {}

  const std::shared_ptr<KvSender::Core> core;
  const std::string id;
  const KvDestination dst;
  const absl::Time deadline;
  const bool streamed;
  const KvSender::DoneCallback on_done;

  bool abandoned() {
    absl::MutexLock lock(&mu);
    return abandoned_;
  }
  void MarkAbandoned() {
    absl::MutexLock lock(&mu);
    abandoned_ = true;
  }
  void AddUnreleased(int n) {
    absl::MutexLock lock(&mu);
    unreleased_ += n;
  }
  bool WaitQuiescent(absl::Time until) {
    absl::MutexLock lock(&mu);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return unreleased_ == 0; };
    mu.AwaitWithDeadline(absl::Condition(&released), until);
    return unreleased_ == 0;
  }
  // The first report wins; on_done runs outside the lock.
  void Report(KvSendReport report) {
    {
      absl::MutexLock lock(&mu);
      if (reported_) return;
      reported_ = true;
    }
    if (on_done) on_done(report);
  }

  // Lane thread only.
  struct Pending {
    uint64_t threshold = 0;  // post once the layer progress reaches it (any time after Whole)
    uint64_t local_region = 0;
    std::vector<CopyOp> ops;
  };
  std::deque<Pending> pending;  // thresholds ascending
  std::vector<TransferHandle> posted;
  std::vector<TransferHandle> lingering;  // released, still writing (Drain waits them out)
  const volatile uint64_t* progress = nullptr;
  std::optional<SourceRelease> source;  // set by Whole
  std::optional<Staging> staging;
  absl::Status failure;
  SendStage stage = SendStage::kNone;
  int chunks = 0;
  bool whole = false;
  bool polling = false;
  bool draining = false;  // reported; only lingering writes keep it live
  bool ended = false;     // every write finished, the source given back
  absl::Time first_post = absl::InfiniteFuture();
  absl::Time whole_at;
  int64_t bytes = 0;
  int64_t early_bytes = 0;
  int64_t ops = 0;
  int writes = 0;
  std::optional<uint64_t> checksum;

  void Fail(SendStage at, absl::Status status) {
    if (!failure.ok()) return;
    failure = std::move(status);
    stage = at;
  }

 private:
  absl::Mutex mu;
  bool abandoned_ ABSL_GUARDED_BY(mu) = false;
  int unreleased_ ABSL_GUARDED_BY(mu) = 0;  // posted and not yet released (Fence waits for 0)
  bool reported_ ABSL_GUARDED_BY(mu) = false;
};

namespace {

using Core = KvSender::Core;

// Lane thread: converts the prompt's KV into a staging buffer of the destination's format and
// returns the writes from it.
absl::StatusOr<std::vector<CopyOp>> Convert(Core& core, TransferBackend& backend, KvSend& send,
                                            std::span<const int32_t> src_blocks, int num_tokens) {
  const KvSource& src = core.source;
  if (core.staging == nullptr) {
    return absl::FailedPreconditionError("this lane has no KV conversion staging");
  }
  ASSIGN_OR_RETURN(
      ConversionPlan plan,
      PlanKvConversion(src.layout, send.dst.layout, src_blocks, send.dst.block_ids, num_tokens,
                       send.dst.num_cached_tokens, 0, src.layout.num_layers));
  StagedConversion staged = StageConversion(plan);
  if (staged.staging_bytes == 0) return std::move(staged.ops);
  Staging& staging = send.staging.emplace();
  staging.owner = core.staging.get();
  staging.length = staged.staging_bytes;
  ASSIGN_OR_RETURN(staging.buffer, core.staging->Allocate(staging.length));
  RETURN_IF_ERROR(
      core.staging->Convert(staged.pack, src.memory, src.bytes, staging.buffer, staging.length));
  ASSIGN_OR_RETURN(MemoryRegion region,
                   backend.RegisterMemory(staging.buffer, staging.length, core.staging->kind()));
  staging.region_id = region.id;
  staging.registered = true;
  return std::move(staged.ops);
}

// Lane thread: after the send's report, waits out writes that linger after Release, then frees
// the staging buffer and gives the source back. True once the send has ended. Stopping: the
// backend is about to be destroyed, which drains what it still holds.
bool Drain(TransferBackend& backend, KvSend& send, bool stopping) {
  for (size_t i = 0; i < send.lingering.size();) {
    if (stopping || !backend.Lingering(send.lingering[i])) {
      send.AddUnreleased(-1);
      send.lingering[i] = send.lingering.back();
      send.lingering.pop_back();
    } else {
      ++i;
    }
  }
  send.draining = true;
  if (!send.lingering.empty()) return false;
  if (send.staging.has_value()) send.staging->Free(backend);  // nothing reads it now
  send.polling = false;
  send.ended = true;
  if (send.source.has_value()) send.source->Run();  // before Whole: Whole gives it back
  return true;
}

// Lane thread, every tick while the send is live: posts what is ready, polls what is posted, and
// ends the send (releasing everything) when it is done or failed. True when it ended.
bool Tick(Core& core, TransferBackend& backend, KvSend& send, bool stopping) {
  if (send.draining) return Drain(backend, send, stopping);
  const absl::Time now = absl::Now();
  if (stopping) {
    send.Fail(SendStage::kShutdown, absl::UnavailableError("prefill worker shutting down"));
  } else if (send.abandoned()) {
    send.Fail(SendStage::kCancelled, absl::CancelledError("the caller gave up"));
  } else if (now > send.deadline ||
             (send.whole && now > send.whole_at + core.options.transfer_timeout)) {
    send.Fail(SendStage::kDeadline,
              absl::DeadlineExceededError("KV transfer not acknowledged in time"));
  }
  // Post every write whose layer is computed (all of them once the KV is whole).
  const uint64_t progress = send.progress != nullptr ? *send.progress : 0;
  while (send.failure.ok() && !send.pending.empty() &&
         (send.whole || send.pending.front().threshold <= progress)) {
    KvSend::Pending next = std::move(send.pending.front());
    send.pending.pop_front();
    const int64_t bytes = Bytes(next.ops);
    const int64_t ops = static_cast<int64_t>(next.ops.size());
    TransferRequest transfer;
    transfer.local_region = next.local_region;
    transfer.peer = send.dst.agent_name;
    transfer.remote_region = send.dst.region;
    transfer.ops = std::move(next.ops);
    absl::StatusOr<TransferHandle> handle = backend.PostWrite(transfer);
    if (!handle.ok()) {
      core.ForgetPeer(backend, send.dst.agent_name);  // the connection may be what failed
      send.Fail(SendStage::kPost,
                absl::UnavailableError(absl::StrCat("posting KV writes to '", send.dst.agent_name,
                                                    "': ", handle.status().message())));
      break;
    }
    send.posted.push_back(*handle);
    send.AddUnreleased(1);
    send.first_post = std::min(send.first_post, now);
    send.bytes += bytes;
    send.ops += ops;
    ++send.writes;
    if (!send.whole) send.early_bytes += bytes;
  }
  bool all_landed = true;
  for (TransferHandle h : send.posted) {
    if (!send.failure.ok()) break;
    absl::StatusOr<TransferState> state = backend.Poll(h);
    if (!state.ok()) {
      send.Fail(SendStage::kTransfer, state.status());
    } else if (*state == TransferState::kFailed) {
      send.Fail(SendStage::kTransfer, absl::UnavailableError("KV transfer failed"));
    } else if (*state == TransferState::kInProgress) {
      all_landed = false;
    }
  }
  const bool finished = send.failure.ok() && send.whole && send.pending.empty() && all_landed;
  if (!finished && send.failure.ok()) return false;

  // Done or failed: release every write. One the backend could not recall (Lingering) keeps the
  // send unfenced and its source held until it finished; the report goes out now either way.
  for (TransferHandle h : send.posted) {
    if (absl::Status released = backend.Release(h); !released.ok()) {
      LOG(WARNING) << "request " << send.id << ": releasing its KV transfer: " << released;
    }
    if (backend.Lingering(h)) send.lingering.push_back(h);
  }
  send.AddUnreleased(-static_cast<int>(send.posted.size() - send.lingering.size()));
  send.posted.clear();
  send.pending.clear();

  KvSendReport report;
  report.status = send.failure;
  report.failed_stage = send.stage;
  report.bytes = send.bytes;
  report.streamed_bytes = send.early_bytes;
  report.ops = send.ops;
  report.writes = send.writes;
  report.checksum = send.checksum;
  if (send.writes > 0) report.latency = now - send.first_post;
  if (send.whole && send.writes > 0) report.exposed = now - send.whole_at;
  if (!send.lingering.empty()) {
    LOG(WARNING) << "request " << send.id << ": " << send.lingering.size()
                 << " KV write(s) could not be recalled; holding its blocks until they finish";
  }
  send.Report(std::move(report));
  return Drain(backend, send, stopping);
}

// Lane thread: makes sure a live send is ticked (it ends itself).
void StartTicking(Core& core, const std::shared_ptr<KvSend>& send) {
  if (send->polling || send->ended) return;
  send->polling = core.thread->AddPoller([send](TransferBackend& backend, bool stopping) {
    return Tick(*send->core, backend, *send, stopping);
  });
  if (!send->polling) {  // stopping: nobody will tick it; nothing was posted without a tick
    send->ended = true;
    if (send->source.has_value()) send->source->Run();
    KvSendReport report;
    report.status = absl::UnavailableError("prefill worker shutting down");
    report.failed_stage = SendStage::kShutdown;
    send->Report(std::move(report));
  }
}

void OnChunk(Core& core, TransferBackend& backend, const std::shared_ptr<KvSend>& send,
             const KvChunkReady& chunk) {
  KvSend& s = *send;
  if (s.ended || s.whole || !s.failure.ok() || s.abandoned()) return;
  s.progress = chunk.progress;
  const KvLayout& layout = core.source.layout;
  const auto plan_failed = [&](const absl::Status& status) {
    s.Fail(SendStage::kPlan, absl::FailedPreconditionError(status.message()));
    StartTicking(core, send);
  };
  if (absl::Status st = core.EnsurePeer(backend, s.dst); !st.ok()) {
    s.Fail(SendStage::kConnect, st);
    return StartTicking(core, send);
  }
  const int block_size = layout.block_size;
  const int d_cached = s.dst.num_cached_tokens;
  // Blocks wholly inside the destination's cache are never written; the block holding `begin` is
  // written again by this chunk (its earlier positions went with the previous chunk).
  const int skip = std::max(d_cached, (chunk.begin / block_size) * block_size);
  if (chunk.end <= skip) return;  // all of it is cached there
  if (s.chunks++ == 0 && chunk.begin > d_cached) {
    // Positions before the first chunk came from this worker's prefix cache: ready now.
    absl::StatusOr<std::vector<CopyOp>> ops = PlanBlockCopies(
        layout, s.dst.layout, chunk.block_ids, s.dst.block_ids, chunk.begin, d_cached);
    if (!ops.ok()) return plan_failed(ops.status());
    if (!ops->empty()) s.pending.push_back({0, core.source.region_id, std::move(*ops)});
  }
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    absl::StatusOr<std::vector<CopyOp>> ops = PlanLayerBlockCopies(
        layout, s.dst.layout, chunk.block_ids, s.dst.block_ids, chunk.end, skip, layer, layer + 1);
    if (!ops.ok()) return plan_failed(ops.status());
    const uint64_t threshold = chunk.progress != nullptr
                                   ? chunk.first_value + static_cast<uint64_t>(layer) + 1
                                   : std::numeric_limits<uint64_t>::max();
    if (!ops->empty()) s.pending.push_back({threshold, core.source.region_id, std::move(*ops)});
  }
  StartTicking(core, send);
}

// KvChecksum of what the send writes, read from the source, when the source is host memory of the
// destination's element format and holds the destination's heads; nullopt otherwise.
std::optional<uint64_t> SourceChecksum(const Core& core, const KvSend& s,
                                       std::span<const int32_t> block_ids, int num_tokens) {
  const KvSource& src = core.source;
  const KvLayout& dst = s.dst.layout;
  if (src.kind != MemoryKind::kHost || src.memory == nullptr ||
      src.layout.elem_bytes != dst.elem_bytes ||
      (src.layout.dtype != dst.dtype && src.layout.dtype != KvDtype::kRaw &&
       dst.dtype != KvDtype::kRaw)) {
    return std::nullopt;
  }
  absl::StatusOr<uint64_t> sum =
      KvChecksum(src.layout, src.memory, src.bytes, block_ids, s.dst.num_cached_tokens, num_tokens,
                 dst.head_begin, dst.head_begin + dst.num_kv_heads, 0, src.layout.num_layers);
  if (!sum.ok()) {
    LOG(WARNING) << "request " << s.id << ": no KV checksum: " << sum.status();
    return std::nullopt;
  }
  return *sum;
}

void OnWhole(Core& core, TransferBackend& backend, const std::shared_ptr<KvSend>& send,
             std::span<const int32_t> block_ids, int num_tokens, SourceRelease release) {
  KvSend& s = *send;
  s.source.emplace(std::move(release));
  s.whole = true;
  s.whole_at = absl::Now();
  if (s.ended) {  // it failed before the KV was whole: nothing of it is in flight
    s.source->Run();
    return;
  }
  if (s.dst.want_checksum && s.failure.ok())
    s.checksum = SourceChecksum(core, s, block_ids, num_tokens);
  if (s.failure.ok() && !s.abandoned() && s.chunks == 0) {
    // Not streamed (or no chunk came): every write goes now.
    if (absl::Status st = core.EnsurePeer(backend, s.dst); !st.ok()) {
      s.Fail(SendStage::kConnect, st);
    } else if (SameBlockFormat(core.source.layout, s.dst.layout)) {
      absl::StatusOr<std::vector<CopyOp>> ops =
          PlanBlockCopies(core.source.layout, s.dst.layout, block_ids, s.dst.block_ids, num_tokens,
                          s.dst.num_cached_tokens);
      if (!ops.ok()) {
        s.Fail(SendStage::kPlan, absl::FailedPreconditionError(ops.status().message()));
      } else if (!ops->empty()) {
        s.pending.push_back({0, core.source.region_id, std::move(*ops)});
      }
    } else {
      absl::StatusOr<std::vector<CopyOp>> ops = Convert(core, backend, s, block_ids, num_tokens);
      if (!ops.ok()) {
        s.Fail(SendStage::kConvert, absl::FailedPreconditionError(ops.status().message()));
      } else if (!ops->empty()) {
        s.pending.push_back({0,
                             s.staging.has_value() ? s.staging->region_id : core.source.region_id,
                             std::move(*ops)});
      }
    }
  }
  StartTicking(core, send);
}

}  // namespace

KvSender::KvSender(std::unique_ptr<TransferThread> thread, KvSource source,
                   std::unique_ptr<KvStaging> staging, KvSenderOptions options)
    : core_(std::make_shared<Core>(std::move(thread), std::move(source), std::move(staging),
                                   options)) {}

KvSender::~KvSender() { Stop(); }

const std::string& KvSender::backend_name() const { return core_->backend_name; }

absl::Status KvSender::Admit(const KvLayout& target) const {
  const KvLayout& layout = core_->source.layout;
  if (SameBlockFormat(layout, target)) {
    // Byte copies: the geometry must still be sound (a dry run of one block).
    const std::vector<int32_t> one = {0};
    return PlanBlockCopies(layout, target, one, one, 1, 0).status();
  }
  RETURN_IF_ERROR(CheckConvertible(layout, target));
  if (core_->staging == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV needs converting (block size ", layout.block_size, " -> ", target.block_size, ", ",
        KvDtypeName(layout.dtype), " -> ", KvDtypeName(target.dtype), ") and this worker's ",
        core_->backend_name, " lane has no conversion staging"));
  }
  return absl::OkStatus();
}

absl::Status KvSender::CheckDestination(const KvDestination& destination, int num_tokens) const {
  RETURN_IF_ERROR(Admit(destination.layout));
  const KvLayout& layout = core_->source.layout;
  const int blocks = (num_tokens + layout.block_size - 1) / layout.block_size;
  const std::vector<int32_t> stand_in(blocks, 0);
  if (SameBlockFormat(layout, destination.layout)) {
    return PlanBlockCopies(layout, destination.layout, stand_in, destination.block_ids, num_tokens,
                           destination.num_cached_tokens)
        .status();
  }
  return PlanKvConversion(layout, destination.layout, stand_in, destination.block_ids, num_tokens,
                          destination.num_cached_tokens, 0, layout.num_layers)
      .status();
}

absl::StatusOr<KvSender::Joined> KvSender::Connect(const std::string& agent_name,
                                                   const std::string& address,
                                                   absl::Duration timeout) {
  // Shared with the task: on a timeout it may still run after Run returns.
  auto joined = std::make_shared<Joined>();
  RETURN_IF_ERROR(core_->thread->Run(
      [core = core_, agent_name, address, joined](TransferBackend& backend) -> absl::Status {
        KvDestination dst;
        dst.agent_name = agent_name;
        dst.agent_address = address;
        RETURN_IF_ERROR(core->EnsurePeer(backend, dst));
        ASSIGN_OR_RETURN(joined->reply, backend.ConnectReply(agent_name));
        joined->agent_name = backend.agent_name();
        return absl::OkStatus();
      },
      timeout));
  return *joined;
}

std::shared_ptr<KvSend> KvSender::Begin(std::string id, KvDestination destination,
                                        absl::Time deadline, bool streamed, DoneCallback on_done) {
  return std::make_shared<KvSend>(core_, std::move(id), std::move(destination), deadline, streamed,
                                  std::move(on_done));
}

void KvSender::Chunk(const std::shared_ptr<KvSend>& send, KvChunkReady chunk) {
  if (!send->streamed) return;
  // After Stop the chunk is dropped: Whole then fails the send and gives the source back.
  (void)send->core->thread->Post([send, chunk = std::move(chunk)](TransferBackend& backend) {
    OnChunk(*send->core, backend, send, chunk);
  });
}

void KvSender::Whole(const std::shared_ptr<KvSend>& send, std::vector<int32_t> block_ids,
                     int num_tokens, std::function<void()> release_source) {
  // The task owns the release until it runs; dropped unrun (the thread stopped), it gives the
  // source back on destruction.
  auto release = std::make_shared<SourceRelease>(std::move(release_source));
  const bool posted = send->core->thread->Post(
      [send, block_ids = std::move(block_ids), num_tokens, release](TransferBackend& backend) {
        OnWhole(*send->core, backend, send, block_ids, num_tokens, std::move(*release));
      });
  if (!posted) {
    release->Run();
    KvSendReport report;
    report.status = absl::UnavailableError("prefill worker shutting down");
    report.failed_stage = SendStage::kShutdown;
    send->Report(std::move(report));
  }
}

void KvSender::Failed(const std::shared_ptr<KvSend>& send, absl::Status status) {
  const bool posted = send->core->thread->Post([send, status](TransferBackend&) {
    if (send->ended) return;
    send->Fail(SendStage::kProducer, status);
    StartTicking(*send->core, send);  // releases what chunks posted, then reports
  });
  if (!posted) {
    KvSendReport report;
    report.status = std::move(status);
    report.failed_stage = SendStage::kProducer;
    send->Report(std::move(report));
  }
}

void KvSender::Abandon(const std::shared_ptr<KvSend>& send) {
  // The next tick (or Whole) sees it and releases everything.
  send->MarkAbandoned();
}

bool KvSender::Fence(const std::shared_ptr<KvSend>& send, absl::Time deadline) {
  // Marked on the lane thread, between its tasks and ticks: every post happens there after an
  // abandoned check, so none follows this.
  absl::Status marked = send->core->thread->Run(
      [send](TransferBackend&) {
        send->MarkAbandoned();
        return absl::OkStatus();
      },
      std::max(absl::ZeroDuration(), deadline - absl::Now()));
  if (!marked.ok()) {
    // A stopped thread released everything on its last tick.
    return absl::IsUnavailable(marked) && send->WaitQuiescent(absl::Now());
  }
  return send->WaitQuiescent(deadline);
}

void KvSender::Stop() { core_->thread->Stop(); }

}  // namespace tandem::kvtransfer
