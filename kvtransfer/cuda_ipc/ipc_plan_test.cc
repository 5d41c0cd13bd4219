// cuda_ipc's host side without a GPU: piece planning and its bounds checks, and the blobs'
// parsing (every malformed blob is an error, never a crash or a silently accepted field).
#include "kvtransfer/cuda_ipc/ipc_plan.h"

#include <string>

#include "gtest/gtest.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

TEST(PlanPiecesTest, SplitsOpsIntoBoundedPiecesInOrder) {
  const std::vector<CopyOp> ops = {
      {.local_offset = 0, .remote_offset = 1000, .length = 3 * kMaxPieceBytes + 5},
      {.local_offset = 500000, .remote_offset = 0, .length = 16},
      {.local_offset = 7, .remote_offset = 900, .length = 0}};
  auto pieces = PlanPieces(ops, 1 << 20, 1 << 20, 1 << 24, 1 << 20);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 5u);
  uint64_t total = 0;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*pieces)[i].src, (1u << 20) + i * kMaxPieceBytes);
    EXPECT_EQ((*pieces)[i].dst, (1u << 24) + 1000 + i * kMaxPieceBytes);
    total += (*pieces)[i].bytes;
  }
  EXPECT_EQ(total, ops[0].length);
  EXPECT_EQ((*pieces)[3].bytes, 5u);
  EXPECT_EQ((*pieces)[4].src, (1u << 20) + 500000);
  EXPECT_EQ((*pieces)[4].dst, 1u << 24);
  EXPECT_EQ((*pieces)[4].bytes, 16u);
}

TEST(PlanPiecesTest, RejectsOpsOutsideEitherRegionWithoutOverflow) {
  const uint64_t kHuge = ~uint64_t{0};
  const std::vector<std::vector<CopyOp>> bad = {
      {{.local_offset = 0, .remote_offset = 0, .length = 4097}},
      {{.local_offset = 4000, .remote_offset = 0, .length = 97}},
      {{.local_offset = 0, .remote_offset = 8000, .length = 193}},
      {{.local_offset = kHuge, .remote_offset = 0, .length = 2}},
      {{.local_offset = 0, .remote_offset = kHuge - 1, .length = 4}},
      {{.local_offset = 0, .remote_offset = 0, .length = kHuge}},
  };
  for (const auto& ops : bad) {
    auto pieces = PlanPieces(ops, 0x1000, 4096, 0x100000, 8192);
    EXPECT_EQ(pieces.status().code(), absl::StatusCode::kInvalidArgument)
        << ops[0].local_offset << " " << ops[0].remote_offset << " " << ops[0].length;
  }
  // The very edges are fine.
  EXPECT_TRUE(
      PlanPieces(std::vector<CopyOp>{{.local_offset = 0, .remote_offset = 0, .length = 4096},
                                     {.local_offset = 0, .remote_offset = 4096, .length = 4096}},
                 0x1000, 4096, 0x100000, 8192)
          .ok());
}

AgentAddress SomeAddress() {
  AgentAddress a;
  a.boot_id = "0d3c5a52-7b1e-4f57-9a43-3a3d5a0e2f11";
  a.pid = 4242;
  a.process = 0x0123456789abcdefULL;
  for (size_t i = 0; i < kUuidBytes; ++i) a.gpu[i] = static_cast<uint8_t>(i * 17);
  return a;
}

TEST(IpcWireTest, AgentAddressRoundTrips) {
  const AgentAddress a = SomeAddress();
  auto back = DecodeAgentAddress(EncodeAgentAddress(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->boot_id, a.boot_id);
  EXPECT_EQ(back->pid, a.pid);
  EXPECT_EQ(back->process, a.process);
  EXPECT_EQ(back->gpu, a.gpu);
  // One nonce per process, never 0.
  EXPECT_NE(ProcessNonce(), 0u);
  EXPECT_EQ(ProcessNonce(), ProcessNonce());
}

TEST(IpcWireTest, RegionRoundTrips) {
  RegionBlob r;
  for (size_t i = 0; i < kIpcHandleBytes; ++i) r.handle[i] = static_cast<uint8_t>(255 - i);
  r.offset = 1 << 20;
  r.length = uint64_t{5} << 30;
  r.gpu = SomeAddress().gpu;
  auto back = DecodeRegionBlob(EncodeRegionBlob(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->handle, r.handle);
  EXPECT_EQ(back->offset, r.offset);
  EXPECT_EQ(back->length, r.length);
  EXPECT_EQ(back->gpu, r.gpu);
}

TEST(IpcWireTest, MalformedBlobsAreInvalidArgument) {
  const std::string good = EncodeAgentAddress(SomeAddress());
  const std::string gpu_hex = good.substr(good.find("gpu=") + 4);
  const std::string handle_hex(2 * kIpcHandleBytes, 'a');
  for (const std::string& blob : std::vector<std::string>{
           "", "cuda_ipc/2;boot=x;pid=1;gpu=" + gpu_hex, "loopback:x:1:2:3",
           "cuda_ipc/1;boot=x;pid=1", "cuda_ipc/1;boot=x;pid=1;gpu=" + gpu_hex + ";extra=1",
           "cuda_ipc/1;boot=x;pid=1;pid=2;gpu=" + gpu_hex, "cuda_ipc/1;boot=x;pid=0;gpu=" + gpu_hex,
           "cuda_ipc/1;boot=x;pid=-1;gpu=" + gpu_hex, "cuda_ipc/1;boot=;pid=1;gpu=" + gpu_hex,
           "cuda_ipc/1;boot=x;pid=1;gpu=zz" + gpu_hex.substr(2),
           "cuda_ipc/1;boot=x;pid=1;gpu=" + gpu_hex + "00", std::string(5000, 'c'),
           "cuda_ipc/1;boot=x;pid=1;gpu=" + gpu_hex,  // no process nonce (an older peer)
           "cuda_ipc/1;boot=x;pid=1;proc=0000000000000000;gpu=" + gpu_hex,
           "cuda_ipc/1;boot=x;pid=1;proc=12;gpu=" + gpu_hex,
           "cuda_ipc/1;boot=x;pid=1;proc=zz23456789abcdef;gpu=" + gpu_hex}) {
    EXPECT_EQ(DecodeAgentAddress(blob).status().code(), absl::StatusCode::kInvalidArgument) << blob;
  }
  const std::string region =
      "cuda_ipc/1;handle=" + handle_hex + ";offset=0;length=16;gpu=" + gpu_hex;
  EXPECT_TRUE(DecodeRegionBlob(region).ok());
  for (const std::string& blob : std::vector<std::string>{
           "cuda_ipc/1;handle=" + handle_hex + ";offset=0;length=0;gpu=" + gpu_hex,
           "cuda_ipc/1;handle=" + handle_hex +
               ";offset=18446744073709551615;length=2;gpu=" + gpu_hex,
           "cuda_ipc/1;handle=" + handle_hex + ";offset=-1;length=2;gpu=" + gpu_hex,
           "cuda_ipc/1;handle=" + handle_hex.substr(2) + ";offset=0;length=16;gpu=" + gpu_hex,
           "cuda_ipc/1;handle=" + handle_hex + ";offset=0;length=16",
           "cuda_ipc/1;handle=" + handle_hex + ";offset=0;length=16;gpu=" + gpu_hex + ";x=y"}) {
    EXPECT_EQ(DecodeRegionBlob(blob).status().code(), absl::StatusCode::kInvalidArgument) << blob;
  }
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
