// The nccl backend's protocol on a CPU (label unit): both state machines over an in-memory fake
// channel that behaves like a two-rank NCCL communicator (ordered messages each way, posts run in
// order, a receive waits for its message, abort fails everything pending), with host buffers as
// regions. Every corruption of a header, op list or ack is rejected with a clear status and the
// channel aborted; no byte outside the ops is ever written; a silent or dead peer never hangs
// either side.
#include "kvtransfer/nccl/nccl_protocol.h"

#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/nccl/nccl_wire.h"

namespace tandem::kvtransfer::nccl {
namespace {

using ::testing::HasSubstr;

// The wire between the two ranks.
struct FakeLink {
  std::deque<std::string> to_target, to_initiator;
  bool ready = true;  // set-up finishes at the first Poll
  bool dead = false;  // the peer died: every pending op fails
  int aborts = 0;
};

class FakeChannel final : public Channel {
 public:
  FakeChannel(std::shared_ptr<FakeLink> link, bool initiator)
      : link_(std::move(link)), initiator_(initiator) {}

  ChannelState Poll() override {
    if (aborted_ || link_->dead) return ChannelState::kFailed;
    return link_->ready ? ChannelState::kReady : ChannelState::kConnecting;
  }
  std::string FailureReason() const override {
    return aborted_ ? "aborted" : (link_->dead ? "peer died" : reason_);
  }

  absl::StatusOr<OpId> PostExchange(const std::string& header, const std::string& control,
                                    const std::vector<StagedPiece>& gather,
                                    uint64_t data_bytes) override {
    Op op(Kind::kExchange);
    op.header = header;
    op.control = control;
    op.pieces = gather;
    op.data_bytes = data_bytes;
    return Add(std::move(op));
  }
  absl::StatusOr<OpId> PostRecvHeader() override { return Add(Op(Kind::kRecvHeader)); }
  absl::StatusOr<OpId> PostRecvBody(uint64_t control_bytes, uint64_t data_bytes) override {
    Op op(Kind::kRecvBody);
    op.control_bytes = control_bytes;
    op.data_bytes = data_bytes;
    return Add(std::move(op));
  }
  absl::StatusOr<OpId> PostScatter(const std::vector<StagedPiece>& scatter) override {
    Op op(Kind::kScatter);
    op.pieces = scatter;
    return Add(std::move(op));
  }
  absl::StatusOr<OpId> PostAckAndRecvHeader(const std::string& ack) override {
    Op op(Kind::kAckRecvHeader);
    op.header = ack;
    return Add(std::move(op));
  }
  OpState Query(OpId id) override {
    Pump();
    auto it = ops_.find(id);
    return it == ops_.end() ? OpState::kFailed : it->second.state;
  }
  std::string TakeReceived(OpId id) override {
    auto it = ops_.find(id);
    if (it == ops_.end()) return "";
    std::string bytes = std::move(it->second.received);
    ops_.erase(it);
    return bytes;
  }
  void Forget(OpId id) override { ops_.erase(id); }
  void Abort() override {
    if (aborted_) return;
    aborted_ = true;
    ++link_->aborts;
    FailPending();
  }
  size_t staging_peak() const { return staging_peak_; }

 private:
  enum class Kind { kExchange, kRecvHeader, kRecvBody, kScatter, kAckRecvHeader };
  struct Op {
    explicit Op(Kind k = Kind::kRecvHeader) : kind(k) {}
    Kind kind;
    std::string header, control, received;
    std::vector<StagedPiece> pieces;
    uint64_t data_bytes = 0, control_bytes = 0;
    int step = 0;
    OpState state = OpState::kPending;
  };

  absl::StatusOr<OpId> Add(Op op) {
    if (aborted_) return absl::FailedPreconditionError("fake: aborted");
    const OpId id = next_++;
    ops_.emplace(id, std::move(op));
    stream_.push_back(id);
    return id;
  }
  std::deque<std::string>& out() { return initiator_ ? link_->to_target : link_->to_initiator; }
  std::deque<std::string>& in() { return initiator_ ? link_->to_initiator : link_->to_target; }
  // Takes the next inbound message when there is one; NCCL fails a size mismatch.
  bool Receive(Op& op, size_t size, std::string* into) {
    if (in().empty()) return false;
    *into = std::move(in().front());
    in().pop_front();
    if (into->size() != size) {
      reason_ = absl::StrCat("message of ", into->size(), " bytes, receive of ", size);
      op.state = OpState::kFailed;
    }
    return true;
  }
  void FailPending() {
    for (OpId id : stream_) ops_[id].state = OpState::kFailed;
    stream_.clear();
  }
  // Runs the stream as far as the messages at hand allow.
  void Pump() {
    if (aborted_ || link_->dead) {
      FailPending();
      return;
    }
    while (!stream_.empty()) {
      Op& op = ops_[stream_.front()];
      if (!Step(op)) return;
      stream_.pop_front();
      if (op.state == OpState::kFailed) {
        FailPending();
        return;
      }
    }
  }
  // True when `op` finished (done or failed).
  bool Step(Op& op) {
    switch (op.kind) {
      case Kind::kExchange:
        if (op.step == 0) {
          staging_.assign(op.data_bytes, '\0');
          for (const StagedPiece& p : op.pieces) {
            std::memcpy(&staging_[p.staging_offset], reinterpret_cast<const void*>(p.address),
                        p.bytes);
          }
          staging_peak_ = std::max<size_t>(staging_peak_, staging_.size());
          out().push_back(op.header);
          if (!op.control.empty()) out().push_back(op.control);
          if (op.data_bytes > 0) out().push_back(staging_);
          op.step = 1;
        }
        return Finish(op, Receive(op, kAckBytes, &op.received));
      case Kind::kRecvHeader:
        return Finish(op, Receive(op, kHeaderBytes, &op.received));
      case Kind::kRecvBody:
        if (op.step == 0) {
          if (op.control_bytes > 0 && !Receive(op, op.control_bytes, &op.received)) return false;
          op.step = 1;
          if (op.state == OpState::kFailed) return true;
        }
        if (op.data_bytes > 0) {
          if (!Receive(op, op.data_bytes, &staging_)) return false;
          staging_peak_ = std::max<size_t>(staging_peak_, staging_.size());
        }
        return Finish(op, true);
      case Kind::kScatter:
        for (const StagedPiece& p : op.pieces) {
          std::memcpy(reinterpret_cast<void*>(p.address), &staging_[p.staging_offset], p.bytes);
        }
        return Finish(op, true);
      case Kind::kAckRecvHeader:
        if (op.step == 0) {
          out().push_back(op.header);
          op.step = 1;
        }
        return Finish(op, Receive(op, kHeaderBytes, &op.received));
    }
    return false;
  }
  static bool Finish(Op& op, bool finished) {
    if (finished && op.state == OpState::kPending) op.state = OpState::kDone;
    return finished;
  }

  std::shared_ptr<FakeLink> link_;
  const bool initiator_;
  bool aborted_ = false;
  std::string reason_ = "failed";
  OpId next_ = 1;
  absl::flat_hash_map<OpId, Op> ops_;
  std::deque<OpId> stream_;
  std::string staging_;
  size_t staging_peak_ = 0;
};

constexpr size_t kGuard = 64;
constexpr unsigned char kCanary = 0xA5;

// A host buffer with canaries on both sides, registered as [base, base + length).
struct GuardedRegion {
  std::vector<unsigned char> bytes;
  size_t length;
  explicit GuardedRegion(size_t n, unsigned char fill) : bytes(n + 2 * kGuard, kCanary), length(n) {
    std::memset(bytes.data() + kGuard, fill, n);
  }
  unsigned char* base() { return bytes.data() + kGuard; }
  uint64_t address() { return reinterpret_cast<uint64_t>(base()); }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (bytes[i] != kCanary || bytes[bytes.size() - 1 - i] != kCanary) return false;
    }
    return true;
  }
  std::vector<unsigned char> Contents() const {
    return std::vector<unsigned char>(bytes.begin() + kGuard, bytes.begin() + kGuard + length);
  }
};

Secret TestSecret(uint8_t seed) {
  Secret s;
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(seed * 31 + i);
  return s;
}

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr uint64_t kRegionId = 7;

SessionOptions Options() {
  SessionOptions o;
  o.connect_timeout = absl::Seconds(2);
  o.transfer_timeout = absl::Seconds(3);
  o.max_message_bytes = 64 * 1024;
  return o;
}

// One pair over one link: an initiator with `src`, a target with `dst` registered as kRegionId.
struct Pair {
  std::shared_ptr<FakeLink> link = std::make_shared<FakeLink>();
  GuardedRegion src, dst;
  std::unique_ptr<InitiatorSession> initiator;
  std::unique_ptr<TargetSession> target;
  SessionOptions options;

  explicit Pair(size_t bytes, SessionOptions o = Options())
      : src(bytes, 0), dst(bytes, 0x5A), options(o) {
    std::mt19937 rng(1);
    for (size_t i = 0; i < bytes; ++i) src.base()[i] = static_cast<unsigned char>(rng());
    initiator = std::make_unique<InitiatorSession>(std::make_unique<FakeChannel>(link, true),
                                                   TestSecret(1), options, kT0);
    target = MakeTarget(TestSecret(1));
  }
  std::unique_ptr<TargetSession> MakeTarget(const Secret& secret) {
    return std::make_unique<TargetSession>(
        std::make_unique<FakeChannel>(link, false), secret, options,
        [this](uint64_t id) -> absl::StatusOr<LocalRegion> {
          if (id != kRegionId) return absl::NotFoundError("not registered");
          return LocalRegion{.base = dst.address(), .length = dst.length};
        },
        kT0);
  }
  absl::StatusOr<uint64_t> Post(const std::vector<CopyOp>& ops, const std::string& note,
                                absl::Time now = kT0) {
    return initiator->Post(PlanSegments(ops, src.address(), kRegionId, note,
                                        options.max_message_bytes, options.max_ops_per_message),
                           now);
  }
  void Run(absl::Time now = kT0, int rounds = 8) {
    for (int i = 0; i < rounds; ++i) {
      initiator->Progress(now);
      target->Progress(now);
    }
  }
};

std::vector<unsigned char> Apply(std::vector<unsigned char> dst, const unsigned char* src,
                                 const std::vector<CopyOp>& ops) {
  for (const CopyOp& op : ops) {
    std::memcpy(dst.data() + op.remote_offset, src + op.local_offset, op.length);
  }
  return dst;
}

// Scattered blocks of `block` bytes: a permutation of source blocks to destination blocks.
std::vector<CopyOp> ScatteredOps(size_t bytes, size_t block, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> src(bytes / block), dst(bytes / block);
  for (size_t i = 0; i < src.size(); ++i) src[i] = dst[i] = i;
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<CopyOp> ops;
  for (int i = 0; i < count; ++i) {
    ops.push_back(
        {.local_offset = src[i] * block, .remote_offset = dst[i] * block, .length = block});
  }
  return ops;
}

TEST(NcclProtocolTest, NormalTransferLandsExactlyAndNotifiesAfterwards) {
  Pair p(1 << 16);
  const std::vector<unsigned char> before = p.dst.Contents();
  std::vector<CopyOp> ops = ScatteredOps(1 << 16, 1024, 20, 3);
  ops.push_back({.local_offset = 5, .remote_offset = 60001, .length = 77});  // unaligned
  ops.push_back({.local_offset = 9, .remote_offset = 11, .length = 0});      // empty
  auto id = p.Post(ops, "request-42 done");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kInProgress);
  EXPECT_TRUE(p.target->TakeNotifications().empty());
  p.Run();
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kDone);
  EXPECT_TRUE(p.dst.Contents() == Apply(before, p.src.base(), ops));
  EXPECT_TRUE(p.dst.GuardsIntact());
  EXPECT_THAT(p.target->TakeNotifications(), ::testing::ElementsAre("request-42 done"));
  EXPECT_TRUE(p.initiator->Release(*id).ok());
  EXPECT_EQ(p.initiator->State(*id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.link->aborts, 0);
  EXPECT_FALSE(p.target->UsesRegion(kRegionId));
}

TEST(NcclProtocolTest, KDoneOnlyAfterTheAck) {
  Pair p(4096);
  auto id = p.Post({{.local_offset = 0, .remote_offset = 0, .length = 4096}}, "");
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 5; ++i) p.initiator->Progress(kT0);  // the target never ran
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kInProgress);
  p.target->Progress(kT0);  // header
  EXPECT_TRUE(p.target->UsesRegion(kRegionId) || p.link->to_initiator.size() == 1);
  p.Run();
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kDone);
}

TEST(NcclProtocolTest, ManyTransfersInOrderIncludingSplitOnes) {
  Pair p(1 << 18);  // staging cap 64 KiB: the large ones go as several messages
  std::vector<unsigned char> expected = p.dst.Contents();
  std::vector<uint64_t> ids;
  uint64_t messages = 0;
  for (int t = 0; t < 40; ++t) {
    std::vector<CopyOp> ops = ScatteredOps(1 << 18, 2048, 1 + (t * 7) % 90, 100 + t);
    expected = Apply(expected, p.src.base(), ops);
    messages += PlanSegments(ops, 0, kRegionId, "", 64 * 1024, kMaxOpsPerMessage).size();
    auto id = p.Post(ops, absl::StrCat("n", t));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    if (t % 3 == 0) p.Run(kT0, 1);  // interleave posting and progress
  }
  p.Run(kT0, 200);
  for (uint64_t id : ids) EXPECT_EQ(*p.initiator->State(id), TransferState::kDone) << id;
  EXPECT_TRUE(p.dst.Contents() == expected);
  EXPECT_TRUE(p.dst.GuardsIntact());
  std::vector<std::string> want;
  for (int t = 0; t < 40; ++t) want.push_back(absl::StrCat("n", t));
  EXPECT_EQ(p.target->TakeNotifications(), want);
  EXPECT_EQ(p.target->messages_received(), messages);
  EXPECT_GT(messages, 40u);
  EXPECT_EQ(p.link->aborts, 0);
}

TEST(NcclProtocolTest, PlanSegmentsSplitsByBytesAndOps) {
  const std::vector<CopyOp> ops = {{.local_offset = 0, .remote_offset = 1000, .length = 250},
                                   {.local_offset = 300, .remote_offset = 0, .length = 0},
                                   {.local_offset = 400, .remote_offset = 50, .length = 30}};
  auto segs = PlanSegments(ops, 10000, 3, "note", 100, 1000);
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].data_bytes, 100u);
  EXPECT_EQ(segs[1].data_bytes, 100u);
  EXPECT_EQ(segs[2].data_bytes, 80u);  // 50 of the long op, then the 30-byte one
  ASSERT_EQ(segs[2].ops.size(), 2u);
  EXPECT_EQ(segs[2].ops[0].remote_offset, 1200u);
  EXPECT_EQ(segs[2].gather[1].address, 10400u);
  EXPECT_EQ(segs[2].gather[1].staging_offset, 50u);
  EXPECT_EQ(segs[2].notification, "note");
  EXPECT_TRUE(segs[0].notification.empty());
  for (const Segment& s : segs) EXPECT_EQ(s.region, 3u);
  auto by_ops = PlanSegments(ops, 0, 3, "", 1 << 20, 1);
  EXPECT_EQ(by_ops.size(), 2u);
  auto empty = PlanSegments({}, 0, 3, "only a note", 100, 10);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].data_bytes, 0u);
  EXPECT_EQ(empty[0].notification, "only a note");
}

TEST(NcclProtocolTest, NotificationOnlyTransfer) {
  Pair p(4096);
  auto id = p.Post({}, "just this");
  ASSERT_TRUE(id.ok());
  p.Run();
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kDone);
  EXPECT_THAT(p.target->TakeNotifications(), ::testing::ElementsAre("just this"));
}

// A hand-made initiator: what it writes, the target must reject.
struct Corruption {
  std::string name;
  absl::StatusCode code;
  std::string message;
  // Edits a valid header / op list before they are sent.
  std::function<void(MessageHeader&, std::vector<WireOp>&, std::string& raw_header)> edit;
};

class CorruptionTest : public ::testing::TestWithParam<Corruption> {};

TEST_P(CorruptionTest, TargetRejectsAbortsAndWritesNothing) {
  const Corruption& c = GetParam();
  Pair p(8192);
  const std::vector<unsigned char> before = p.dst.Contents();
  // First a valid message, so the sequence number moves on.
  auto ok = p.Post({{.local_offset = 0, .remote_offset = 0, .length = 512}}, "first");
  ASSERT_TRUE(ok.ok());
  p.Run();
  ASSERT_EQ(*p.initiator->State(*ok), TransferState::kDone);
  const std::vector<unsigned char> after_first = p.dst.Contents();
  EXPECT_TRUE(after_first == Apply(before, p.src.base(), {{0, 0, 512}}));
  EXPECT_EQ(p.target->TakeNotifications().size(), 1u);

  MessageHeader h;
  h.sequence = 2;
  h.secret = TestSecret(1);
  h.region = kRegionId;
  std::vector<WireOp> ops = {{.remote_offset = 1024, .length = 256},
                             {.remote_offset = 4096, .length = 256}};
  h.op_count = ops.size();
  h.data_bytes = 512;
  const std::string note = "bad";
  h.notification_bytes = note.size();
  std::string raw;
  c.edit(h, ops, raw);
  if (raw.empty()) raw = EncodeHeader(h);
  p.link->to_target.push_back(raw);
  p.link->to_target.push_back(EncodeControl(ops, note));
  p.link->to_target.push_back(std::string(h.data_bytes < (1 << 20) ? h.data_bytes : 1, 'x'));
  for (int i = 0; i < 5; ++i) p.target->Progress(kT0);
  ASSERT_TRUE(p.target->failed()) << c.name;
  EXPECT_EQ(p.target->status().code(), c.code) << p.target->status();
  EXPECT_THAT(std::string(p.target->status().message()), HasSubstr(c.message));
  EXPECT_EQ(p.link->aborts, 1);
  EXPECT_TRUE(p.dst.Contents() == after_first) << "a rejected message wrote bytes";
  EXPECT_TRUE(p.dst.GuardsIntact());
  EXPECT_TRUE(p.target->TakeNotifications().empty());
  EXPECT_FALSE(p.target->UsesRegion(kRegionId));
}

INSTANTIATE_TEST_SUITE_P(
    Rejected, CorruptionTest,
    ::testing::Values(
        Corruption{"BadMagic", absl::StatusCode::kInvalidArgument, "bad magic",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string& raw) {
                     raw = EncodeHeader(h);
                     raw[0] ^= 1;
                   }},
        Corruption{"WrongVersion", absl::StatusCode::kInvalidArgument, "wire version 2",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string& raw) {
                     raw = EncodeHeader(h);
                     raw[4] = 2;
                   }},
        Corruption{"UnknownFlags", absl::StatusCode::kInvalidArgument, "unknown flags",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string& raw) {
                     raw = EncodeHeader(h);
                     raw[61] = 1;
                   }},
        Corruption{"OpOutOfRange", absl::StatusCode::kInvalidArgument, "op 1",
                   [](MessageHeader&, std::vector<WireOp>& ops, std::string&) {
                     ops[1].remote_offset = 8192 - 100;  // runs 156 bytes past the region
                   }},
        Corruption{"OpOffsetOverflow", absl::StatusCode::kInvalidArgument, "outside the regions",
                   [](MessageHeader&, std::vector<WireOp>& ops, std::string&) {
                     ops[0].remote_offset = ~uint64_t{0} - 10;
                   }},
        Corruption{"TooManyOps", absl::StatusCode::kInvalidArgument, "ops (at most 1048576)",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) {
                     h.op_count = kMaxOpsPerMessage + 1;
                   }},
        Corruption{
            "SizeMismatchShort", absl::StatusCode::kInvalidArgument, "sum to 384",
            [](MessageHeader&, std::vector<WireOp>& ops, std::string&) { ops[1].length = 128; }},
        Corruption{"SizeMismatchLong", absl::StatusCode::kInvalidArgument, "runs past",
                   [](MessageHeader&, std::vector<WireOp>& ops, std::string&) {
                     ops[1].length = 1 << 20;
                   }},
        Corruption{"DataOverStagingCap", absl::StatusCode::kInvalidArgument, "staging cap",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) {
                     h.data_bytes = 64 * 1024 + 1;
                   }},
        Corruption{"WrongSequence", absl::StatusCode::kInvalidArgument, "expected 2",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) { h.sequence = 5; }},
        Corruption{"ReplayedSequence", absl::StatusCode::kInvalidArgument, "expected 2",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) { h.sequence = 1; }},
        Corruption{
            "WrongSecret", absl::StatusCode::kPermissionDenied, "pairing secret",
            [](MessageHeader& h, std::vector<WireOp>&, std::string&) { h.secret[15] ^= 0x80; }},
        Corruption{"UnknownRegion", absl::StatusCode::kInvalidArgument, "names region 8",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) { h.region = 8; }},
        Corruption{"HugeNotification", absl::StatusCode::kInvalidArgument, "notification",
                   [](MessageHeader& h, std::vector<WireOp>&, std::string&) {
                     h.notification_bytes = kMaxNotificationBytes + 1;
                   }}),
    [](const auto& info) { return info.param.name; });

TEST(NcclProtocolTest, InitiatorRejectsABadAck) {
  for (int bad = 0; bad < 3; ++bad) {
    auto link = std::make_shared<FakeLink>();
    GuardedRegion src(1024, 1);
    InitiatorSession initiator(std::make_unique<FakeChannel>(link, true), TestSecret(1), Options(),
                               kT0);
    auto id = initiator.Post(
        PlanSegments({{0, 0, 1024}}, src.address(), kRegionId, "", 1 << 20, kMaxOpsPerMessage),
        kT0);
    ASSERT_TRUE(id.ok());
    initiator.Progress(kT0);
    Ack ack{.sequence = 1, .secret = TestSecret(1)};
    if (bad == 0) ack.sequence = 2;
    if (bad == 1) ack.secret[0] ^= 1;
    std::string raw = EncodeAck(ack);
    if (bad == 2) raw[1] ^= 1;
    link->to_initiator.push_back(raw);
    initiator.Progress(kT0);
    EXPECT_EQ(*initiator.State(*id), TransferState::kFailed) << bad;
    EXPECT_EQ(initiator.TransferError(*id).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(initiator.TransferError(*id).message()), HasSubstr("bad ack"));
    EXPECT_EQ(link->aborts, 1);
  }
}

TEST(NcclProtocolTest, PeerThatNeverJoinsFailsBothSidesAtTheInitDeadline) {
  Pair p(4096);
  p.link->ready = false;
  auto id = p.Post({{0, 0, 4096}}, "x");
  ASSERT_TRUE(id.ok());
  p.Run(kT0 + absl::Milliseconds(1999));
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kInProgress);
  EXPECT_FALSE(p.initiator->failed());
  EXPECT_FALSE(p.target->failed());
  p.Run(kT0 + absl::Seconds(2));
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kFailed);
  EXPECT_EQ(p.initiator->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(p.initiator->status().message()), HasSubstr("connect_timeout"));
  EXPECT_EQ(p.target->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.link->aborts, 2);  // each side aborted its communicator
  // A failed session refuses new work with the reason.
  auto again = p.Post({{0, 0, 16}}, "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("connect_timeout"));
  EXPECT_TRUE(p.initiator->Release(*id).ok());
}

TEST(NcclProtocolTest, TransferQueuedBeforeReadyFailsAloneAtItsDeadline) {
  SessionOptions o = Options();
  o.transfer_timeout = absl::Seconds(1);
  Pair p(4096, o);
  p.link->ready = false;
  auto id = p.Post({{0, 0, 4096}}, "");
  ASSERT_TRUE(id.ok());
  p.initiator->Progress(kT0 + absl::Seconds(1));
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kFailed);
  EXPECT_THAT(std::string(p.initiator->TransferError(*id).message()),
              HasSubstr("waiting for the communicator"));
  EXPECT_EQ(p.link->aborts, 0);
  // One queued later still goes out once the communicator is ready.
  auto later = p.Post({{0, 0, 4096}}, "later", kT0 + absl::Seconds(1));
  ASSERT_TRUE(later.ok());
  p.link->ready = true;
  p.Run(kT0 + absl::Milliseconds(1500));
  EXPECT_EQ(*p.initiator->State(*later), TransferState::kDone);
  EXPECT_THAT(p.target->TakeNotifications(), ::testing::ElementsAre("later"));
  EXPECT_EQ(p.target->messages_received(), 1u) << "the expired transfer must never be sent";
}

TEST(NcclProtocolTest, SilentTargetFailsTheTransferAtItsDeadline) {
  Pair p(4096);
  auto id = p.Post({{0, 0, 4096}}, "");
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 3; ++i) p.initiator->Progress(kT0 + absl::Seconds(2));  // target silent
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kInProgress);
  p.initiator->Progress(kT0 + absl::Seconds(3));
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kFailed);
  EXPECT_EQ(p.initiator->TransferError(*id).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(p.initiator->TransferError(*id).message()),
              HasSubstr("transfer_timeout"));
  EXPECT_EQ(p.link->aborts, 1);
}

TEST(NcclProtocolTest, InitiatorDyingAfterTheHeaderFailsTheTargetAtItsDeadline) {
  Pair p(4096);
  const std::vector<unsigned char> before = p.dst.Contents();
  MessageHeader h{.sequence = 1,
                  .secret = TestSecret(1),
                  .region = kRegionId,
                  .op_count = 1,
                  .data_bytes = 4096,
                  .notification_bytes = 0};
  p.link->to_target.push_back(EncodeHeader(h));  // then nothing: the initiator died
  p.target->Progress(kT0);
  EXPECT_TRUE(p.target->UsesRegion(kRegionId));  // DeregisterMemory must wait
  p.target->Progress(kT0 + absl::Milliseconds(2999));
  EXPECT_FALSE(p.target->failed());
  p.target->Progress(kT0 + absl::Seconds(3));
  ASSERT_TRUE(p.target->failed());
  EXPECT_EQ(p.target->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.link->aborts, 1);
  EXPECT_FALSE(p.target->UsesRegion(kRegionId));
  EXPECT_TRUE(p.dst.Contents() == before);
}

TEST(NcclProtocolTest, PeerDyingMidTransferFailsEverythingOnBothSides) {
  Pair p(1 << 16);
  auto a = p.Post(ScatteredOps(1 << 16, 4096, 10, 1), "a");
  auto b = p.Post(ScatteredOps(1 << 16, 4096, 10, 2), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  p.initiator->Progress(kT0);
  p.target->Progress(kT0);  // the first message arrives, the target scatters it
  p.link->dead = true;
  p.Run(kT0 + absl::Milliseconds(10));
  EXPECT_EQ(*p.initiator->State(*a), TransferState::kFailed);
  EXPECT_EQ(*p.initiator->State(*b), TransferState::kFailed);
  EXPECT_EQ(p.initiator->TransferError(*a).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(p.initiator->TransferError(*a).message()), HasSubstr("peer died"));
  EXPECT_TRUE(p.target->failed());
  EXPECT_TRUE(p.dst.GuardsIntact());
  EXPECT_TRUE(p.initiator->Release(*a).ok());
  EXPECT_TRUE(p.initiator->Release(*b).ok());
  EXPECT_EQ(p.initiator->transfers(), 0u);
}

TEST(NcclProtocolTest, ReleaseOfAnInFlightTransferAbortsTheChannel) {
  Pair p(1 << 16);
  auto a = p.Post(ScatteredOps(1 << 16, 4096, 4, 1), "a");
  auto b = p.Post(ScatteredOps(1 << 16, 4096, 4, 2), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  p.initiator->Progress(kT0);  // both in the channel, not acknowledged
  EXPECT_TRUE(p.initiator->Release(*a).ok());
  EXPECT_EQ(p.link->aborts, 1);
  EXPECT_EQ(*p.initiator->State(*b), TransferState::kFailed);
  EXPECT_EQ(p.initiator->TransferError(*b).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(p.initiator->State(*a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.initiator->Release(*a).code(), absl::StatusCode::kNotFound);
}

TEST(NcclProtocolTest, ReleaseOfAQueuedTransferSendsNothing) {
  Pair p(4096);
  p.link->ready = false;
  auto a = p.Post({{0, 0, 1024}}, "a");
  auto b = p.Post({{0, 1024, 1024}}, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  p.Run();
  EXPECT_TRUE(p.initiator->Release(*a).ok());
  EXPECT_EQ(p.link->aborts, 0);
  p.link->ready = true;
  p.Run();
  EXPECT_EQ(*p.initiator->State(*b), TransferState::kDone);
  EXPECT_THAT(p.target->TakeNotifications(), ::testing::ElementsAre("b"));
  EXPECT_EQ(p.target->messages_received(), 1u);
}

TEST(NcclProtocolTest, LargeTransferGoesAsCapSizedMessages) {
  Pair p(1 << 20);
  std::vector<CopyOp> ops = {{.local_offset = 0, .remote_offset = 0, .length = 1 << 20}};
  auto id = p.Post(ops, "big");
  ASSERT_TRUE(id.ok());
  p.Run(kT0, 100);
  EXPECT_EQ(*p.initiator->State(*id), TransferState::kDone);
  EXPECT_TRUE(p.dst.Contents() == p.src.Contents());
  EXPECT_EQ(p.target->messages_received(), 16u);  // 1 MiB in 64 KiB messages
}

// ---------------------------------------------------------------------------------------------
// Blobs.

AgentAddress SomeAddress() {
  AgentAddress a;
  a.boot_id = "0d3c5a52-7b1e-4f57-9a43-3a3d5a0e2f11";
  a.host = "gpu-node-3";
  for (size_t i = 0; i < kUuidBytes; ++i) a.gpu[i] = static_cast<uint8_t>(i * 17);
  a.token = TestSecret(9);
  a.staging_bytes = 1 << 28;
  return a;
}

TEST(NcclWireTest, BlobsRoundTrip) {
  const AgentAddress a = SomeAddress();
  auto back = DecodeAgentAddress(EncodeAgentAddress(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->boot_id, a.boot_id);
  EXPECT_EQ(back->host, a.host);
  EXPECT_EQ(back->gpu, a.gpu);
  EXPECT_EQ(back->token, a.token);
  EXPECT_EQ(back->staging_bytes, a.staging_bytes);

  ConnectReply r;
  for (size_t i = 0; i < kUniqueIdBytes; ++i) r.unique_id[i] = static_cast<uint8_t>(255 - i);
  r.secret = TestSecret(2);
  r.target_token = TestSecret(3);
  auto r2 = DecodeConnectReply(EncodeConnectReply(r));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->unique_id, r.unique_id);
  EXPECT_TRUE(SameSecret(r2->secret, r.secret));
  EXPECT_EQ(r2->target_token, r.target_token);

  RegionBlob g{.token = TestSecret(4), .region = 12, .length = uint64_t{5} << 30};
  auto g2 = DecodeRegionBlob(EncodeRegionBlob(g));
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->region, 12u);
  EXPECT_EQ(g2->length, g.length);

  MessageHeader h{.sequence = 99,
                  .secret = TestSecret(5),
                  .region = 3,
                  .op_count = 4,
                  .data_bytes = 1 << 20,
                  .notification_bytes = 17};
  const std::string raw = EncodeHeader(h);
  EXPECT_EQ(raw.size(), kHeaderBytes);
  auto h2 = DecodeHeader(raw);
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(h2->sequence, 99u);
  EXPECT_EQ(h2->data_bytes, 1u << 20);
  EXPECT_EQ(h2->notification_bytes, 17u);
  EXPECT_EQ(DecodeHeader(raw.substr(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclWireTest, MalformedBlobsAreRejected) {
  const std::string good = EncodeAgentAddress(SomeAddress());
  const std::vector<std::string> bad = {
      "",
      "nccl/2" + good.substr(6),
      good + ";extra=1",
      good + ";gpu=00",
      good.substr(0, good.find(";staging")),
      absl::StrCat(good.substr(0, good.find(";staging")), ";staging=0"),
      absl::StrCat(good.substr(0, good.find(";staging")), ";staging=-5"),
      absl::StrCat(good.substr(0, good.find(";staging")), ";staging=99999999999999999999999"),
      std::string(2000, 'a'),
  };
  for (const std::string& b : bad) {
    EXPECT_EQ(DecodeAgentAddress(b).status().code(), absl::StatusCode::kInvalidArgument) << b;
  }
  ConnectReply r;
  std::string reply = EncodeConnectReply(r);
  EXPECT_TRUE(DecodeConnectReply(reply).ok());
  std::string short_id = reply;
  short_id.erase(short_id.find("id=") + 3, 2);
  EXPECT_FALSE(DecodeConnectReply(short_id).ok());
  std::string not_hex = reply;
  not_hex[not_hex.find("secret=") + 7] = 'g';
  EXPECT_FALSE(DecodeConnectReply(not_hex).ok());
  EXPECT_FALSE(DecodeConnectReply(reply + ";secret=00").ok());
  EXPECT_FALSE(DecodeRegionBlob("nccl/1;token=00;region=1;length=5").ok());
  RegionBlob g{.token = TestSecret(1), .region = 1, .length = 5};
  std::string region = EncodeRegionBlob(g);
  EXPECT_FALSE(DecodeRegionBlob(region.substr(0, region.size() - 1) + "x").ok());
  EXPECT_FALSE(DecodeRegionBlob(region.substr(0, region.rfind('=') + 1) + "0").ok());
}

TEST(NcclWireTest, ControlDecodingChecksItsSize) {
  std::vector<WireOp> ops = {{1, 2}, {3, 4}};
  const std::string raw = EncodeControl(ops, "hi");
  std::vector<WireOp> out;
  std::string note;
  ASSERT_TRUE(DecodeControl(raw, 2, 2, &out, &note).ok());
  EXPECT_EQ(out[1].remote_offset, 3u);
  EXPECT_EQ(note, "hi");
  EXPECT_FALSE(DecodeControl(raw, 3, 2, &out, &note).ok());
  EXPECT_FALSE(DecodeControl(raw, 2, 1, &out, &note).ok());
  EXPECT_FALSE(DecodeControl(raw, kMaxOpsPerMessage + 1, 0, &out, &note).ok());
}

TEST(NcclWireTest, SecretsAreRandomAndComparedWhole) {
  auto a = RandomSecret(), b = RandomSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(SameSecret(*a, *b));
  Secret c = *a;
  EXPECT_TRUE(SameSecret(*a, c));
  c[15] ^= 1;
  EXPECT_FALSE(SameSecret(*a, c));
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl
