// Unit tests of the service-edge helpers: status and proto conversions, and the transfer thread
// (over a fake backend that records which thread calls it).
#include "gtest/gtest.h"
#include "runtime/server/grpc_status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"
#include "runtime/server/worker_main.h"

namespace tandem::server {
namespace {

TEST(GrpcStatusTest, CodeAndMessageSurviveBothWays) {
  const absl::Status statuses[] = {absl::InvalidArgumentError("temperature: must be >= 0"),
                                   absl::NotFoundError("x"),
                                   absl::ResourceExhaustedError("no blocks"),
                                   absl::UnavailableError("down"),
                                   absl::DeadlineExceededError("late"),
                                   absl::FailedPreconditionError("layout")};
  for (const absl::Status& s : statuses) {
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(s.code()));
    EXPECT_EQ(g.error_message(), s.message());
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("a")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(ProtoConvertTest, LogprobsAndUsage) {
  TokenLogprobs lp;
  lp.token = 42;
  lp.logprob = -0.25f;
  lp.top = {{42, -0.25f}, {7, -2.0f}};
  v1::TokenLogprobs proto;
  TokenLogprobsToProto(lp, &proto);
  ASSERT_EQ(proto.top_size(), 2);
  EXPECT_EQ(proto.top(1).token_id(), 7);
  const TokenLogprobs back = TokenLogprobsFromProto(proto);
  EXPECT_EQ(back.token, 42);
  EXPECT_EQ(back.logprob, -0.25f);
  ASSERT_EQ(back.top.size(), 2u);
  EXPECT_EQ(back.top[1].token, 7);
  EXPECT_EQ(back.top[1].logprob, -2.0f);

  v1::Usage usage;
  UsageToProto(Usage{10, 3, 4}, &usage);
  EXPECT_EQ(usage.prompt_tokens(), 10);
  EXPECT_EQ(usage.completion_tokens(), 3);
  EXPECT_EQ(usage.cached_prompt_tokens(), 4);
}

TEST(KvLayoutConvertTest, RunnerLayoutToProtoAndBack) {
  KvCacheLayout runner;
  runner.num_layers = 2;
  runner.num_blocks = 10;
  runner.block_size = 4;
  runner.num_kv_heads = 3;
  runner.head_dim = 8;
  runner.elem_bytes = 4;
  runner.block_bytes = 4 * 3 * 8 * 4;
  runner.block_stride = runner.block_bytes;
  runner.kv_stride = 10 * runner.block_bytes;
  runner.layer_stride = 2 * runner.kv_stride;
  const kvtransfer::KvLayout layout = ToTransferLayout(runner);
  EXPECT_TRUE(kvtransfer::ValidateKvLayout(layout).ok());
  v1::KvLayout proto;
  KvLayoutToProto(layout, &proto);
  EXPECT_EQ(proto.layer_stride(), runner.layer_stride);
  const kvtransfer::KvLayout back = KvLayoutFromProto(proto);
  for (int l = 0; l < 2; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int b = 0; b < 10; ++b) {
        EXPECT_EQ(kvtransfer::KvBlockOffset(back, l, kv, b), runner.Offset(l, kv, b));
      }
    }
  }
  EXPECT_EQ(back.num_blocks, 10);
  EXPECT_EQ(back.head_dim, 8);
  EXPECT_EQ(back.elem_bytes, 4);
}

TEST(TransferNetDevicesTest, FollowTheBindAddress) {
  EXPECT_EQ(*TransferNetDevices(""), "");
  EXPECT_EQ(*TransferNetDevices("0.0.0.0"), "");
  EXPECT_EQ(*TransferNetDevices("::"), "");
  EXPECT_EQ(*TransferNetDevices("127.0.0.1"), "lo");
  EXPECT_EQ(*TransferNetDevices("localhost"), "lo");
  EXPECT_EQ(*TransferNetDevices("[::1]"), "lo");
  // TEST-NET-3: an address no interface here holds.
  EXPECT_EQ(TransferNetDevices("203.0.113.7").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransferNetDevices("no-such-host.invalid").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerStatsLineTest, RatesOverTheInterval) {
  EngineStats before;
  before.generated_tokens = 100;
  before.steps = 10;
  EngineStats now = before;
  now.generated_tokens = 300;
  now.steps = 30;
  now.running = 4;
  now.waiting = 2;
  now.blocks_used = 25;
  now.blocks_total = 100;
  now.finished_requests = 3;
  EXPECT_EQ(WorkerStatsLine("decode", now, before, absl::Seconds(10)),
            "stats decode: running=4 waiting=2 kv=25/100 (25%) generated_tokens/s=20.0 "
            "prompt_tokens_cached/s=0.0 steps/s=2.0 finished=3");
}

}  // namespace
}  // namespace tandem::server
