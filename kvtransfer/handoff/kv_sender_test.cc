// KvSender over the loopback backend (wrapped in the fault injector): a whole send, a streamed
// send gated by layer progress, and every way a send ends early (deadline, abandon, fence,
// producer failure, post and mid-transfer faults, a stopped sender). Each case checks the bytes
// that landed, that the source blocks came back exactly once, and the report.
#include "kvtransfer/handoff/kv_sender.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_injecting_backend.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/testing/test_layout.h"

namespace tandem::kvtransfer {
namespace {

constexpr int kLayers = 4;
constexpr int kBlocks = 16;
constexpr int kBlockSize = 16;

KvLayout Layout() { return testing::DenseBf16Layout(kLayers, kBlocks, kBlockSize, 2, 8); }

uint64_t Bytes(const KvLayout& l) { return testing::LayoutBytes(l); }

std::string UniqueName(std::string_view role) {
  static std::atomic<int> counter{0};
  return absl::StrCat("sender-test-", std::string(role), "-", counter.fetch_add(1));
}

// What a send's callbacks saw.
struct Outcome {
  absl::Mutex mu;
  int releases ABSL_GUARDED_BY(mu) = 0;
  int reports ABSL_GUARDED_BY(mu) = 0;
  KvSendReport report ABSL_GUARDED_BY(mu);

  std::function<void()> Release() {
    return [this] {
      absl::MutexLock lock(&mu);
      ++releases;
    };
  }
  KvSender::DoneCallback Done() {
    return [this](const KvSendReport& r) {
      absl::MutexLock lock(&mu);
      ++reports;
      report = r;
    };
  }
  // Waits until the report came and, with `released`, the source went back.
  bool Wait(bool released, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    auto ready = [this, released]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return reports > 0 && (!released || releases > 0);
    };
    return mu.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  int release_count() {
    absl::MutexLock lock(&mu);
    return releases;
  }
  int report_count() {
    absl::MutexLock lock(&mu);
    return reports;
  }
  KvSendReport last() {
    absl::MutexLock lock(&mu);
    return report;
  }
};

class KvSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = Layout();
    src_.resize(Bytes(layout_));
    dst_.assign(Bytes(layout_), 0);
    std::mt19937 rng(7);
    for (auto& b : src_) b = static_cast<uint8_t>(rng());

    BackendOptions target_options;
    target_options.agent_name = UniqueName("decode");
    auto target = CreateTransferBackend("loopback", target_options);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    auto region = target_->RegisterMemory(dst_.data(), dst_.size(), MemoryKind::kHost);
    ASSERT_TRUE(region.ok()) << region.status();
    auto blob = target_->ExportRegion(region->id);
    ASSERT_TRUE(blob.ok());
    auto address = target_->LocalAddress();
    ASSERT_TRUE(address.ok());

    BackendOptions options;
    options.agent_name = UniqueName("prefill");
    auto inner = CreateTransferBackend("loopback", options);
    ASSERT_TRUE(inner.ok()) << inner.status();
    auto faulty = std::make_unique<FaultInjectingBackend>(*std::move(inner));
    faulty_ = faulty.get();
    auto own = faulty_->RegisterMemory(src_.data(), src_.size(), MemoryKind::kHost);
    ASSERT_TRUE(own.ok());
    auto thread = std::make_unique<TransferThread>(std::move(faulty), absl::Microseconds(50));
    sender_ = std::make_unique<KvSender>(std::move(thread),
                                         KvSource{.layout = layout_,
                                                  .region_id = own->id,
                                                  .kind = MemoryKind::kHost,
                                                  .memory = src_.data(),
                                                  .bytes = src_.size()},
                                         CreateHostStaging(),
                                         KvSenderOptions{.transfer_timeout = absl::Seconds(5)});

    destination_.agent_name = target_options.agent_name;
    destination_.agent_address = *address;
    destination_.region = *blob;
    destination_.layout = layout_;
    destination_.block_ids.resize(kBlocks);
    std::iota(destination_.block_ids.begin(), destination_.block_ids.end(), 0);
    std::shuffle(destination_.block_ids.begin(), destination_.block_ids.end(), std::mt19937(3));
    source_blocks_.resize(kBlocks);
    std::iota(source_blocks_.begin(), source_blocks_.end(), 0);
  }

  // True when the destination holds the source's KV of positions [0, tokens) in every layer
  // below `layers`, and zeros elsewhere.
  bool Landed(int tokens, int layers = kLayers) {
    std::vector<uint8_t> expected(dst_.size(), 0);
    if (layers == 0) return expected == dst_;
    auto ops = PlanLayerBlockCopies(layout_, layout_, source_blocks_, destination_.block_ids,
                                    tokens, 0, 0, layers);
    EXPECT_TRUE(ops.ok()) << ops.status();
    for (const CopyOp& op : *ops) {
      std::memcpy(expected.data() + op.remote_offset, src_.data() + op.local_offset, op.length);
    }
    return expected == dst_;
  }

  void Stuck() {
    faulty_->SetPlan(
        {.stage = FaultStage::kMidTransfer, .once = true, .polls_before_failure = 1 << 30});
  }

  KvLayout layout_;
  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<TransferBackend> target_;
  FaultInjectingBackend* faulty_ = nullptr;  // owned by the sender's thread
  std::unique_ptr<KvSender> sender_;
  KvDestination destination_;
  std::vector<int32_t> source_blocks_;
};

TEST_F(KvSenderTest, WholeSendLandsAndGivesTheSourceBackOnce) {
  const int tokens = kBlocks * kBlockSize - 5;
  ASSERT_TRUE(sender_->CheckDestination(destination_, tokens).ok());
  Outcome out;
  auto send = sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(10),
                             /*streamed=*/false, out.Done());
  KvSender::Whole(send, source_blocks_, tokens, out.Release());
  ASSERT_TRUE(out.Wait(/*released=*/true));
  const KvSendReport report = out.last();
  ASSERT_TRUE(report.status.ok()) << report.status;
  EXPECT_EQ(report.failed_stage, SendStage::kNone);
  EXPECT_EQ(report.writes, 1);
  EXPECT_EQ(report.bytes, static_cast<int64_t>(2 * kLayers * kBlocks * layout_.block_bytes));
  auto planned =
      PlanBlockCopies(layout_, layout_, source_blocks_, destination_.block_ids, tokens, 0);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(report.ops, static_cast<int64_t>(planned->size()));
  EXPECT_EQ(report.streamed_bytes, 0);
  EXPECT_TRUE(Landed(tokens));
  EXPECT_EQ(out.release_count(), 1);
  EXPECT_EQ(out.report_count(), 1);
}

TEST_F(KvSenderTest, CachedPrefixIsNotSent) {
  destination_.num_cached_tokens = 4 * kBlockSize;
  Outcome out;
  auto send =
      sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(10), false, out.Done());
  KvSender::Whole(send, source_blocks_, kBlocks * kBlockSize, out.Release());
  ASSERT_TRUE(out.Wait(true));
  EXPECT_TRUE(out.last().status.ok());
  EXPECT_EQ(out.last().bytes,
            static_cast<int64_t>(2 * kLayers * (kBlocks - 4) * layout_.block_bytes));
}

TEST_F(KvSenderTest, StreamedLayersGoOnlyOnceTheirProgressPassesThem) {
  const int tokens = kBlocks * kBlockSize;
  volatile uint64_t progress = 100;
  Outcome out;
  auto send = sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(10),
                             /*streamed=*/true, out.Done());
  // One chunk of the whole prompt: layer l is complete once progress >= 100 + l + 1.
  KvSender::Chunk(send, {.block_ids = source_blocks_,
                         .begin = 0,
                         .end = tokens,
                         .progress = &progress,
                         .first_value = 100});
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(Landed(tokens, /*layers=*/0)) << "nothing may be written before its layer is done";
  progress = 102;  // layers 0 and 1
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!Landed(tokens, 2) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(Landed(tokens, 2));
  EXPECT_EQ(out.report_count(), 0) << "a streamed send ends only after Whole";
  progress = 104;
  KvSender::Whole(send, source_blocks_, tokens, out.Release());
  ASSERT_TRUE(out.Wait(true));
  const KvSendReport report = out.last();
  ASSERT_TRUE(report.status.ok()) << report.status;
  EXPECT_TRUE(Landed(tokens));
  EXPECT_EQ(report.writes, kLayers);
  // Layers 2 and 3 may have gone before or after Whole; layers 0 and 1 went before.
  EXPECT_GE(report.streamed_bytes, report.bytes / 2);
  EXPECT_EQ(out.release_count(), 1);
}

TEST_F(KvSenderTest, DeadlineReleasesTheStuckWriteThenTheSource) {
  Stuck();
  Outcome out;
  auto send =
      sender_->Begin("r1", destination_, absl::Now() + absl::Milliseconds(200), false, out.Done());
  KvSender::Whole(send, source_blocks_, 64, out.Release());
  ASSERT_TRUE(out.Wait(true));
  EXPECT_EQ(out.last().failed_stage, SendStage::kDeadline);
  EXPECT_TRUE(absl::IsDeadlineExceeded(out.last().status)) << out.last().status;
  EXPECT_EQ(out.release_count(), 1);
}

TEST_F(KvSenderTest, FenceStopsPostingAndReturnsQuiescentOnceReleased) {
  Stuck();
  Outcome out;
  auto send =
      sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(30), false, out.Done());
  KvSender::Whole(send, source_blocks_, 64, out.Release());
  absl::SleepFor(absl::Milliseconds(30));  // posted and stuck
  EXPECT_EQ(out.report_count(), 0);
  EXPECT_TRUE(KvSender::Fence(send, absl::Now() + absl::Seconds(5)));
  ASSERT_TRUE(out.Wait(true));
  EXPECT_EQ(out.last().failed_stage, SendStage::kCancelled);
  EXPECT_EQ(out.release_count(), 1);
}

// A write the backend cannot recall (it lands after Release): the send reports at its deadline,
// but its source stays held and Fence is not quiescent until the write has landed.
TEST_F(KvSenderTest, LingeringWriteHoldsTheSourceAndTheFenceUntilItLands) {
  faulty_->SetPlan({.stage = FaultStage::kLateWrite,
                    .once = true,
                    .late_write_delay = absl::Milliseconds(600),
                    .late_write_survives_release = true});
  const int tokens = 4 * kBlockSize;
  Outcome out;
  auto send =
      sender_->Begin("r1", destination_, absl::Now() + absl::Milliseconds(100), false, out.Done());
  KvSender::Whole(send, source_blocks_, tokens, out.Release());
  ASSERT_TRUE(out.Wait(/*released=*/false));
  EXPECT_EQ(out.last().failed_stage, SendStage::kDeadline);
  EXPECT_EQ(out.release_count(), 0) << "the source went back while a write still reads it";
  EXPECT_FALSE(KvSender::Fence(send, absl::Now() + absl::Milliseconds(50)));
  EXPECT_TRUE(Landed(tokens, 0)) << "the held write landed early";
  EXPECT_TRUE(KvSender::Fence(send, absl::Now() + absl::Seconds(5)));
  EXPECT_TRUE(Landed(tokens)) << "quiescent before the late write landed";
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (out.release_count() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(out.release_count(), 1);
  EXPECT_EQ(out.report_count(), 1);
}

TEST_F(KvSenderTest, FencedStreamPostsNoLaterLayer) {
  const int tokens = kBlocks * kBlockSize;
  volatile uint64_t progress = 0;
  Outcome out;
  auto send = sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(10), true, out.Done());
  KvSender::Chunk(send, {.block_ids = source_blocks_,
                         .begin = 0,
                         .end = tokens,
                         .progress = &progress,
                         .first_value = 0});
  progress = 1;
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!Landed(tokens, 1) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(Landed(tokens, 1));
  EXPECT_TRUE(KvSender::Fence(send, absl::Now() + absl::Seconds(5)));
  progress = 4;  // every layer computed, but the send is fenced
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(Landed(tokens, 1)) << "a fenced send wrote again";
  // The prompt finishes anyway: its KV goes straight back.
  KvSender::Whole(send, source_blocks_, tokens, out.Release());
  ASSERT_TRUE(out.Wait(true));
  EXPECT_EQ(out.last().failed_stage, SendStage::kCancelled);
  EXPECT_EQ(out.release_count(), 1);
  EXPECT_EQ(out.report_count(), 1);
}

TEST_F(KvSenderTest, ProducerFailureReleasesChunkWritesAndALateWholeGivesBack) {
  const int tokens = kBlocks * kBlockSize;
  volatile uint64_t progress = 10;
  Outcome out;
  auto send = sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(10), true, out.Done());
  KvSender::Chunk(send, {.block_ids = source_blocks_,
                         .begin = 0,
                         .end = tokens,
                         .progress = &progress,
                         .first_value = 0});
  KvSender::Failed(send, absl::AbortedError("prefill aborted"));
  ASSERT_TRUE(out.Wait(/*released=*/false));
  EXPECT_EQ(out.last().failed_stage, SendStage::kProducer);
  EXPECT_TRUE(absl::IsAborted(out.last().status));
  EXPECT_EQ(out.release_count(), 0);
  KvSender::Whole(send, source_blocks_, tokens, out.Release());
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (out.release_count() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(out.release_count(), 1);
  EXPECT_EQ(out.report_count(), 1);
}

TEST_F(KvSenderTest, PostAndMidTransferFaultsFailWithTheirStage) {
  const struct {
    FaultStage fault;
    SendStage stage;
  } cases[] = {{FaultStage::kPost, SendStage::kPost},
               {FaultStage::kMidTransfer, SendStage::kTransfer}};
  for (const auto& c : cases) {
    SCOPED_TRACE(SendStageName(c.stage));
    faulty_->SetPlan({.stage = c.fault, .once = true, .polls_before_failure = 1});
    Outcome out;
    auto send =
        sender_->Begin("r", destination_, absl::Now() + absl::Seconds(10), false, out.Done());
    KvSender::Whole(send, source_blocks_, 64, out.Release());
    ASSERT_TRUE(out.Wait(true));
    EXPECT_EQ(out.last().failed_stage, c.stage);
    EXPECT_FALSE(out.last().status.ok());
    EXPECT_EQ(out.release_count(), 1);
  }
  // The lane is still usable after both.
  Outcome out;
  auto send = sender_->Begin("r", destination_, absl::Now() + absl::Seconds(10), false, out.Done());
  KvSender::Whole(send, source_blocks_, 64, out.Release());
  ASSERT_TRUE(out.Wait(true));
  EXPECT_TRUE(out.last().status.ok()) << out.last().status;
}

TEST_F(KvSenderTest, UnreachableAgentFailsAtConnect) {
  destination_.agent_name = "nobody";
  destination_.agent_address = "nobody";
  Outcome out;
  auto send = sender_->Begin("r", destination_, absl::Now() + absl::Seconds(10), false, out.Done());
  KvSender::Whole(send, source_blocks_, 64, out.Release());
  ASSERT_TRUE(out.Wait(true));
  EXPECT_EQ(out.last().failed_stage, SendStage::kConnect);
  EXPECT_TRUE(absl::IsUnavailable(out.last().status)) << out.last().status;
}

TEST_F(KvSenderTest, StopFailsLiveSendsAndLaterOnesGiveBackAtOnce) {
  Stuck();
  Outcome live;
  auto send =
      sender_->Begin("r1", destination_, absl::Now() + absl::Seconds(30), false, live.Done());
  KvSender::Whole(send, source_blocks_, 64, live.Release());
  absl::SleepFor(absl::Milliseconds(30));
  Outcome later;
  auto late =
      sender_->Begin("r2", destination_, absl::Now() + absl::Seconds(30), false, later.Done());
  sender_.reset();  // stops the thread
  ASSERT_TRUE(live.Wait(true));
  EXPECT_EQ(live.last().failed_stage, SendStage::kShutdown);
  EXPECT_EQ(live.release_count(), 1);
  // The engine may still call back after the sender is gone.
  KvSender::Whole(late, source_blocks_, 64, later.Release());
  EXPECT_EQ(later.release_count(), 1);
  EXPECT_EQ(later.last().failed_stage, SendStage::kShutdown);
  EXPECT_TRUE(KvSender::Fence(late, absl::Now() + absl::Seconds(1)));
}

TEST_F(KvSenderTest, ConversionNeedsHostMemoryAndBlocksMustCoverThePrompt) {
  KvDestination other = destination_;
  other.layout = testing::DenseBf16Layout(kLayers, 2 * kBlocks, 8, 2, 8);
  EXPECT_TRUE(sender_->Admit(other.layout).ok()) << "host memory converts";
  KvDestination short_ids = destination_;
  short_ids.block_ids.resize(2);
  EXPECT_FALSE(sender_->CheckDestination(short_ids, 3 * kBlockSize).ok());
  EXPECT_TRUE(sender_->CheckDestination(short_ids, 2 * kBlockSize).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
