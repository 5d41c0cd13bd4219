#pragma once
// The nccl backend's protocol, with no CUDA or NCCL (unit-tested on a CPU with an in-memory fake
// Channel): the per-communicator state machines of the initiator (prefill, rank 0) and the
// target (decode, rank 1), their deadlines, and the target's validation of everything it
// receives. nccl_channel.h implements Channel over NCCL and CUDA.
//
// NCCL is two-sided and ordered: the k-th send of one rank matches the k-th receive of the other,
// and operations of one communicator run one after another. One message (a "segment": a
// transfer larger than the staging cap is several) is, on each side's stream:
//   initiator: gather the ops' bytes into staging (one kernel), then ONE group
//              {send header, send control, send data, receive ack}; done = the ack arrived.
//   target:    (a header receive is always posted) header arrives -> validated -> group
//              {receive control, receive data into staging} -> op list validated -> scatter
//              staging into the region (one kernel) -> group {send ack, receive next header}.
// The initiator reports a transfer kDone only when every segment's ack arrived (remote
// completion); the target delivers the notification (carried by the last segment) once that
// segment's scatter finished.
//
// Failure: a communicator cannot cancel one message, so every failure aborts it (Channel::Abort)
// and fails every transfer on it; the session then stays failed (the backend reconnects).
//   - set-up not finished within connect_timeout (either side);
//   - a transfer not done within transfer_timeout of its Post (initiator; queueing included), or
//     a message whose body did not arrive within transfer_timeout of its header (target);
//   - anything malformed from the peer: bad framing, wrong secret, unexpected sequence number,
//     unknown region, more than kMaxOpsPerMessage ops, data larger than the staging cap, an op
//     outside the region, op lengths not summing to the data size, a bad ack;
//   - Release of a transfer whose messages were handed to the channel and not acknowledged.
// The target never writes a byte before the whole op list of that message was validated, and
// only inside the ops.
//
// Threading: not thread-safe; the backend's owning thread calls everything. `now` comes from the
// caller (tests drive time by hand). Nothing here blocks.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl/nccl_wire.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer::nccl {

enum class ChannelState { kConnecting, kReady, kFailed };
enum class OpState { kPending, kDone, kFailed };
using OpId = uint64_t;

// One contiguous range between local memory and the channel's staging buffer.
struct StagedPiece {
  uint64_t address = 0;  // in local memory (a device address for NCCL, a host one in the fake)
  uint64_t staging_offset = 0;
  uint64_t bytes = 0;
};

// One two-rank communicator as the protocol uses it. Posts are executed in order (one stream);
// each returns at once. After a failure or Abort every pending op reports kFailed.
class Channel {
 public:
  virtual ~Channel() = default;
  // Progresses set-up and reports it; never blocks. kFailed is final (FailureReason says why).
  virtual ChannelState Poll() = 0;
  virtual std::string FailureReason() const = 0;

  // Initiator: gather `gather` into staging (data_bytes in all), then one group {send header,
  // send control (if not empty), send staging (if data_bytes > 0), receive kAckBytes}.
  virtual absl::StatusOr<OpId> PostExchange(const std::string& header, const std::string& control,
                                            const std::vector<StagedPiece>& gather,
                                            uint64_t data_bytes) = 0;
  // Target: receive kHeaderBytes.
  virtual absl::StatusOr<OpId> PostRecvHeader() = 0;
  // Target: one group {receive control_bytes (if > 0), receive data_bytes into staging (if > 0)}.
  virtual absl::StatusOr<OpId> PostRecvBody(uint64_t control_bytes, uint64_t data_bytes) = 0;
  // Target: copy staging (as the last body left it) to local memory (one kernel).
  virtual absl::StatusOr<OpId> PostScatter(const std::vector<StagedPiece>& scatter) = 0;
  // Target: one group {send `ack`, receive the next kHeaderBytes}; done = the header arrived.
  virtual absl::StatusOr<OpId> PostAckAndRecvHeader(const std::string& ack) = 0;

  // Never blocks. Unknown ids report kFailed.
  virtual OpState Query(OpId op) = 0;
  // The bytes a done receive got (the ack, a header, or a body's control message), once; the op
  // is forgotten afterwards. Ops without received bytes are forgotten by Forget.
  virtual std::string TakeReceived(OpId op) = 0;
  virtual void Forget(OpId op) = 0;
  // Aborts the communicator (idempotent, bounded time). Poll reports kFailed afterwards.
  virtual void Abort() = 0;
};

struct SessionOptions {
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration transfer_timeout = absl::Seconds(5);
  // Data bytes of one message: the target refuses more, the initiator splits at it.
  uint64_t max_message_bytes = uint64_t{256} << 20;
  uint64_t max_ops_per_message = kMaxOpsPerMessage;
};

// One message of a transfer, as the initiator plans it (PlanSegments).
struct Segment {
  uint64_t region = 0;              // the target's region id
  std::vector<WireOp> ops;          // what the target receives
  std::vector<StagedPiece> gather;  // local address -> staging offset, one per op
  uint64_t data_bytes = 0;
  std::string notification;  // only on the last segment
};

// Splits already bounds-checked `ops` (offsets into a local region at `local_base` and the
// target's region `region`) into segments of at most `max_bytes` data and `max_ops` ops,
// splitting long ops; zero-length ops are dropped. Always at least one segment (an empty
// transfer is one empty message, acknowledged like any other).
std::vector<Segment> PlanSegments(const std::vector<CopyOp>& ops, uint64_t local_base,
                                  uint64_t region, const std::string& notification,
                                  uint64_t max_bytes, uint64_t max_ops);

// Rank 0: sends transfers to one target.
class InitiatorSession {
 public:
  InitiatorSession(std::unique_ptr<Channel> channel, const Secret& secret,
                   const SessionOptions& options, absl::Time now);
  ~InitiatorSession();

  // Queues a transfer; its messages go out as soon as the channel is ready, in Post order.
  // FailedPrecondition (with the session's error) when the session failed.
  absl::StatusOr<uint64_t> Post(std::vector<Segment> segments, absl::Time now);
  void Progress(absl::Time now);
  // kInProgress, kDone or kFailed as of the last Progress; NotFound for an unknown id.
  absl::StatusOr<TransferState> State(uint64_t id) const;
  // Why a kFailed transfer failed (OK otherwise).
  absl::Status TransferError(uint64_t id) const;
  // Forgets the transfer. If any of its messages is in the channel unacknowledged, the channel
  // is aborted first (every transfer of the session fails): after Release no byte of it is in
  // flight from this side.
  absl::Status Release(uint64_t id);
  // Aborts the channel and fails everything in progress.
  void Fail(const absl::Status& why);

  bool failed() const { return !status_.ok(); }
  const absl::Status& status() const { return status_; }
  bool ready() const { return ready_; }
  size_t transfers() const { return transfers_.size(); }

 private:
  struct Transfer {
    std::vector<Segment> segments;
    size_t posted = 0;  // segments handed to the channel
    size_t acked = 0;
    absl::Time deadline;
    TransferState state = TransferState::kInProgress;
    absl::Status error;
  };
  struct InFlight {
    OpId op = 0;
    uint64_t sequence = 0;
    uint64_t transfer = 0;
  };
  void PostReady();
  void Reap();

  std::unique_ptr<Channel> channel_;
  const Secret secret_;
  const SessionOptions options_;
  const absl::Time init_deadline_;
  bool ready_ = false;
  absl::Status status_;
  uint64_t next_id_ = 1;
  uint64_t next_sequence_ = 1;
  absl::flat_hash_map<uint64_t, Transfer> transfers_;
  std::deque<uint64_t> unposted_;  // transfer ids with segments not yet in the channel, in order
  std::deque<InFlight> in_flight_;
};

// What the target registered, as the protocol needs it.
struct LocalRegion {
  uint64_t base = 0;
  uint64_t length = 0;
};
using RegionLookup = std::function<absl::StatusOr<LocalRegion>(uint64_t id)>;

// Rank 1: receives one initiator's transfers into regions `lookup` resolves.
class TargetSession {
 public:
  TargetSession(std::unique_ptr<Channel> channel, const Secret& secret,
                const SessionOptions& options, RegionLookup lookup, absl::Time now);
  ~TargetSession();

  void Progress(absl::Time now);
  // Notifications of messages whose bytes landed, in order, since the last call.
  std::vector<std::string> TakeNotifications();
  // True while a message into the region is between its header and its scatter's end.
  bool UsesRegion(uint64_t region) const;
  void Fail(const absl::Status& why);

  bool failed() const { return !status_.ok(); }
  const absl::Status& status() const { return status_; }
  bool ready() const { return stage_ != Stage::kConnecting; }
  uint64_t messages_received() const { return next_sequence_ - 1; }

 private:
  enum class Stage { kConnecting, kWaitHeader, kWaitBody, kFailed };
  struct PendingScatter {
    OpId op = 0;
    uint64_t region = 0;
    std::string notification;
  };
  // Validates a received header; fills header_ and posts the body receive.
  absl::Status OnHeader(const std::string& bytes, absl::Time now);
  // Validates the op list; posts the scatter, the ack and the next header receive.
  absl::Status OnBody(const std::string& bytes);

  std::unique_ptr<Channel> channel_;
  const Secret secret_;
  const SessionOptions options_;
  const RegionLookup lookup_;
  const absl::Time init_deadline_;
  Stage stage_ = Stage::kConnecting;
  absl::Status status_;
  OpId op_ = 0;  // the header or body receive being waited for
  MessageHeader header_;
  absl::Time body_deadline_;
  uint64_t next_sequence_ = 1;
  std::deque<PendingScatter> scatters_;
  std::vector<std::string> notifications_;
};

}  // namespace tandem::kvtransfer::nccl
