// The MLP shard's doorbell page: calls and answers between two mappings of one page (the client
// and shard sides, on two threads), deadlines on both sides, and the checks on names and pages a
// peer hands over.
#include "runtime/mlp/ipc_doorbell.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::mlp {
namespace {

TEST(IpcDoorbellTest, CallsAndAnswersCrossTheSharedPage) {
  auto shard = IpcDoorbell::Create();
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_TRUE(IpcDoorbell::ValidName(shard->name()));
  auto client = IpcDoorbell::Open(shard->name());
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kCalls = 2000;
  std::atomic<int> bad{0};
  std::thread server([&] {
    for (int i = 0; i < kCalls; ++i) {
      auto r = shard->WaitRequest(absl::Now() + absl::Seconds(10));
      if (!r.ok() || r->layer != i % 32 || r->row_offset != i % 5 || r->rows != i + 1) {
        ++bad;
        return;
      }
      shard->Finish(r->seq, r->layer == 7 ? 3 : 0);
    }
  });
  for (int i = 0; i < kCalls; ++i) {
    const uint32_t seq = client->Ring(i % 32, i % 5, i + 1);
    auto code = client->WaitDone(seq, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << code.status() << " at call " << i;
    EXPECT_EQ(*code, i % 32 == 7 ? 3 : 0);
  }
  server.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(IpcDoorbellTest, EveryWaitEndsByItsDeadline) {
  auto shard = IpcDoorbell::Create();
  ASSERT_TRUE(shard.ok());
  auto client = IpcDoorbell::Open(shard->name());
  ASSERT_TRUE(client.ok());
  // No call: the shard's wait ends.
  absl::Time start = absl::Now();
  EXPECT_EQ(shard->WaitRequest(start + absl::Milliseconds(150)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // A call nobody answers (a frozen or dead shard): the client's wait ends.
  const uint32_t seq = client->Ring(0, 0, 1);
  start = absl::Now();
  EXPECT_EQ(client->WaitDone(seq, start + absl::Milliseconds(150)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // An answer to an older call is not this call's.
  auto r = shard->WaitRequest(absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(r.ok());
  const uint32_t next = client->Ring(1, 0, 2);
  shard->Finish(r->seq, 0);
  EXPECT_EQ(client->WaitDone(next, absl::Now() + absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(IpcDoorbellTest, NamesAndPagesFromAPeerAreChecked) {
  for (const std::string bad :
       {"", "/tandem-mlp-", "/etc/passwd", "/tandem-mlp-0123456789abcdef0123456789abcdeX",
        "/tandem-mlp-0123456789ABCDEF0123456789abcdef", "/tandem-mlp-../../0123456789abcdef01234",
        "tandem-mlp-0123456789abcdef0123456789abcdef0"}) {
    EXPECT_FALSE(IpcDoorbell::ValidName(bad)) << bad;
    EXPECT_EQ(IpcDoorbell::Open(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // A well-formed name nobody created.
  EXPECT_EQ(IpcDoorbell::Open("/tandem-mlp-00000000000000000000000000000000").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A page of another size under a valid name.
  const std::string name =
      "/tandem-mlp-ffffffffffffffffffffffff" + std::to_string(getpid() % 10) + "0000000";
  ASSERT_TRUE(IpcDoorbell::ValidName(name)) << name;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  EXPECT_EQ(IpcDoorbell::Open(name).status().code(), absl::StatusCode::kInvalidArgument);
  shm_unlink(name.c_str());
}

TEST(IpcDoorbellTest, TheCreatorUnlinksItsPage) {
  std::string name;
  {
    auto shard = IpcDoorbell::Create();
    ASSERT_TRUE(shard.ok());
    name = shard->name();
    IpcDoorbell moved = *std::move(shard);
    EXPECT_TRUE(IpcDoorbell::Open(name).ok());
  }
  EXPECT_EQ(IpcDoorbell::Open(name).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::mlp
