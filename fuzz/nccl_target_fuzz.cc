// The nccl backend's target side (kvtransfer/nccl/nccl_protocol.h, TargetSession): everything a
// decode worker receives from an initiator on an NCCL communicator, validated before a byte is
// written. A scripted Channel plays the communicator: header and body receives take the next
// bytes of the input, and every scatter the session posts is checked against the region it
// names.
//
// Input: the byte stream the initiator sends, in order: a 64-byte header, then the op list and
// notification the header announces, then the next header, ... (the data itself is never looked
// at; the scatter reads the channel's staging). The pairing secret is "tandem-fuzz-sec!"; regions
// 1, 2 and 3 are registered (2 ends at the top of the address space).
// Properties: no crash; every scattered piece lies inside its region and inside the message's
// staged data, and is not empty; only a valid message is acknowledged and counted.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_support.h"
#include "kvtransfer/nccl/nccl_protocol.h"
#include "kvtransfer/nccl/nccl_wire.h"

namespace {

namespace nccl = tandem::kvtransfer::nccl;

constexpr char kSecretText[] = "tandem-fuzz-sec!";

nccl::Secret FuzzSecret() {
  nccl::Secret s;
  std::memcpy(s.data(), kSecretText, s.size());
  return s;
}

absl::StatusOr<nccl::LocalRegion> Lookup(uint64_t id) {
  switch (id) {
    case 1:
      return nccl::LocalRegion{.base = 0x10000, .length = 4096};
    case 2:
      return nccl::LocalRegion{.base = UINT64_MAX - 8191, .length = 8192};
    case 3:
      return nccl::LocalRegion{.base = 0x7f0000000000, .length = 1};
  }
  return absl::NotFoundError("no such region");
}

class ScriptedChannel final : public nccl::Channel {
 public:
  ScriptedChannel(const uint8_t* data, size_t size, int* acks)
      : stream_(reinterpret_cast<const char*>(data), size), acks_(acks) {}

  nccl::ChannelState Poll() override {
    return aborted_ ? nccl::ChannelState::kFailed : nccl::ChannelState::kReady;
  }
  std::string FailureReason() const override { return aborted_ ? "aborted" : ""; }
  absl::StatusOr<nccl::OpId> PostExchange(const std::string&, const std::string&,
                                          const std::vector<nccl::StagedPiece>&,
                                          uint64_t) override {
    FUZZ_CHECK(false);  // the target never initiates
    return absl::InternalError("unreachable");
  }
  absl::StatusOr<nccl::OpId> PostRecvHeader() override {
    FUZZ_CHECK(!header_posted_);  // once, at set-up; later headers come with the acks
    header_posted_ = true;
    return Add(Op{.receive = nccl::kHeaderBytes, .header = true});
  }
  absl::StatusOr<nccl::OpId> PostRecvBody(uint64_t control_bytes, uint64_t data_bytes) override {
    FUZZ_CHECK(have_header_);
    data_bytes_ = data_bytes;
    return Add(Op{.receive = control_bytes});
  }
  absl::StatusOr<nccl::OpId> PostScatter(const std::vector<nccl::StagedPiece>& scatter) override {
    FUZZ_CHECK(have_header_);
    absl::StatusOr<nccl::LocalRegion> region = Lookup(last_header_.region);
    FUZZ_CHECK(region.ok());
    uint64_t staged = 0;
    for (const nccl::StagedPiece& p : scatter) {
      FUZZ_CHECK(p.bytes > 0);
      FUZZ_CHECK(p.address >= region->base && p.address - region->base <= region->length &&
                 p.bytes <= region->length - (p.address - region->base));
      FUZZ_CHECK(p.staging_offset <= data_bytes_ && p.bytes <= data_bytes_ - p.staging_offset);
      staged += p.bytes;
    }
    FUZZ_CHECK(staged <= data_bytes_);
    return Add(Op{.done = true});
  }
  absl::StatusOr<nccl::OpId> PostAckAndRecvHeader(const std::string& ack) override {
    absl::StatusOr<nccl::Ack> a = nccl::DecodeAck(ack);
    FUZZ_CHECK(a.ok() && a->sequence == last_header_.sequence && a->secret == FuzzSecret());
    ++*acks_;
    return Add(Op{.receive = nccl::kHeaderBytes, .header = true});
  }
  nccl::OpState Query(nccl::OpId id) override {
    auto it = ops_.find(id);
    if (aborted_ || it == ops_.end()) return nccl::OpState::kFailed;
    Op& op = it->second;
    if (!op.done && stream_.size() >= op.receive) {  // the peer's bytes arrived
      op.received = std::string(stream_.substr(0, op.receive));
      stream_.remove_prefix(op.receive);
      op.done = true;
      if (op.header) {
        absl::StatusOr<nccl::MessageHeader> h = nccl::DecodeHeader(op.received);
        have_header_ = h.ok();
        if (h.ok()) last_header_ = *h;
      }
    }
    return op.done ? nccl::OpState::kDone : nccl::OpState::kPending;
  }
  std::string TakeReceived(nccl::OpId id) override {
    auto it = ops_.find(id);
    if (it == ops_.end()) return "";
    std::string bytes = std::move(it->second.received);
    ops_.erase(it);
    return bytes;
  }
  void Forget(nccl::OpId id) override { ops_.erase(id); }
  void Abort() override { aborted_ = true; }

 private:
  struct Op {
    uint64_t receive = 0;  // bytes this receive takes from the stream
    bool header = false;
    bool done = false;
    std::string received;
  };
  absl::StatusOr<nccl::OpId> Add(Op op) {
    const nccl::OpId id = next_id_++;
    ops_.emplace(id, std::move(op));
    return id;
  }

  std::string_view stream_;
  int* acks_;
  bool aborted_ = false;
  bool header_posted_ = false;
  bool have_header_ = false;
  nccl::MessageHeader last_header_;
  uint64_t data_bytes_ = 0;
  nccl::OpId next_id_ = 1;
  absl::flat_hash_map<nccl::OpId, Op> ops_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int acks = 0;
  nccl::SessionOptions options;
  options.max_message_bytes = 1 << 20;
  options.max_ops_per_message = 64;
  const absl::Time start = absl::FromUnixSeconds(1000000);
  nccl::TargetSession session(std::make_unique<ScriptedChannel>(data, size, &acks), FuzzSecret(),
                              options, Lookup, start);
  session.Progress(start);
  session.Progress(start + absl::Milliseconds(1));
  FUZZ_CHECK(session.messages_received() == static_cast<uint64_t>(acks));
  for (const std::string& n : session.TakeNotifications()) {
    FUZZ_CHECK(n.size() <= nccl::kMaxNotificationBytes);
  }
  session.UsesRegion(1);
  // A body that never comes: the deadline fails the session instead of waiting forever.
  session.Progress(start + options.transfer_timeout + absl::Seconds(1));
  return 0;
}
