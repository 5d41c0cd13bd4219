#include "kvtransfer/nccl/nccl_channel.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtransfer/nccl/piece_copy.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::kvtransfer::nccl {

BufferPool::~BufferPool() {
  for (Buffer& b : all_) {
    if (b.host != nullptr) (void)cudaFreeHost(b.host);
    if (b.device != nullptr) (void)cudaFree(b.device);
  }
}

absl::StatusOr<BufferPool::Buffer> BufferPool::Take(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
  }
  if (best != free_.end()) {
    Buffer b = *best;
    free_.erase(best);
    return b;
  }
  size_t capacity = 4096;
  while (capacity < bytes) capacity *= 2;
  Buffer b;
  cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&b.host), capacity, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&b.device), capacity);
  if (e != cudaSuccess) {
    if (b.host != nullptr) (void)cudaFreeHost(b.host);
    return CudaStatus(e, "nccl: message buffers");
  }
  b.capacity = capacity;
  all_.push_back(b);
  return b;
}

void BufferPool::Give(Buffer buffer) {
  if (buffer.capacity > 0) free_.push_back(buffer);
}

namespace {

size_t Align16(size_t n) { return (n + 15) & ~size_t{15}; }

size_t CountPieces(const std::vector<StagedPiece>& pieces) {
  size_t n = 0;
  for (const StagedPiece& p : pieces) n += (p.bytes + kMaxPieceBytes - 1) / kMaxPieceBytes;
  return n;
}

class NcclChannel final : public Channel {
 public:
  NcclChannel(std::shared_ptr<const NcclApi> api, const ChannelConfig& config)
      : api_(std::move(api)), config_(config), peer_(1 - config.rank) {}

  absl::Status Start() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(config_.device), "nccl: cudaSetDevice");
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                         "nccl: creating the stream");
    ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
    nccl_config.blocking = 0;
    ncclUniqueId id;
    std::memcpy(id.internal, config_.unique_id.data(), sizeof(id.internal));
    const ncclResult_t r = api_->CommInitRankConfig(&comm_, 2, id, config_.rank, &nccl_config);
    if (r != ncclSuccess && r != ncclInProgress) {
      absl::Status s = NcclStatus(*api_, r, "nccl: ncclCommInitRankConfig", comm_);
      if (comm_ != nullptr) (void)api_->CommAbort(comm_);
      comm_ = nullptr;
      return s;
    }
    return absl::OkStatus();
  }

  ~NcclChannel() override {
    Abort();
    (void)cudaSetDevice(config_.device);
    if (drained_) {
      if (staging_ != nullptr) (void)cudaFreeAsync(staging_, stream_);
      for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  ChannelState Poll() override {
    if (failed_) return ChannelState::kFailed;
    if (!ready_) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = api_->CommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) {
        Fail(NcclStatus(*api_, r, "nccl: ncclCommGetAsyncError", comm_));
      } else if (state == ncclInProgress) {
        return ChannelState::kConnecting;
      } else if (state != ncclSuccess) {
        Fail(NcclStatus(*api_, state, "nccl: communicator set-up", comm_));
      } else {
        ready_ = true;
      }
    }
    Pump();
    return failed_ ? ChannelState::kFailed : ChannelState::kReady;
  }
  std::string FailureReason() const override { return reason_; }

  absl::StatusOr<OpId> PostExchange(const std::string& header, const std::string& control,
                                    const std::vector<StagedPiece>& gather,
                                    uint64_t data_bytes) override {
    Op op(Kind::kExchange);
    op.control_bytes = control.size();
    op.data_bytes = data_bytes;
    op.pieces = gather;
    const size_t pieces_at = Align16(kHeaderBytes + control.size());
    op.pieces_offset = pieces_at;
    op.num_pieces = CountPieces(gather);
    op.recv_offset = Align16(pieces_at + op.num_pieces * sizeof(CopyPiece));
    op.recv_bytes = kAckBytes;
    op.upload = pieces_at + op.num_pieces * sizeof(CopyPiece);
    ASSIGN_OR_RETURN(op.buffer, TakeBuffer(op.recv_offset + kAckBytes));
    std::memcpy(op.buffer.host, header.data(), kHeaderBytes);
    if (!control.empty())
      std::memcpy(op.buffer.host + kHeaderBytes, control.data(), control.size());
    return Add(std::move(op));
  }

  absl::StatusOr<OpId> PostRecvHeader() override {
    Op op(Kind::kRecvHeader);
    op.recv_bytes = kHeaderBytes;
    ASSIGN_OR_RETURN(op.buffer, TakeBuffer(kHeaderBytes));
    return Add(std::move(op));
  }

  absl::StatusOr<OpId> PostRecvBody(uint64_t control_bytes, uint64_t data_bytes) override {
    Op op(Kind::kRecvBody);
    op.control_bytes = control_bytes;
    op.data_bytes = data_bytes;
    op.recv_bytes = control_bytes;
    ASSIGN_OR_RETURN(op.buffer, TakeBuffer(control_bytes));
    return Add(std::move(op));
  }

  absl::StatusOr<OpId> PostScatter(const std::vector<StagedPiece>& scatter) override {
    Op op(Kind::kScatter);
    op.pieces = scatter;
    op.num_pieces = CountPieces(scatter);
    op.upload = op.num_pieces * sizeof(CopyPiece);
    ASSIGN_OR_RETURN(op.buffer, TakeBuffer(op.upload));
    return Add(std::move(op));
  }

  absl::StatusOr<OpId> PostAckAndRecvHeader(const std::string& ack) override {
    Op op(Kind::kAckRecvHeader);
    op.upload = kAckBytes;
    op.recv_offset = Align16(kAckBytes);
    op.recv_bytes = kHeaderBytes;
    ASSIGN_OR_RETURN(op.buffer, TakeBuffer(op.recv_offset + kHeaderBytes));
    std::memcpy(op.buffer.host, ack.data(), kAckBytes);
    return Add(std::move(op));
  }

  OpState Query(OpId id) override {
    Pump();
    auto it = ops_.find(id);
    if (failed_ || it == ops_.end()) return OpState::kFailed;
    Op& op = it->second;
    if (op.done) return OpState::kDone;
    if (!op.issued) return OpState::kPending;
    const cudaError_t e = cudaEventQuery(op.event);
    if (e == cudaErrorNotReady) return OpState::kPending;
    if (e != cudaSuccess) {
      Fail(CudaStatus(e, "nccl: a copy or transfer on the stream failed"));
      return OpState::kFailed;
    }
    op.done = true;
    return OpState::kDone;
  }

  std::string TakeReceived(OpId id) override {
    auto it = ops_.find(id);
    if (it == ops_.end() || !it->second.done) return "";
    Op& op = it->second;
    std::string bytes(op.buffer.host + op.recv_offset, op.recv_bytes);
    Drop(it);
    return bytes;
  }

  void Forget(OpId id) override {
    auto it = ops_.find(id);
    if (it != ops_.end() && it->second.done) Drop(it);
  }

  void Abort() override {
    if (aborted_) return;
    aborted_ = true;
    if (reason_.empty()) reason_ = "the communicator was aborted";
    failed_ = true;
    (void)cudaSetDevice(config_.device);
    if (comm_ != nullptr) {
      // Makes NCCL's kernels on the stream return; the communicator is freed.
      (void)api_->CommAbort(comm_);
      comm_ = nullptr;
    }
    // Our own kernels and copies are local: the stream drains right after NCCL's kernels left.
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    cudaError_t e = cudaSuccess;
    while (stream_ != nullptr && (e = cudaStreamQuery(stream_)) == cudaErrorNotReady &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(200));
    }
    drained_ = e != cudaErrorNotReady;
    if (!drained_) {
      LOG(WARNING) << "nccl: the stream did not drain within 1 s of ncclCommAbort; its "
                      "buffers are leaked";
    }
    for (auto& [id, op] : ops_) {
      if (drained_) Release(op);
    }
    ops_.clear();
    waiting_.clear();
    held_ = 0;
  }

 private:
  enum class Kind { kExchange, kRecvHeader, kRecvBody, kScatter, kAckRecvHeader };
  struct Op {
    explicit Op(Kind k) : kind(k) {}
    Kind kind;
    BufferPool::Buffer buffer;
    size_t upload = 0;         // bytes of buffer copied to the device before the op
    size_t pieces_offset = 0;  // where its CopyPieces go in the buffer
    size_t num_pieces = 0;
    size_t recv_offset = 0;  // where received control bytes land in the buffer
    size_t recv_bytes = 0;
    uint64_t control_bytes = 0, data_bytes = 0;
    std::vector<StagedPiece> pieces;
    cudaEvent_t event = nullptr;
    bool issued = false;  // everything (event included) is on the stream
    bool done = false;
  };

  absl::StatusOr<BufferPool::Buffer> TakeBuffer(size_t bytes) {
    if (failed_) return absl::FailedPreconditionError(absl::StrCat("nccl: ", reason_));
    RETURN_IF_CUDA_ERROR(cudaSetDevice(config_.device), "nccl: cudaSetDevice");
    return config_.pool->Take(bytes);
  }

  absl::StatusOr<OpId> Add(Op op) {
    if (op.data_bytes > config_.max_staging_bytes) {
      config_.pool->Give(op.buffer);
      return absl::InvalidArgumentError(absl::StrCat("nccl: ", op.data_bytes,
                                                     " data bytes exceed the staging cap (",
                                                     config_.max_staging_bytes, ")"));
    }
    if (!free_events_.empty()) {
      op.event = free_events_.back();
      free_events_.pop_back();
    } else {
      const cudaError_t e = cudaEventCreateWithFlags(&op.event, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        config_.pool->Give(op.buffer);
        return CudaStatus(e, "nccl: event");
      }
      events_.push_back(op.event);
    }
    const OpId id = next_++;
    ops_.emplace(id, std::move(op));
    waiting_.push_back(id);
    Pump();
    return id;
  }

  void Release(Op& op) {
    config_.pool->Give(op.buffer);
    op.buffer = {};
    if (op.event != nullptr) free_events_.push_back(op.event);
    op.event = nullptr;
  }
  void Drop(absl::flat_hash_map<OpId, Op>::iterator it) {
    Release(it->second);
    ops_.erase(it);
  }

  void Fail(const absl::Status& why) {
    if (failed_) return;
    failed_ = true;
    reason_ = std::string(why.message());
  }

  // Issues waiting ops in order while NCCL has enqueued everything before them.
  void Pump() {
    if (failed_ || !ready_) return;
    (void)cudaSetDevice(config_.device);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api_->CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      Fail(NcclStatus(*api_, r != ncclSuccess ? r : state, "nccl: communicator error", comm_));
      return;
    }
    if (held_ != 0) {
      if (state == ncclInProgress) return;
      auto it = ops_.find(held_);
      held_ = 0;
      if (it != ops_.end()) {
        if (absl::Status s = IssueTail(it->second); !s.ok()) {
          Fail(s);
          return;
        }
      }
    }
    while (held_ == 0 && !waiting_.empty()) {
      const OpId id = waiting_.front();
      waiting_.pop_front();
      auto it = ops_.find(id);
      if (it == ops_.end()) continue;
      if (absl::Status s = Issue(id, it->second); !s.ok()) {
        Fail(s);
        return;
      }
    }
  }

  absl::Status EnsureStaging(uint64_t bytes) {
    if (bytes <= staging_capacity_) return absl::OkStatus();
    uint64_t capacity = std::max<uint64_t>(staging_capacity_ * 2, uint64_t{1} << 20);
    capacity = std::min(std::max(capacity, bytes), config_.max_staging_bytes);
    // Stream-ordered: the old buffer is freed after every earlier use on the stream.
    if (staging_ != nullptr) {
      RETURN_IF_CUDA_ERROR(cudaFreeAsync(staging_, stream_), "nccl: freeing staging");
    }
    staging_ = nullptr;
    staging_capacity_ = 0;
    RETURN_IF_CUDA_ERROR(cudaMallocAsync(&staging_, capacity, stream_),
                         absl::StrCat("nccl: staging buffer of ", capacity, " bytes"));
    staging_capacity_ = capacity;
    return absl::OkStatus();
  }

  // The piece list into the op's pinned buffer: region <-> staging, split into bounded pieces.
  void FillPieces(Op& op) {
    CopyPiece* out = reinterpret_cast<CopyPiece*>(op.buffer.host + op.pieces_offset);
    const uint64_t staging = reinterpret_cast<uint64_t>(staging_);
    for (const StagedPiece& p : op.pieces) {
      for (uint64_t done = 0; done < p.bytes; done += kMaxPieceBytes) {
        const uint64_t n = std::min<uint64_t>(kMaxPieceBytes, p.bytes - done);
        const uint64_t local = p.address + done, staged = staging + p.staging_offset + done;
        *out++ = op.kind == Kind::kExchange ? CopyPiece{.src = local, .dst = staged, .bytes = n}
                                            : CopyPiece{.src = staged, .dst = local, .bytes = n};
      }
    }
  }

  absl::Status Issue(OpId id, Op& op) {
    if (op.kind == Kind::kExchange || op.kind == Kind::kRecvBody) {
      RETURN_IF_ERROR(EnsureStaging(op.data_bytes));
    }
    if (op.num_pieces > 0) FillPieces(op);
    if (op.upload > 0) {
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(op.buffer.device, op.buffer.host, op.upload,
                                           cudaMemcpyHostToDevice, stream_),
                           "nccl: uploading a message");
    }
    if (op.num_pieces > 0) {
      RETURN_IF_CUDA_ERROR(
          LaunchPieceCopy(reinterpret_cast<const CopyPiece*>(op.buffer.device + op.pieces_offset),
                          static_cast<int>(op.num_pieces), config_.num_sms, stream_),
          op.kind == Kind::kExchange ? "nccl: gather kernel" : "nccl: scatter kernel");
    }
    if (op.kind != Kind::kScatter) {
      ncclResult_t first = api_->GroupStart();
      auto keep = [&first](ncclResult_t r) {
        if (first == ncclSuccess) first = r;
      };
      char* dev = op.buffer.device;
      switch (op.kind) {
        case Kind::kExchange:
          keep(api_->Send(dev, kHeaderBytes, ncclUint8, peer_, comm_, stream_));
          if (op.control_bytes > 0) {
            keep(
                api_->Send(dev + kHeaderBytes, op.control_bytes, ncclUint8, peer_, comm_, stream_));
          }
          if (op.data_bytes > 0) {
            keep(api_->Send(staging_, op.data_bytes, ncclUint8, peer_, comm_, stream_));
          }
          keep(api_->Recv(dev + op.recv_offset, kAckBytes, ncclUint8, peer_, comm_, stream_));
          break;
        case Kind::kRecvHeader:
          keep(api_->Recv(dev, kHeaderBytes, ncclUint8, peer_, comm_, stream_));
          break;
        case Kind::kRecvBody:
          if (op.control_bytes > 0) {
            keep(api_->Recv(dev, op.control_bytes, ncclUint8, peer_, comm_, stream_));
          }
          if (op.data_bytes > 0) {
            keep(api_->Recv(staging_, op.data_bytes, ncclUint8, peer_, comm_, stream_));
          }
          break;
        case Kind::kAckRecvHeader:
          keep(api_->Send(dev, kAckBytes, ncclUint8, peer_, comm_, stream_));
          keep(api_->Recv(dev + op.recv_offset, kHeaderBytes, ncclUint8, peer_, comm_, stream_));
          break;
        case Kind::kScatter:
          break;
      }
      const ncclResult_t end = api_->GroupEnd();
      if (first != ncclSuccess && first != ncclInProgress) {
        return NcclStatus(*api_, first, "nccl: posting a send or receive", comm_);
      }
      if (end == ncclInProgress) {
        held_ = id;  // its tail goes on the stream once NCCL enqueued the group
        return absl::OkStatus();
      }
      if (end != ncclSuccess) return NcclStatus(*api_, end, "nccl: ncclGroupEnd", comm_);
    }
    return IssueTail(op);
  }

  absl::Status IssueTail(Op& op) {
    if (op.recv_bytes > 0) {
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(op.buffer.host + op.recv_offset, op.buffer.device + op.recv_offset,
                          op.recv_bytes, cudaMemcpyDeviceToHost, stream_),
          "nccl: downloading a message");
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(op.event, stream_), "nccl: event record");
    op.issued = true;
    return absl::OkStatus();
  }

  const std::shared_ptr<const NcclApi> api_;
  const ChannelConfig config_;
  const int peer_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool ready_ = false;
  bool failed_ = false;
  bool aborted_ = false;
  bool drained_ = true;
  std::string reason_;
  void* staging_ = nullptr;
  uint64_t staging_capacity_ = 0;
  OpId next_ = 1;
  absl::flat_hash_map<OpId, Op> ops_;
  std::deque<OpId> waiting_;  // posted, not yet on the stream
  OpId held_ = 0;             // its group is being enqueued by NCCL (ncclInProgress)
  std::vector<cudaEvent_t> events_, free_events_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Channel>> StartNcclChannel(std::shared_ptr<const NcclApi> api,
                                                          const ChannelConfig& config) {
  auto channel = std::make_unique<NcclChannel>(std::move(api), config);
  RETURN_IF_ERROR(channel->Start());
  return channel;
}

absl::StatusOr<UniqueId> NewUniqueId(const NcclApi& api) {
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(api, api.GetUniqueId(&id), "nccl: ncclGetUniqueId"));
  UniqueId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

}  // namespace tandem::kvtransfer::nccl
