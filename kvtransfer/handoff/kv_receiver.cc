#include "kvtransfer/handoff/kv_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/kv_checksum.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Create(std::vector<ReceiverLane> lanes,
                                                               KvReceiverOptions options) {
  if (lanes.empty()) return absl::InvalidArgumentError("kv receiver: no transfer lane");
  std::vector<ReceiverEndpoint> endpoints;
  for (ReceiverLane& lane : lanes) {
    // Shared with the task: on a timeout it may still run after Run returns.
    auto e = std::make_shared<ReceiverEndpoint>();
    e->backend = lane.thread->backend_name();
    e->layout = lane.layout;
    e->staged = lane.staged;
    e->host_memory = lane.host_memory != nullptr;
    const uint64_t region_id = lane.region_id;
    absl::Status exported = lane.thread->Run(
        [e, region_id](TransferBackend& b) -> absl::Status {
          ASSIGN_OR_RETURN(e->region, b.ExportRegion(region_id));
          ASSIGN_OR_RETURN(e->agent_address, b.LocalAddress());
          e->agent_name = b.agent_name();
          return absl::OkStatus();
        },
        options.setup_timeout);
    if (!exported.ok()) {
      for (ReceiverLane& l : lanes) l.thread->Stop();
      return absl::Status(exported.code(), absl::StrCat("kv receiver: exporting the ", e->backend,
                                                        " lane: ", exported.message()));
    }
    endpoints.push_back(*e);
  }
  return std::unique_ptr<KvReceiver>(
      new KvReceiver(std::move(lanes), std::move(endpoints), std::move(options)));
}

KvReceiver::KvReceiver(std::vector<ReceiverLane> lanes, std::vector<ReceiverEndpoint> endpoints,
                       KvReceiverOptions options)
    : lanes_(std::move(lanes)), endpoints_(std::move(endpoints)), options_(std::move(options)) {}

KvReceiver::~KvReceiver() { Stop(); }

void KvReceiver::Stop() {
  for (ReceiverLane& lane : lanes_) lane.thread->Stop();
}

std::optional<size_t> KvReceiver::FindEndpoint(const std::string& backend) const {
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (endpoints_[i].backend == backend) return i;
  }
  return std::nullopt;
}

absl::Status KvReceiver::Accept(size_t endpoint, const std::string& peer, const std::string& reply,
                                absl::Duration timeout) {
  if (endpoint >= lanes_.size()) return absl::InvalidArgumentError("kv receiver: no such endpoint");
  // By value: on a timeout the task may still run after this returns.
  return lanes_[endpoint].thread->Run(
      [peer, reply](TransferBackend& b) { return b.Accept(peer, reply); }, timeout);
}

std::unique_ptr<KvReceiver::Expected> KvReceiver::Expect(size_t endpoint,
                                                         std::vector<int32_t> blocks,
                                                         int num_cached, int num_tokens) {
  return std::unique_ptr<Expected>(new Expected(this, endpoint, std::move(blocks), num_cached,
                                                num_tokens, next_epoch_.fetch_add(1)));
}

void KvReceiver::AddQuarantined(int n) {
  quarantined_.fetch_add(n);
  if (options_.on_quarantine) options_.on_quarantine(n);
}

KvReceiver::Expected::Expected(KvReceiver* receiver, size_t endpoint, std::vector<int32_t> blocks,
                               int num_cached, int num_tokens, uint64_t epoch)
    : receiver_(receiver),
      endpoint_(endpoint),
      blocks_(std::move(blocks)),
      num_cached_(num_cached),
      num_tokens_(num_tokens),
      epoch_(epoch) {}

KvReceiver::Expected::~Expected() { Drop(); }

bool KvReceiver::Expected::verifiable() const {
  return endpoint_ < receiver_->lanes_.size() &&
         receiver_->lanes_[endpoint_].host_memory != nullptr;
}

absl::Status KvReceiver::Expected::Landed(std::optional<uint64_t> checksum) {
  if (!checksum.has_value() || !verifiable()) return absl::OkStatus();
  const ReceiverLane& lane = receiver_->lanes_[endpoint_];
  const KvLayout& layout = lane.layout;
  ASSIGN_OR_RETURN(
      uint64_t landed,
      KvChecksum(layout, lane.host_memory, lane.host_bytes, blocks_, num_cached_, num_tokens_,
                 layout.head_begin, layout.head_begin + layout.num_kv_heads, 0, layout.num_layers));
  if (landed != *checksum) {
    return absl::DataLossError(
        absl::StrCat("the KV that landed does not match what the prefill "
                     "worker sent (checksum ",
                     absl::Hex(landed), " != ", absl::Hex(*checksum), ")"));
  }
  return absl::OkStatus();
}

void KvReceiver::Expected::Quarantine(absl::Time now) {
  if (quarantined_) return;
  quarantined_ = true;
  lease_end_ = now + receiver_->options_.fence_lease;
  receiver_->AddQuarantined(static_cast<int>(blocks_.size()));
}

bool KvReceiver::Expected::Release(bool confirmed, absl::Time now) {
  if (!quarantined_) return true;
  if (!confirmed && now < lease_end_) return false;
  Drop();
  return true;
}

void KvReceiver::Expected::Drop() {
  if (!quarantined_) return;
  quarantined_ = false;
  receiver_->AddQuarantined(-static_cast<int>(blocks_.size()));
}

}  // namespace tandem::kvtransfer
