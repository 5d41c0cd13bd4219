// The nccl backend on a real GPU (label gpu; skipped without one). One GPU allows everything but a
// transfer (NCCL cannot put both ranks of a communicator on one GPU): creation, the blobs,
// pairing errors, a peer that never joins (the communicator is aborted at the deadline and every
// call returns in time), a write posted to a pair that is not ready (fails at its deadline), and
// clean Release/Disconnect after an abort. With two GPUs, a real transfer between two processes
// is checked byte for byte (the peer is kvtransfer_nccl_peer on GPU 1).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/cuda_ipc/peer_process.h"
#include "kvtransfer/nccl/nccl_wire.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  return n;
}

#define SKIP_WITHOUT_GPU() \
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device"

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr, 0, bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

BackendOptions Options(const std::string& name, absl::Duration connect, absl::Duration transfer) {
  BackendOptions o;
  o.agent_name = name;
  o.connect_timeout = connect;
  o.transfer_timeout = transfer;
  return o;
}

std::unique_ptr<TransferBackend> Make(const BackendOptions& options) {
  auto b = CreateTransferBackend("nccl", options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Another GPU's address for this backend's own token: a peer that will never join.
std::string ForgedPeerAddress(TransferBackend& b) {
  auto a = nccl::DecodeAgentAddress(*b.LocalAddress());
  EXPECT_TRUE(a.ok());
  a->gpu[0] ^= 0xff;
  return nccl::EncodeAgentAddress(*a);
}

std::string ForgedRegion(TransferBackend& b, uint64_t length) {
  auto a = nccl::DecodeAgentAddress(*b.LocalAddress());
  return nccl::EncodeRegionBlob(nccl::RegionBlob{.token = a->token, .region = 1, .length = length});
}

// Polls until the transfer leaves kInProgress (or `guard` passes); returns its state.
TransferState WaitSettled(TransferBackend& b, TransferHandle h, absl::Duration guard) {
  const absl::Time deadline = absl::Now() + guard;
  while (absl::Now() < deadline) {
    auto state = b.Poll(h);
    EXPECT_TRUE(state.ok()) << state.status();
    if (!state.ok()) return TransferState::kFailed;
    if (*state != TransferState::kInProgress) return *state;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return TransferState::kInProgress;
}

TEST(NcclBackendTest, MissingLibraryIsUnavailable) {
  BackendOptions o = Options("a", absl::Seconds(1), absl::Seconds(1));
  o.nccl_library = "/nonexistent/libnccl.so.2";
  auto b = CreateTransferBackend("nccl", o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("nccl: /nonexistent/libnccl.so.2 not found: "));
}

TEST(NcclBackendTest, CreationBlobsAndPairingErrors) {
  SKIP_WITHOUT_GPU();
  BackendOptions o = Options("prefill", absl::Seconds(1), absl::Seconds(1));
  o.nccl_staging_bytes = 8 << 20;
  auto b = Make(o);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name(), "nccl");
  EXPECT_TRUE(b->capabilities().cuda_memory);
  EXPECT_FALSE(b->capabilities().host_memory);
  EXPECT_TRUE(b->capabilities().notifications);
  EXPECT_TRUE(b->capabilities().cross_process);

  auto address = nccl::DecodeAgentAddress(*b->LocalAddress());
  ASSERT_TRUE(address.ok()) << address.status();
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(std::memcmp(address->gpu.data(), prop.uuid.bytes, nccl::kUuidBytes), 0);
  EXPECT_EQ(address->staging_bytes, 8u << 20);
  EXPECT_FALSE(address->boot_id.empty());

  std::vector<unsigned char> host(4096);
  EXPECT_EQ(b->RegisterMemory(host.data(), host.size(), MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(b->RegisterMemory(host.data(), host.size(), MemoryKind::kCuda).ok());
  DeviceBuffer mem(1 << 20);
  auto region = b->RegisterMemory(mem.ptr, 1 << 20, MemoryKind::kCuda);
  ASSERT_TRUE(region.ok()) << region.status();
  auto blob = nccl::DecodeRegionBlob(*b->ExportRegion(region->id));
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->token, address->token);
  EXPECT_EQ(blob->length, 1u << 20);
  EXPECT_EQ(blob->region, region->id);

  EXPECT_EQ(b->ConnectReply("nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Connect("x", "garbage").code(), absl::StatusCode::kInvalidArgument);
  const absl::Status own = b->Connect("x", *b->LocalAddress());
  EXPECT_EQ(own.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(own.message()), HasSubstr("own GPU"));
  EXPECT_EQ(b->Accept("x", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Accept("x", "nccl/1;id=00").code(), absl::StatusCode::kInvalidArgument);
  nccl::ConnectReply stale;  // a reply made for another process (token of zeros)
  const absl::Status wrong = b->Accept("x", nccl::EncodeConnectReply(stale));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("another process"));

  TransferRequest request{.local_region = region->id,
                          .peer = "nobody",
                          .remote_region = "",
                          .ops = {},
                          .notification = ""};
  EXPECT_EQ(b->PostWrite(request).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Poll(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Release(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(b->DeregisterMemory(region->id).ok());
}

TEST(NcclBackendTest, PeerThatNeverJoinsIsAbortedAtTheConnectDeadline) {
  SKIP_WITHOUT_GPU();
  auto b = Make(Options("prefill", absl::Seconds(1), absl::Seconds(10)));
  ASSERT_NE(b, nullptr);
  DeviceBuffer mem(1 << 20);
  auto region = b->RegisterMemory(mem.ptr, 1 << 20, MemoryKind::kCuda);
  ASSERT_TRUE(region.ok());
  const std::string peer_address = ForgedPeerAddress(*b);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(b->Connect("decode", peer_address).ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900)) << "Connect must not wait for the peer";
  EXPECT_TRUE(b->Connect("decode", peer_address).ok());  // idempotent
  auto reply = b->ConnectReply("decode");
  ASSERT_TRUE(reply.ok());
  auto parsed = nccl::DecodeConnectReply(*reply);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->target_token, nccl::DecodeAgentAddress(peer_address)->token);

  TransferRequest request{.local_region = region->id,
                          .peer = "decode",
                          .remote_region = ForgedRegion(*b, 1 << 20),
                          .ops = {{.local_offset = 0, .remote_offset = 0, .length = 4096}},
                          .notification = "n"};
  // Ops outside the claimed remote region are refused before anything is queued.
  TransferRequest outside = request;
  outside.ops[0].remote_offset = (1 << 20) - 16;
  EXPECT_EQ(b->PostWrite(outside).status().code(), absl::StatusCode::kInvalidArgument);
  auto h = b->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(WaitSettled(*b, *h, absl::Seconds(10)), TransferState::kFailed);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(950));
  EXPECT_LE(took, absl::Seconds(2)) << "the abort must come at the deadline";
  // The pair is failed: new writes are refused with the reason; release and disconnect are clean.
  auto again = b->PostWrite(request);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("connect_timeout"));
  EXPECT_EQ(b->Disconnect("decode").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(b->Release(*h).ok());
  const absl::Time disconnect = absl::Now();
  EXPECT_TRUE(b->Disconnect("decode").ok());
  EXPECT_LT(absl::Now() - disconnect, absl::Seconds(1));
  EXPECT_TRUE(b->DeregisterMemory(region->id).ok());
}

TEST(NcclBackendTest, WriteToANotReadyPairFailsAtItsDeadline) {
  SKIP_WITHOUT_GPU();
  auto b = Make(Options("prefill", absl::Seconds(10), absl::Seconds(1)));
  ASSERT_NE(b, nullptr);
  DeviceBuffer mem(1 << 20);
  auto region = b->RegisterMemory(mem.ptr, 1 << 20, MemoryKind::kCuda);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(b->Connect("decode", ForgedPeerAddress(*b)).ok());
  TransferRequest request{.local_region = region->id,
                          .peer = "decode",
                          .remote_region = ForgedRegion(*b, 1 << 20),
                          .ops = {{.local_offset = 0, .remote_offset = 4096, .length = 8192}},
                          .notification = ""};
  const absl::Time start = absl::Now();
  auto h = b->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(WaitSettled(*b, *h, absl::Seconds(10)), TransferState::kFailed);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(950));
  EXPECT_LE(took, absl::Seconds(2));
  EXPECT_TRUE(b->Release(*h).ok());
  EXPECT_EQ(b->Poll(*h).status().code(), absl::StatusCode::kNotFound);
  // Disconnect aborts the communicator that is still setting up, promptly.
  const absl::Time disconnect = absl::Now();
  EXPECT_TRUE(b->Disconnect("decode").ok());
  EXPECT_LT(absl::Now() - disconnect, absl::Seconds(2));
}

// Both ranks in one process on one GPU: NCCL refuses or never finishes; either way both sides
// give up within connect_timeout (+ slack) and every call stays short.
TEST(NcclBackendTest, AcceptedPairThatCannotFormFailsInTime) {
  SKIP_WITHOUT_GPU();
  auto target = Make(Options("decode", absl::Seconds(1), absl::Seconds(1)));
  auto initiator = Make(Options("prefill", absl::Seconds(1), absl::Seconds(1)));
  ASSERT_NE(target, nullptr);
  ASSERT_NE(initiator, nullptr);
  DeviceBuffer src(1 << 16), dst(1 << 16);
  auto local = initiator->RegisterMemory(src.ptr, 1 << 16, MemoryKind::kCuda);
  auto remote = target->RegisterMemory(dst.ptr, 1 << 16, MemoryKind::kCuda);
  ASSERT_TRUE(local.ok() && remote.ok());
  // The initiator believes the target is on another GPU (its check would refuse the real one).
  ASSERT_TRUE(initiator->Connect("decode", ForgedPeerAddress(*target)).ok());
  auto reply = initiator->ConnectReply("decode");
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(target->Accept("prefill", *reply).ok());
  EXPECT_TRUE(target->Accept("prefill", *reply).ok());  // idempotent
  TransferRequest request{.local_region = local->id,
                          .peer = "decode",
                          .remote_region = *target->ExportRegion(remote->id),
                          .ops = {{.local_offset = 0, .remote_offset = 0, .length = 4096}},
                          .notification = "never"};
  auto h = initiator->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time start = absl::Now();
  TransferState state = TransferState::kInProgress;
  while (state == TransferState::kInProgress && absl::Now() - start < absl::Seconds(10)) {
    const absl::Time call = absl::Now();
    EXPECT_TRUE(target->GetNotifications().empty());
    auto s = initiator->Poll(*h);
    ASSERT_TRUE(s.ok());
    state = *s;
    EXPECT_LT(absl::Now() - call, absl::Seconds(2)) << "a call blocked";
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(state, TransferState::kFailed);
  EXPECT_LE(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(initiator->Release(*h).ok());
  EXPECT_TRUE(initiator->Disconnect("decode").ok());
  EXPECT_TRUE(target->Disconnect("prefill").ok());
  EXPECT_TRUE(target->DeregisterMemory(remote->id).ok());
}

#ifdef KVT_NCCL_PEER
std::string PeerBinary() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string beside = dir + "/kvtransfer_nccl_peer";
    if (access(beside.c_str(), X_OK) == 0) return beside;
  }
  return KVT_NCCL_PEER;
}

uint64_t Fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<CopyOp> ScatteredOps(size_t bytes, size_t block, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> src(bytes / block), dst(bytes / block);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<CopyOp> ops;
  for (int i = 0; i < count; ++i) {
    ops.push_back(
        {.local_offset = src[i] * block, .remote_offset = dst[i] * block, .length = block});
  }
  return ops;
}

// Writes from this process (GPU 0) into another one's memory (GPU 1); the peer hashes it.
TEST(NcclBackendTest, TwoProcessTransfersArriveByteForByte) {
  SKIP_WITHOUT_GPU();
  if (GpuCount() < 2) {
    GTEST_SKIP() << "needs two GPUs (NCCL cannot put both ranks of a communicator on one GPU); "
                 << GpuCount() << " visible";
  }
  const size_t bytes = 8 << 20;
  auto peer = cuda_ipc::PeerProcess::Start(PeerBinary(), bytes, 1, absl::Seconds(60));
  ASSERT_TRUE(peer.ok()) << peer.status();
  BackendOptions o = Options("prefill", absl::Seconds(30), absl::Seconds(10));
  o.nccl_staging_bytes = 1 << 20;  // the 3 MiB write goes as several messages
  auto b = Make(o);
  ASSERT_NE(b, nullptr);
  DeviceBuffer src(bytes);
  std::vector<unsigned char> data(bytes);
  std::mt19937 rng(5);
  for (auto& c : data) c = static_cast<unsigned char>(rng());
  ASSERT_EQ(cudaMemcpy(src.ptr, data.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  auto local = b->RegisterMemory(src.ptr, bytes, MemoryKind::kCuda);
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE(b->Connect("decode", (*peer)->address()).ok());
  auto reply = b->ConnectReply("decode");
  ASSERT_TRUE(reply.ok());
  auto accepted = (*peer)->Command(absl::StrCat("accept prefill ", *reply), absl::Seconds(10));
  ASSERT_TRUE(accepted.ok());
  ASSERT_EQ(*accepted, "ok");

  std::vector<unsigned char> expected(bytes, 0);
  std::vector<TransferHandle> handles;
  std::vector<std::string> notes;
  auto post = [&](const std::vector<CopyOp>& ops, const std::string& note) {
    TransferRequest request{.local_region = local->id,
                            .peer = "decode",
                            .remote_region = (*peer)->region(),
                            .ops = ops,
                            .notification = note};
    auto h = b->PostWrite(request);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
    notes.push_back(note);
    for (const CopyOp& op : ops) {
      std::memcpy(expected.data() + op.remote_offset, data.data() + op.local_offset, op.length);
    }
  };
  post(ScatteredOps(bytes, 4096, 300, 1), "scattered");
  post({{.local_offset = 1 << 20, .remote_offset = 4 << 20, .length = 3 << 20}}, "split");
  post({{.local_offset = 3, .remote_offset = 7, .length = 1001}}, "unaligned");
  for (int i = 0; i < 20; ++i)
    post(ScatteredOps(bytes, 16384, 1 + i * 5, 100 + i), "m" + std::to_string(i));
  for (TransferHandle h : handles) {
    EXPECT_EQ(WaitSettled(*b, h, absl::Seconds(60)), TransferState::kDone) << h;
    EXPECT_TRUE(b->Release(h).ok());
  }
  auto hash = (*peer)->Command("hash", absl::Seconds(10));
  ASSERT_TRUE(hash.ok());
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(expected)));
  EXPECT_EQ(*hash, absl::StrCat("hash ", hex));
  // Notifications follow the data; give the peer's loop a moment to deliver the last one.
  std::string got;
  for (int i = 0; i < 100; ++i) {
    auto n = (*peer)->Command("notes", absl::Seconds(10));
    ASSERT_TRUE(n.ok());
    got = *n;
    if (absl::StartsWith(got, absl::StrCat("notes ", notes.size(), " "))) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(got, absl::StrCat("notes ", notes.size(), " ", absl::StrJoin(notes, ",")));

  // The peer exits: the next write fails within transfer_timeout (10 s), and nothing hangs.
  const std::string region_blob = (*peer)->region();
  peer->reset();
  TransferRequest late{.local_region = local->id,
                       .peer = "decode",
                       .remote_region = region_blob,
                       .ops = {{.local_offset = 0, .remote_offset = 0, .length = 4096}},
                       .notification = ""};
  const absl::Time start = absl::Now();
  auto h = b->PostWrite(late);
  if (h.ok()) {  // else the pair already saw the peer go (NCCL reported it): refused up front
    EXPECT_EQ(WaitSettled(*b, *h, absl::Seconds(30)), TransferState::kFailed);
    EXPECT_LE(absl::Now() - start, absl::Seconds(11));
    EXPECT_TRUE(b->Release(*h).ok());
  } else {
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  }
  EXPECT_TRUE(b->Disconnect("decode").ok());
}
#endif

}  // namespace
}  // namespace tandem::kvtransfer
