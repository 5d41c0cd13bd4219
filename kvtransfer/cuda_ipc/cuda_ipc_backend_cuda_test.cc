// The cuda_ipc backend on a real GPU (label gpu; skipped without one): scattered KV blocks arrive
// bit-exact between two agents of one process and between two processes, and every hostile or
// broken input is an error before any byte moves.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"
#include "kvtransfer/cuda_ipc/peer_process.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {
namespace {

bool HaveGpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

uint64_t Fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A small KV layout: 4 layers, 64 blocks of 16 tokens x 2 heads x 64 dims in bf16 (4 KiB each).
KvLayout Layout() {
  KvLayout l;
  l.num_layers = 4;
  l.num_blocks = 64;
  l.block_size = 16;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.elem_bytes = 2;
  l.block_bytes = 16 * 2 * 64 * 2;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_bytes * l.num_blocks;
  l.layer_stride = 2 * l.kv_stride;
  return l;
}

uint64_t Bytes(const KvLayout& l) { return l.layer_stride * l.num_layers; }

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

std::unique_ptr<TransferBackend> Make(const std::string& name) {
  BackendOptions options;
  options.agent_name = name;
  auto b = CreateTransferBackend("cuda_ipc", options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

absl::Status WaitDone(TransferBackend& b, TransferHandle h) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto state = b.Poll(h);
    if (!state.ok()) return state.status();
    if (*state == TransferState::kDone) return absl::OkStatus();
    if (*state == TransferState::kFailed) return absl::InternalError("failed");
  }
  return absl::DeadlineExceededError("transfer did not finish");
}

// Random source blocks -> a random permutation of destination blocks: what a prefill worker's
// KV looks like after a few hundred requests came and went on both sides.
struct Scatter {
  std::vector<int32_t> src_blocks, dst_blocks;
  int tokens = 0;
};
Scatter RandomScatter(const KvLayout& l, int blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> all(l.num_blocks);
  std::iota(all.begin(), all.end(), 0);
  Scatter s;
  std::shuffle(all.begin(), all.end(), rng);
  s.src_blocks.assign(all.begin(), all.begin() + blocks);
  std::shuffle(all.begin(), all.end(), rng);
  s.dst_blocks.assign(all.begin(), all.begin() + blocks);
  s.tokens = blocks * l.block_size - 3;  // a partial last block is written whole
  return s;
}

// The destination image the ops must produce from `src` over zeroed memory.
std::vector<unsigned char> Expected(const std::vector<unsigned char>& src,
                                    const std::vector<CopyOp>& ops, size_t bytes) {
  std::vector<unsigned char> out(bytes, 0);
  for (const CopyOp& op : ops) {
    std::memcpy(out.data() + op.remote_offset, src.data() + op.local_offset, op.length);
  }
  return out;
}

std::vector<unsigned char> RandomBytes(size_t n, uint32_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<unsigned char>(rng());
  return v;
}

TEST(CudaIpcBackendTest, ScatteredBlocksArriveExactlyInProcess) {
  SKIP_WITHOUT_GPU();
  const KvLayout l = Layout();
  const size_t bytes = Bytes(l);
  DeviceBuffer src(bytes), dst(bytes);
  const std::vector<unsigned char> data = RandomBytes(bytes, 1);
  ASSERT_EQ(cudaMemcpy(src.ptr, data.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst.ptr, 0, bytes), cudaSuccess);

  auto sender = Make("p"), receiver = Make("d");
  ASSERT_NE(sender, nullptr);
  ASSERT_NE(receiver, nullptr);
  auto local = sender->RegisterMemory(src.ptr, bytes, MemoryKind::kCuda);
  auto remote = receiver->RegisterMemory(dst.ptr, bytes, MemoryKind::kCuda);
  ASSERT_TRUE(local.ok() && remote.ok());
  ASSERT_TRUE(sender->Connect("d", *receiver->LocalAddress()).ok());

  const Scatter s = RandomScatter(l, 40, 7);
  auto ops = PlanBlockCopies(l, l, s.src_blocks, s.dst_blocks, s.tokens, 0);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_GT(ops->size(), 200u);  // scattered: about one op per block, layer and K/V
  TransferRequest request{.local_region = local->id,
                          .peer = "d",
                          .remote_region = *receiver->ExportRegion(remote->id),
                          .ops = *ops,
                          .notification = ""};
  auto h = sender->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(WaitDone(*sender, *h).ok());
  ASSERT_TRUE(sender->Release(*h).ok());

  std::vector<unsigned char> got(bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), dst.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(got == Expected(data, *ops, bytes));
  // A second transfer over the cached mapping and a reused slot.
  h = sender->PostWrite(request);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(WaitDone(*sender, *h).ok());
  EXPECT_TRUE(sender->Release(*h).ok());
  EXPECT_EQ(sender->Poll(*h).status().code(), absl::StatusCode::kNotFound);
}

TEST(CudaIpcBackendTest, RejectsBadMemoryPeersAndOps) {
  SKIP_WITHOUT_GPU();
  auto b = Make("a");
  ASSERT_NE(b, nullptr);
  std::vector<unsigned char> host(4096);
  EXPECT_EQ(b->RegisterMemory(host.data(), host.size(), MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(b->RegisterMemory(host.data(), host.size(), MemoryKind::kCuda).ok());
  DeviceBuffer mem(1 << 20);
  // A range running past its allocation.
  EXPECT_EQ(b->RegisterMemory(mem.ptr, (1 << 20) + 4096, MemoryKind::kCuda).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto region = b->RegisterMemory(mem.ptr, 1 << 20, MemoryKind::kCuda);
  ASSERT_TRUE(region.ok()) << region.status();

  // Garbage, another host, a GPU that is not here.
  EXPECT_EQ(b->Connect("x", std::string(16, '\x7f')).code(), absl::StatusCode::kInvalidArgument);
  const std::string address = *b->LocalAddress();
  auto parsed = cuda_ipc::DecodeAgentAddress(address);
  ASSERT_TRUE(parsed.ok());
  cuda_ipc::AgentAddress other = *parsed;
  other.boot_id = "00000000-0000-0000-0000-000000000000";
  const absl::Status other_host = b->Connect("x", cuda_ipc::EncodeAgentAddress(other));
  EXPECT_EQ(other_host.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other_host.message().find("another host"), std::string::npos) << other_host;
  other = *parsed;
  other.gpu[0] ^= 0xff;
  EXPECT_EQ(b->Connect("x", cuda_ipc::EncodeAgentAddress(other)).code(),
            absl::StatusCode::kFailedPrecondition);

  TransferRequest request;
  request.local_region = region->id;
  request.peer = "nobody";
  EXPECT_EQ(b->PostWrite(request).status().code(), absl::StatusCode::kNotFound);
  request.local_region = 999;
  EXPECT_EQ(b->PostWrite(request).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Poll(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Release(12345).code(), absl::StatusCode::kNotFound);
}

#ifdef KVT_CUDA_IPC_PEER
// The peer binary: next to this test (a GPU host's unpacked bundle), else where CMake built it.
std::string PeerBinary() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string beside = dir + "/kvtransfer_cuda_ipc_peer";
    if (access(beside.c_str(), X_OK) == 0) return beside;
  }
  return KVT_CUDA_IPC_PEER;
}

// Writes from this process into another one's memory; the peer hashes what it holds.
TEST(CudaIpcBackendTest, CrossProcessWritesAndForgedRegions) {
  SKIP_WITHOUT_GPU();
  const KvLayout l = Layout();
  const size_t bytes = Bytes(l);
  auto peer = cuda_ipc::PeerProcess::Start(PeerBinary(), bytes, 0, absl::Seconds(30));
  ASSERT_TRUE(peer.ok()) << peer.status();
  DeviceBuffer src(bytes);
  const std::vector<unsigned char> data = RandomBytes(bytes, 2);
  ASSERT_EQ(cudaMemcpy(src.ptr, data.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  auto sender = Make("prefill");
  ASSERT_NE(sender, nullptr);
  auto local = sender->RegisterMemory(src.ptr, bytes, MemoryKind::kCuda);
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE(sender->Connect("decode", (*peer)->address()).ok());

  // Forged regions: a length or offset beyond the allocation the handle maps, a foreign GPU.
  auto blob = cuda_ipc::DecodeRegionBlob((*peer)->region());
  ASSERT_TRUE(blob.ok());
  const std::vector<CopyOp> one = {{.local_offset = 0, .remote_offset = 0, .length = 4096}};
  for (int forgery = 0; forgery < 3; ++forgery) {
    cuda_ipc::RegionBlob forged = *blob;
    if (forgery == 0) forged.length = uint64_t{1} << 40;
    if (forgery == 1) forged.offset = uint64_t{1} << 30;
    if (forgery == 2) forged.gpu[3] ^= 1;
    TransferRequest request{.local_region = local->id,
                            .peer = "decode",
                            .remote_region = cuda_ipc::EncodeRegionBlob(forged),
                            .ops = one,
                            .notification = ""};
    EXPECT_EQ(sender->PostWrite(request).status().code(), absl::StatusCode::kInvalidArgument)
        << forgery;
  }
  // Ops past the (real) region.
  TransferRequest past{.local_region = local->id,
                       .peer = "decode",
                       .remote_region = (*peer)->region(),
                       .ops = {{.local_offset = 0, .remote_offset = bytes - 16, .length = 32}},
                       .notification = ""};
  EXPECT_EQ(sender->PostWrite(past).status().code(), absl::StatusCode::kInvalidArgument);
  auto zero_hash = (*peer)->Command("hash", absl::Seconds(10));
  ASSERT_TRUE(zero_hash.ok());
  EXPECT_EQ(*zero_hash, absl::StrCat("hash ", absl::Hex(Fnv1a(std::vector<unsigned char>(bytes)),
                                                        absl::kZeroPad16)));

  const Scatter s = RandomScatter(l, 50, 11);
  auto ops = PlanBlockCopies(l, l, s.src_blocks, s.dst_blocks, s.tokens, 0);
  ASSERT_TRUE(ops.ok());
  TransferRequest request{.local_region = local->id,
                          .peer = "decode",
                          .remote_region = (*peer)->region(),
                          .ops = *ops,
                          .notification = ""};
  auto h = sender->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  // Release right away: it must wait for the kernel, so the bytes are all there afterwards.
  ASSERT_TRUE(sender->Release(*h).ok());
  auto hash = (*peer)->Command("hash", absl::Seconds(10));
  ASSERT_TRUE(hash.ok());
  EXPECT_EQ(*hash,
            absl::StrCat("hash ", absl::Hex(Fnv1a(Expected(data, *ops, bytes)), absl::kZeroPad16)));
  EXPECT_TRUE(sender->Disconnect("decode").ok());
}
#endif

}  // namespace
}  // namespace tandem::kvtransfer
