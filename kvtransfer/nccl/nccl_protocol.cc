#include "kvtransfer/nccl/nccl_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer::nccl {

std::vector<Segment> PlanSegments(const std::vector<CopyOp>& ops, uint64_t local_base,
                                  uint64_t region, const std::string& notification,
                                  uint64_t max_bytes, uint64_t max_ops) {
  max_bytes = std::max<uint64_t>(max_bytes, 1);
  max_ops = std::max<uint64_t>(max_ops, 1);
  std::vector<Segment> segments(1);
  segments.back().region = region;
  for (const CopyOp& op : ops) {
    uint64_t local = op.local_offset, remote = op.remote_offset, left = op.length;
    while (left > 0) {
      if (segments.back().data_bytes == max_bytes || segments.back().ops.size() == max_ops) {
        segments.emplace_back();
        segments.back().region = region;
      }
      Segment& s = segments.back();
      const uint64_t take = std::min(left, max_bytes - s.data_bytes);
      s.ops.push_back(WireOp{.remote_offset = remote, .length = take});
      s.gather.push_back(StagedPiece{
          .address = local_base + local, .staging_offset = s.data_bytes, .bytes = take});
      s.data_bytes += take;
      local += take;
      remote += take;
      left -= take;
    }
  }
  segments.back().notification = notification;
  return segments;
}

// ---------------------------------------------------------------------------------------------
// Initiator.

InitiatorSession::InitiatorSession(std::unique_ptr<Channel> channel, const Secret& secret,
                                   const SessionOptions& options, absl::Time now)
    : channel_(std::move(channel)),
      secret_(secret),
      options_(options),
      init_deadline_(now + options.connect_timeout) {}

InitiatorSession::~InitiatorSession() = default;

absl::StatusOr<uint64_t> InitiatorSession::Post(std::vector<Segment> segments, absl::Time now) {
  if (failed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl: the connection failed (", status_.message(), "); Disconnect and Connect again"));
  }
  const uint64_t id = next_id_++;
  Transfer& t = transfers_[id];
  t.segments = std::move(segments);
  t.deadline = now + options_.transfer_timeout;
  if (t.segments.empty()) {
    t.state = TransferState::kDone;
    return id;
  }
  unposted_.push_back(id);
  if (ready_) PostReady();
  return id;
}

void InitiatorSession::PostReady() {
  while (!failed() && !unposted_.empty()) {
    auto it = transfers_.find(unposted_.front());
    if (it == transfers_.end() || it->second.state != TransferState::kInProgress) {
      unposted_.pop_front();  // released, or failed at its deadline, before it went out
      continue;
    }
    Transfer& t = it->second;
    while (t.posted < t.segments.size()) {
      const Segment& s = t.segments[t.posted];
      MessageHeader h;
      h.sequence = next_sequence_;
      h.secret = secret_;
      h.region = s.region;
      h.op_count = s.ops.size();
      h.data_bytes = s.data_bytes;
      h.notification_bytes = static_cast<uint32_t>(s.notification.size());
      absl::StatusOr<OpId> op = channel_->PostExchange(
          EncodeHeader(h), EncodeControl(s.ops, s.notification), s.gather, s.data_bytes);
      if (!op.ok()) {
        Fail(absl::UnavailableError(absl::StrCat("nccl: posting message ", next_sequence_,
                                                 " failed: ", op.status().message())));
        return;
      }
      in_flight_.push_back(InFlight{.op = *op, .sequence = next_sequence_, .transfer = it->first});
      ++next_sequence_;
      ++t.posted;
    }
    unposted_.pop_front();
  }
}

void InitiatorSession::Reap() {
  while (!failed() && !in_flight_.empty()) {
    const InFlight f = in_flight_.front();
    const OpState state = channel_->Query(f.op);
    if (state == OpState::kPending) return;
    if (state == OpState::kFailed) {
      Fail(absl::UnavailableError(absl::StrCat(
          "nccl: message ", f.sequence, " to the peer failed: ", channel_->FailureReason())));
      return;
    }
    const std::string bytes = channel_->TakeReceived(f.op);
    absl::StatusOr<Ack> ack = DecodeAck(bytes);
    if (!ack.ok() || ack->sequence != f.sequence || !SameSecret(ack->secret, secret_)) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("nccl: bad ack for message ", f.sequence, ": ",
                       !ack.ok() ? std::string(ack.status().message())
                                 : (ack->sequence != f.sequence
                                        ? absl::StrCat("it acknowledges message ", ack->sequence)
                                        : std::string("wrong pairing secret")))));
      return;
    }
    in_flight_.pop_front();
    auto it = transfers_.find(f.transfer);
    if (it == transfers_.end()) continue;
    Transfer& t = it->second;
    if (++t.acked == t.segments.size()) t.state = TransferState::kDone;
  }
}

void InitiatorSession::Progress(absl::Time now) {
  if (failed()) return;
  const ChannelState state = channel_->Poll();
  if (state == ChannelState::kFailed) {
    Fail(absl::UnavailableError(absl::StrCat(
        ready_ ? "nccl: the communicator failed: " : "nccl: setting up the communicator failed: ",
        channel_->FailureReason())));
    return;
  }
  if (!ready_ && state == ChannelState::kReady) ready_ = true;
  if (!ready_ && now >= init_deadline_) {
    Fail(absl::DeadlineExceededError(absl::StrCat(
        "nccl: the peer did not join the communicator within connect_timeout (",
        absl::FormatDuration(options_.connect_timeout), "); the communicator was aborted")));
    return;
  }
  if (ready_) {
    PostReady();
    Reap();
    if (failed()) return;
  }
  for (auto& [id, t] : transfers_) {
    if (t.state != TransferState::kInProgress || now < t.deadline) continue;
    const absl::Status late = absl::DeadlineExceededError(
        absl::StrCat("nccl: transfer ", id, " did not complete within transfer_timeout (",
                     absl::FormatDuration(options_.transfer_timeout), ")"));
    if (t.posted == 0) {
      // Nothing of it reached the channel (still waiting for set-up): fail it alone.
      t.state = TransferState::kFailed;
      t.error = absl::DeadlineExceededError(
          absl::StrCat(late.message(), " waiting for the communicator to be set up"));
      continue;
    }
    Fail(absl::DeadlineExceededError(
        absl::StrCat(late.message(), "; the communicator was aborted")));
    return;
  }
}

absl::StatusOr<TransferState> InitiatorSession::State(uint64_t id) const {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return absl::NotFoundError(absl::StrCat("nccl: no transfer ", id));
  return it->second.state;
}

absl::Status InitiatorSession::TransferError(uint64_t id) const {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return absl::NotFoundError(absl::StrCat("nccl: no transfer ", id));
  return it->second.error;
}

absl::Status InitiatorSession::Release(uint64_t id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return absl::NotFoundError(absl::StrCat("nccl: no transfer ", id));
  const Transfer& t = it->second;
  if (t.state == TransferState::kInProgress && t.posted > t.acked) {
    Fail(absl::CancelledError(absl::StrCat("nccl: transfer ", id,
                                           " was released while its messages were in flight; "
                                           "the communicator was aborted")));
  }
  transfers_.erase(it);
  return absl::OkStatus();
}

void InitiatorSession::Fail(const absl::Status& why) {
  if (failed()) return;
  channel_->Abort();
  status_ = why;
  for (auto& [id, t] : transfers_) {
    if (t.state != TransferState::kInProgress) continue;
    t.state = TransferState::kFailed;
    t.error = why;
  }
  unposted_.clear();
  in_flight_.clear();
}

// ---------------------------------------------------------------------------------------------
// Target.

TargetSession::TargetSession(std::unique_ptr<Channel> channel, const Secret& secret,
                             const SessionOptions& options, RegionLookup lookup, absl::Time now)
    : channel_(std::move(channel)),
      secret_(secret),
      options_(options),
      lookup_(std::move(lookup)),
      init_deadline_(now + options.connect_timeout) {}

TargetSession::~TargetSession() = default;

void TargetSession::Progress(absl::Time now) {
  if (failed()) return;
  if (stage_ == Stage::kConnecting) {
    switch (channel_->Poll()) {
      case ChannelState::kConnecting:
        if (now >= init_deadline_) {
          Fail(absl::DeadlineExceededError(absl::StrCat(
              "nccl: the initiator did not join the communicator within connect_timeout (",
              absl::FormatDuration(options_.connect_timeout), "); the communicator was aborted")));
        }
        return;
      case ChannelState::kFailed:
        Fail(absl::UnavailableError(
            absl::StrCat("nccl: setting up the communicator failed: ", channel_->FailureReason())));
        return;
      case ChannelState::kReady:
        break;
    }
    absl::StatusOr<OpId> op = channel_->PostRecvHeader();
    if (!op.ok()) {
      Fail(absl::UnavailableError(
          absl::StrCat("nccl: posting the header receive failed: ", op.status().message())));
      return;
    }
    op_ = *op;
    stage_ = Stage::kWaitHeader;
  }
  bool progressed = true;
  while (progressed && !failed()) {
    progressed = false;
    while (!scatters_.empty()) {
      const OpState state = channel_->Query(scatters_.front().op);
      if (state == OpState::kPending) break;
      if (state == OpState::kFailed) {
        Fail(absl::InternalError(
            absl::StrCat("nccl: scattering a message failed: ", channel_->FailureReason())));
        return;
      }
      channel_->Forget(scatters_.front().op);
      if (!scatters_.front().notification.empty()) {
        notifications_.push_back(std::move(scatters_.front().notification));
      }
      scatters_.pop_front();
    }
    const OpState state = channel_->Query(op_);
    if (state == OpState::kFailed) {
      Fail(absl::UnavailableError(absl::StrCat("nccl: receiving message ", next_sequence_,
                                               " failed: ", channel_->FailureReason())));
      return;
    }
    if (state == OpState::kPending) {
      if (stage_ == Stage::kWaitBody && now >= body_deadline_) {
        Fail(absl::DeadlineExceededError(absl::StrCat(
            "nccl: message ", next_sequence_, " did not arrive within transfer_timeout (",
            absl::FormatDuration(options_.transfer_timeout),
            ") of its header; the communicator was aborted")));
      }
      return;
    }
    const std::string bytes = channel_->TakeReceived(op_);
    absl::Status s = stage_ == Stage::kWaitHeader ? OnHeader(bytes, now) : OnBody(bytes);
    if (!s.ok()) {
      Fail(s);
      return;
    }
    progressed = true;
  }
}

absl::Status TargetSession::OnHeader(const std::string& bytes, absl::Time now) {
  absl::StatusOr<MessageHeader> h = DecodeHeader(bytes);
  if (!h.ok()) return h.status();
  if (!SameSecret(h->secret, secret_)) {
    return absl::PermissionDeniedError(
        absl::StrCat("nccl: message ", h->sequence, " carries the wrong pairing secret"));
  }
  if (h->sequence != next_sequence_) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: message has sequence number ",
                                                   h->sequence, ", expected ", next_sequence_));
  }
  if (h->op_count > options_.max_ops_per_message) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: message ", h->sequence, " has ",
                                                   h->op_count, " ops (at most ",
                                                   options_.max_ops_per_message, ")"));
  }
  if (h->data_bytes > options_.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: message ", h->sequence, " carries ", h->data_bytes,
                     " data bytes, more than the staging cap (", options_.max_message_bytes, ")"));
  }
  if (h->notification_bytes > kMaxNotificationBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: message ", h->sequence, " has a ", h->notification_bytes,
                     "-byte notification (at most ", kMaxNotificationBytes, ")"));
  }
  if (absl::StatusOr<LocalRegion> region = lookup_(h->region); !region.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: message ", h->sequence, " names region ",
                                                   h->region, ": ", region.status().message()));
  }
  absl::StatusOr<OpId> op =
      channel_->PostRecvBody(h->op_count * kWireOpBytes + h->notification_bytes, h->data_bytes);
  if (!op.ok()) {
    return absl::UnavailableError(absl::StrCat("nccl: posting the receive of message ", h->sequence,
                                               " failed: ", op.status().message()));
  }
  header_ = *h;
  op_ = *op;
  body_deadline_ = now + options_.transfer_timeout;
  stage_ = Stage::kWaitBody;
  return absl::OkStatus();
}

absl::Status TargetSession::OnBody(const std::string& bytes) {
  std::vector<WireOp> ops;
  std::string notification;
  if (absl::Status s =
          DecodeControl(bytes, header_.op_count, header_.notification_bytes, &ops, &notification);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<LocalRegion> region = lookup_(header_.region);
  if (!region.ok()) return region.status();
  // Staging holds the ops' bytes back to back: op i starts where op i-1 ended.
  std::vector<CopyOp> copies;
  copies.reserve(ops.size());
  uint64_t staged = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].length > header_.data_bytes - staged) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: message ", header_.sequence, ": op ", i,
                                                     " runs past the message's ",
                                                     header_.data_bytes, " data bytes"));
    }
    copies.push_back(CopyOp{
        .local_offset = staged, .remote_offset = ops[i].remote_offset, .length = ops[i].length});
    staged += ops[i].length;
  }
  if (staged != header_.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: message ", header_.sequence,
                                                   ": op lengths sum to ", staged, ", its data is ",
                                                   header_.data_bytes, " bytes"));
  }
  if (absl::Status s = CheckOpsInRegions("nccl", copies, header_.data_bytes, region->length);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", header_.sequence, " from the initiator: ", s.message()));
  }
  std::vector<StagedPiece> scatter;
  scatter.reserve(copies.size());
  for (const CopyOp& c : copies) {
    if (c.length == 0) continue;
    scatter.push_back(StagedPiece{.address = region->base + c.remote_offset,
                                  .staging_offset = c.local_offset,
                                  .bytes = c.length});
  }
  absl::StatusOr<OpId> scattered = channel_->PostScatter(scatter);
  if (!scattered.ok()) {
    return absl::UnavailableError(absl::StrCat("nccl: posting the scatter of message ",
                                               header_.sequence,
                                               " failed: ", scattered.status().message()));
  }
  scatters_.push_back(PendingScatter{
      .op = *scattered, .region = header_.region, .notification = std::move(notification)});
  absl::StatusOr<OpId> next = channel_->PostAckAndRecvHeader(
      EncodeAck(Ack{.sequence = header_.sequence, .secret = secret_}));
  if (!next.ok()) {
    return absl::UnavailableError(absl::StrCat("nccl: posting the ack of message ",
                                               header_.sequence,
                                               " failed: ", next.status().message()));
  }
  op_ = *next;
  ++next_sequence_;
  stage_ = Stage::kWaitHeader;
  return absl::OkStatus();
}

std::vector<std::string> TargetSession::TakeNotifications() {
  std::vector<std::string> out;
  out.swap(notifications_);
  return out;
}

bool TargetSession::UsesRegion(uint64_t region) const {
  if (stage_ == Stage::kWaitBody && header_.region == region) return true;
  for (const PendingScatter& s : scatters_) {
    if (s.region == region) return true;
  }
  return false;
}

void TargetSession::Fail(const absl::Status& why) {
  if (failed()) return;
  channel_->Abort();
  status_ = why;
  stage_ = Stage::kFailed;
  scatters_.clear();
}

}  // namespace tandem::kvtransfer::nccl
