// KvReceiver over a loopback lane: the endpoint it exports, epochs, verification of landed KV
// against a checksum, and the quarantine (counted, ended by a confirmation or by the lease, and
// by the expectation's destructor).
#include "kvtransfer/handoff/kv_receiver.h"

#include <atomic>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_checksum.h"
#include "kvtransfer/testing/test_layout.h"

namespace tandem::kvtransfer {
namespace {

KvLayout Layout() { return testing::DenseBf16Layout(2, 8, 16, 2, 8); }

class KvReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = Layout();
    memory_.resize(testing::LayoutBytes(layout_));
    std::mt19937 rng(5);
    for (auto& b : memory_) b = static_cast<uint8_t>(rng());
    static std::atomic<int> counter{0};
    BackendOptions options;
    options.agent_name = absl::StrCat("receiver-test-", counter.fetch_add(1));
    auto backend = CreateTransferBackend("loopback", options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto region = (*backend)->RegisterMemory(memory_.data(), memory_.size(), MemoryKind::kHost);
    ASSERT_TRUE(region.ok());
    std::vector<ReceiverLane> lanes;
    lanes.push_back({.thread = std::make_unique<TransferThread>(*std::move(backend)),
                     .region_id = region->id,
                     .layout = layout_,
                     .staged = false,
                     .host_memory = memory_.data(),
                     .host_bytes = memory_.size()});
    auto receiver =
        KvReceiver::Create(std::move(lanes), {.fence_lease = absl::Milliseconds(200),
                                              .setup_timeout = absl::Seconds(5),
                                              .on_quarantine = [this](int n) { gauge_ += n; }});
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);
    agent_ = options.agent_name;
  }

  std::vector<int32_t> Blocks() {
    std::vector<int32_t> ids = {5, 2, 7};
    return ids;
  }

  KvLayout layout_;
  std::vector<uint8_t> memory_;
  std::unique_ptr<KvReceiver> receiver_;
  std::string agent_;
  int gauge_ = 0;
};

TEST_F(KvReceiverTest, ExportsItsLaneAndFindsItByBackend) {
  ASSERT_EQ(receiver_->endpoints().size(), 1u);
  const ReceiverEndpoint& e = receiver_->endpoints()[0];
  EXPECT_EQ(e.backend, "loopback");
  EXPECT_EQ(e.agent_name, agent_);
  EXPECT_FALSE(e.region.empty());
  EXPECT_TRUE(e.host_memory);
  EXPECT_EQ(receiver_->FindEndpoint("loopback"), 0u);
  EXPECT_FALSE(receiver_->FindEndpoint("ucx").has_value());
  EXPECT_TRUE(receiver_->Accept(0, "anyone", "", absl::Seconds(1)).ok()) << "one-sided: no reply";
  EXPECT_FALSE(receiver_->Accept(0, "anyone", "junk", absl::Seconds(1)).ok());
  EXPECT_FALSE(receiver_->Accept(3, "anyone", "", absl::Seconds(1)).ok());
}

TEST_F(KvReceiverTest, EpochsAreUniqueAndNeverZero) {
  auto a = receiver_->Expect(0, Blocks(), 0, 40);
  auto b = receiver_->Expect(0, Blocks(), 0, 40);
  EXPECT_NE(a->epoch(), 0u);
  EXPECT_NE(a->epoch(), b->epoch());
}

TEST_F(KvReceiverTest, LandedKvIsVerifiedAgainstTheChecksum) {
  auto expected = receiver_->Expect(0, Blocks(), 3, 40);
  ASSERT_TRUE(expected->verifiable());
  auto sum = KvChecksum(layout_, memory_.data(), memory_.size(), Blocks(), 3, 40, 0, 2, 0, 2);
  ASSERT_TRUE(sum.ok());
  EXPECT_TRUE(expected->Landed(*sum).ok());
  EXPECT_TRUE(expected->Landed(std::nullopt).ok()) << "nothing to check";
  // One byte of token 20 (block 7... position 20 is in the second block, id 2) changes.
  memory_[layout_.kv_stride + 2 * layout_.block_stride + 4 * 2 * 8 * 2 + 1] ^= 0x40;
  const absl::Status bad = expected->Landed(*sum);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
}

TEST_F(KvReceiverTest, QuarantineIsCountedAndEndsByConfirmationOrLease) {
  auto confirmed = receiver_->Expect(0, Blocks(), 0, 40);
  const absl::Time now = absl::Now();
  confirmed->Quarantine(now);
  confirmed->Quarantine(now);  // once
  EXPECT_TRUE(confirmed->quarantined());
  EXPECT_EQ(receiver_->quarantined_blocks(), 3);
  EXPECT_EQ(gauge_, 3);
  EXPECT_FALSE(confirmed->Release(/*confirmed=*/false, now)) << "before the lease, unconfirmed";
  EXPECT_TRUE(confirmed->Release(/*confirmed=*/true, now));
  EXPECT_EQ(receiver_->quarantined_blocks(), 0);

  auto leased = receiver_->Expect(0, Blocks(), 0, 40);
  leased->Quarantine(now);
  EXPECT_EQ(leased->lease_end(), now + absl::Milliseconds(200));
  EXPECT_FALSE(leased->Release(false, now + absl::Milliseconds(199)));
  EXPECT_TRUE(leased->Release(false, now + absl::Milliseconds(200)));
  EXPECT_EQ(gauge_, 0);

  {
    auto dropped = receiver_->Expect(0, Blocks(), 0, 40);
    dropped->Quarantine(now);
    EXPECT_EQ(gauge_, 3);
  }
  EXPECT_EQ(gauge_, 0) << "a destroyed expectation still held its quarantine";
  auto never = receiver_->Expect(0, Blocks(), 0, 40);
  EXPECT_TRUE(never->Release(false, now)) << "nothing quarantined: free to use";
}

}  // namespace
}  // namespace tandem::kvtransfer
