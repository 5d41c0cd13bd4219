// Every backend through the same tests: two agents in this process (for UCX two ucp contexts and
// workers talking over tcp/shared memory, both progressed by this thread), KV-like transfers,
// notifications, error cases, and every failure point through the fault-injecting wrapper.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_injecting_backend.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(10);

std::string UniqueName(std::string_view role) {
  static std::atomic<int> counter{0};
  return absl::StrCat(std::string(role), "-", counter.fetch_add(1));
}

// Test parameter -> backend: "loopback", "ucx" (tcp,sm,self), "ucx_tcp" (tcp,self only),
// "ucx_sm" (sm,self only: see SharedMemoryOnlyWorksOnOneHostAndFailsAcrossHosts).
std::unique_ptr<FaultInjectingBackend> MakeAgent(const std::string& param) {
  BackendOptions options;
  options.agent_name = UniqueName(param);
  options.ucx_transports = param == "ucx_tcp"  ? "tcp,self"
                           : param == "ucx_sm" ? "sm,self"
                                               : "tcp,sm,self";
  options.connect_timeout = absl::Seconds(5);
  const std::string backend = param == "loopback" ? "loopback" : "ucx";
  auto inner = CreateTransferBackend(backend, options);
  CHECK(inner.ok()) << inner.status();
  return std::make_unique<FaultInjectingBackend>(std::move(inner).value());
}

// Connects `from` to `to` while another thread progresses `to` (UCX wireup needs the target to
// progress; `to` is owned by that thread for the duration).
absl::Status ConnectPumping(TransferBackend& from, TransferBackend& to) {
  ASSIGN_OR_RETURN(std::string address, to.LocalAddress());
  std::atomic<bool> stop{false};
  std::thread pump([&] {
    while (!stop.load()) {
      to.Progress();
      std::this_thread::yield();
    }
  });
  absl::Status status = from.Connect(to.agent_name(), address);
  stop.store(true);
  pump.join();
  return status;
}

// Polls until the transfer leaves kInProgress, progressing the target too.
absl::StatusOr<TransferState> PollToEnd(TransferBackend& from, TransferBackend& to,
                                        TransferHandle handle) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (absl::Now() < deadline) {
    ASSIGN_OR_RETURN(TransferState state, from.Poll(handle));
    if (state != TransferState::kInProgress) return state;
    to.Progress();
  }
  return absl::DeadlineExceededError("transfer did not finish");
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

KvLayout TestLayout(int layers, int blocks, int block_bytes) {
  KvLayout l;
  l.num_layers = layers;
  l.num_blocks = blocks;
  l.block_size = 16;
  l.num_kv_heads = 1;
  l.head_dim = block_bytes / 16 / 2;
  l.elem_bytes = 2;
  l.block_bytes = static_cast<uint64_t>(block_bytes);
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * blocks;
  l.layer_stride = 2 * l.kv_stride;
  return l;
}

size_t LayoutBytes(const KvLayout& l) { return l.layer_stride * l.num_layers; }

// KV-like ops: source blocks 0..n-1 into a shuffled set of destination blocks.
std::vector<CopyOp> KvOps(const KvLayout& layout, int num_blocks, uint32_t seed) {
  std::vector<int32_t> src(num_blocks), dst(layout.num_blocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), std::mt19937(seed));
  auto ops = PlanBlockCopies(layout, layout, src, dst, num_blocks * layout.block_size, 0);
  CHECK(ops.ok()) << ops.status();
  return *ops;
}

// What the target memory must hold after `ops` moved `src` into `dst`.
std::vector<uint8_t> Expected(std::vector<uint8_t> dst, const std::vector<uint8_t>& src,
                              const std::vector<CopyOp>& ops) {
  for (const CopyOp& op : ops) {
    std::memcpy(dst.data() + op.remote_offset, src.data() + op.local_offset, op.length);
  }
  return dst;
}

class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    a_ = MakeAgent(GetParam());
    b_ = MakeAgent(GetParam());
  }
  std::unique_ptr<FaultInjectingBackend> a_, b_;
};

TEST_P(BackendTest, WritesKvBlocksAndNotifiesOnceAfterDataIsVisible) {
  const KvLayout layout = TestLayout(4, 24, 4096);
  std::vector<uint8_t> src = RandomBytes(LayoutBytes(layout), 1);
  std::vector<uint8_t> dst = RandomBytes(LayoutBytes(layout), 2);
  const std::vector<CopyOp> ops = KvOps(layout, 17, 3);
  ASSERT_GT(ops.size(), 50u);
  const std::vector<uint8_t> expected = Expected(dst, src, ops);

  auto src_region = a_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok()) << src_region.status();
  auto dst_region = b_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(dst_region.ok()) << dst_region.status();
  auto blob = b_->ExportRegion(dst_region->id);
  ASSERT_TRUE(blob.ok()) << blob.status();
  ASSERT_TRUE(ConnectPumping(*a_, *b_).ok());
  // Connect is idempotent for the same name and address.
  ASSERT_TRUE(a_->Connect(b_->agent_name(), *b_->LocalAddress()).ok());

  auto handle = a_->PostWrite({.local_region = src_region->id,
                               .peer = b_->agent_name(),
                               .remote_region = *blob,
                               .ops = ops,
                               .notification = "prefill-done:req-1"});
  ASSERT_TRUE(handle.ok()) << handle.status();
  int notifications = 0;
  bool done = false;
  const absl::Time deadline = absl::Now() + kDeadline;
  while ((!done || notifications == 0) && absl::Now() < deadline) {
    if (!done) {
      auto state = a_->Poll(*handle);
      ASSERT_TRUE(state.ok()) << state.status();
      ASSERT_NE(*state, TransferState::kFailed);
      done = *state == TransferState::kDone;
      if (done) {
        EXPECT_EQ(dst, expected) << "kDone before the bytes landed";
      }
    }
    for (const Notification& n : b_->GetNotifications()) {
      ++notifications;
      EXPECT_EQ(n.peer, a_->agent_name());
      EXPECT_EQ(n.message, "prefill-done:req-1");
      EXPECT_EQ(dst, expected) << "notification before the bytes landed";
    }
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(notifications, 1);
  // No duplicate arrives later.
  for (int i = 0; i < 200; ++i) {
    a_->Progress();
    notifications += static_cast<int>(b_->GetNotifications().size());
  }
  EXPECT_EQ(notifications, 1);
  EXPECT_EQ(dst, expected);
  EXPECT_TRUE(a_->Release(*handle).ok());
  EXPECT_TRUE(a_->DeregisterMemory(src_region->id).ok());
  EXPECT_TRUE(b_->DeregisterMemory(dst_region->id).ok());
  EXPECT_TRUE(a_->Disconnect(b_->agent_name()).ok());
}

TEST_P(BackendTest, ManyTransfersInFlightAtOnce) {
  const KvLayout layout = TestLayout(2, 32, 1024);
  std::vector<uint8_t> src = RandomBytes(LayoutBytes(layout), 4);
  std::vector<uint8_t> dst(LayoutBytes(layout), 0);
  auto src_region = a_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto dst_region = b_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok() && dst_region.ok());
  auto blob = b_->ExportRegion(dst_region->id);
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(ConnectPumping(*a_, *b_).ok());
  std::vector<TransferHandle> handles;
  for (int i = 0; i < 8; ++i) {
    // Transfer i moves block i of every layer/kv to the same place.
    std::vector<CopyOp> ops;
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t off = KvBlockOffset(layout, layer, kv, i);
        ops.push_back({.local_offset = off, .remote_offset = off, .length = layout.block_bytes});
      }
    }
    auto h = a_->PostWrite({.local_region = src_region->id,
                            .peer = b_->agent_name(),
                            .remote_region = *blob,
                            .ops = ops,
                            .notification = absl::StrCat("t", i)});
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  std::vector<std::string> messages;
  for (TransferHandle h : handles) {
    auto state = PollToEnd(*a_, *b_, h);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    for (const Notification& n : b_->GetNotifications()) messages.push_back(n.message);
    EXPECT_TRUE(a_->Release(h).ok());
  }
  const absl::Time deadline = absl::Now() + kDeadline;
  while (messages.size() < handles.size() && absl::Now() < deadline) {
    for (const Notification& n : b_->GetNotifications()) messages.push_back(n.message);
  }
  EXPECT_THAT(messages,
              ::testing::UnorderedElementsAre("t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"));
  for (int i = 0; i < 8; ++i) {
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t off = KvBlockOffset(layout, layer, kv, i);
        EXPECT_EQ(std::memcmp(dst.data() + off, src.data() + off, layout.block_bytes), 0);
      }
    }
  }
  EXPECT_TRUE(a_->DeregisterMemory(src_region->id).ok());
  EXPECT_TRUE(b_->DeregisterMemory(dst_region->id).ok());
}

TEST_P(BackendTest, ReadsFromPeerRegion) {
  if (!a_->capabilities().read) GTEST_SKIP() << GetParam() << " has no PostRead";
  std::vector<uint8_t> remote = RandomBytes(1 << 20, 5);
  std::vector<uint8_t> local(1 << 20, 0);
  auto local_region = a_->RegisterMemory(local.data(), local.size(), MemoryKind::kHost);
  auto remote_region = b_->RegisterMemory(remote.data(), remote.size(), MemoryKind::kHost);
  ASSERT_TRUE(local_region.ok() && remote_region.ok());
  auto blob = b_->ExportRegion(remote_region->id);
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(ConnectPumping(*a_, *b_).ok());
  const std::vector<CopyOp> ops = {{.local_offset = 0, .remote_offset = 4096, .length = 65536},
                                   {.local_offset = 100000, .remote_offset = 0, .length = 7}};
  auto h = a_->PostRead({.local_region = local_region->id,
                         .peer = b_->agent_name(),
                         .remote_region = *blob,
                         .ops = ops,
                         .notification = ""});
  ASSERT_TRUE(h.ok()) << h.status();
  auto state = PollToEnd(*a_, *b_, *h);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(*state, TransferState::kDone);
  EXPECT_EQ(std::memcmp(local.data(), remote.data() + 4096, 65536), 0);
  EXPECT_EQ(std::memcmp(local.data() + 100000, remote.data(), 7), 0);
  EXPECT_EQ(local[65536], 0);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_TRUE(b_->GetNotifications().empty());
}

TEST_P(BackendTest, RejectsBadRequests) {
  std::vector<uint8_t> src(8192, 1), dst(4096, 0);
  auto src_region = a_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto dst_region = b_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok() && dst_region.ok());
  auto blob = b_->ExportRegion(dst_region->id);
  ASSERT_TRUE(blob.ok());
  TransferRequest request{.local_region = src_region->id,
                          .peer = b_->agent_name(),
                          .remote_region = *blob,
                          .ops = {{.local_offset = 0, .remote_offset = 0, .length = 4096}},
                          .notification = "x"};
  // Unknown peer (not connected yet).
  EXPECT_EQ(a_->PostWrite(request).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ConnectPumping(*a_, *b_).ok());

  TransferRequest bad = request;
  bad.ops = {{.local_offset = 0, .remote_offset = 1, .length = 4096}};  // past remote end
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.ops = {{.local_offset = 8000, .remote_offset = 0, .length = 200}};  // past local end
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.ops = {{.local_offset = 0, .remote_offset = SIZE_MAX, .length = 2}};  // overflow
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = request;
  bad.local_region = 9999;
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kNotFound);
  bad = request;
  bad.peer = "nobody";
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kNotFound);
  bad = request;
  bad.remote_region = "garbage";
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Poll(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->Release(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b_->ExportRegion(777).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b_->DeregisterMemory(777).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->Disconnect("nobody").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(a_->RegisterMemory(nullptr, 10, MemoryKind::kHost).ok());
  EXPECT_FALSE(a_->Connect("x", "").ok());
  // None of the rejected requests delivered anything.
  for (int i = 0; i < 50; ++i) {
    a_->Progress();
    EXPECT_TRUE(b_->GetNotifications().empty());
  }
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0));

  // Deregistering a region with an unreleased transfer fails; after Release it works.
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(a_->DeregisterMemory(src_region->id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a_->Disconnect(b_->agent_name()).code(), absl::StatusCode::kFailedPrecondition);
  auto state = PollToEnd(*a_, *b_, *h);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_EQ(a_->DeregisterMemory(src_region->id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_EQ(a_->Release(*h).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(a_->DeregisterMemory(src_region->id).ok());
  EXPECT_EQ(a_->DeregisterMemory(src_region->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(a_->Disconnect(b_->agent_name()).ok());
}

TEST_P(BackendTest, ReleaseWhileInFlightThenReuse) {
  std::vector<uint8_t> src = RandomBytes(8 << 20, 6), dst(8 << 20, 0);
  auto src_region = a_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto dst_region = b_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok() && dst_region.ok());
  auto blob = b_->ExportRegion(dst_region->id);
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(ConnectPumping(*a_, *b_).ok());
  TransferRequest request{.local_region = src_region->id,
                          .peer = b_->agent_name(),
                          .remote_region = *blob,
                          .ops = {{.local_offset = 0, .remote_offset = 0, .length = src.size()}},
                          .notification = "big"};
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(a_->Release(*h).ok());  // possibly still in flight: cancelled best effort
  // The backend stays usable: the same write again completes.
  auto h2 = a_->PostWrite(request);
  ASSERT_TRUE(h2.ok()) << h2.status();
  auto state = PollToEnd(*a_, *b_, *h2);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_TRUE(a_->Release(*h2).ok());
  EXPECT_EQ(dst, src);
  // Deregistration waits (bounded) for the released transfer's leftovers; keep the target
  // progressing meanwhile by polling it from this thread between attempts.
  absl::Status dereg;
  for (int i = 0; i < 100; ++i) {
    b_->Progress();
    dereg = a_->DeregisterMemory(src_region->id);
    if (dereg.code() != absl::StatusCode::kFailedPrecondition) break;
  }
  EXPECT_TRUE(dereg.ok()) << dereg;
}

BackendOptions Options(const std::string& agent_name) {
  BackendOptions options;
  options.agent_name = agent_name;
  return options;
}

TEST(TransferBackendFactoryTest, UnknownNameListsChoices) {
  auto backend = CreateTransferBackend("rdma-magic", Options("x"));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(backend.status().message(), HasSubstr("loopback"));
  EXPECT_THAT(backend.status().message(), HasSubstr("ucx"));
}

// The registry lists every backend once, in auto's order (device-memory backends first, the
// in-process reference last); each entry either creates its backend or says what the build lacks,
// and CreateTransferBackend answers for each name accordingly.
TEST(TransferBackendFactoryTest, RegistryListsEveryBackendAndWhatABuildLacks) {
  const std::vector<BackendEntry>& registry = TransferBackendRegistry();
  std::vector<std::string> names;
  for (const BackendEntry& e : registry) names.emplace_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"cuda_ipc", "nccl", "cma", "ucx", "loopback"}));
  for (const BackendEntry& e : registry) {
    SCOPED_TRACE(std::string(e.name));
    EXPECT_FALSE(e.summary.empty());
    EXPECT_NE(e.create == nullptr, e.missing.empty()) << "exactly one of create and missing";
    if (e.create == nullptr) {
      auto made = CreateTransferBackend(std::string(e.name), Options(UniqueName("reg")));
      EXPECT_EQ(made.status().code(), absl::StatusCode::kUnimplemented);
      EXPECT_THAT(made.status().message(), HasSubstr(std::string(e.missing)));
    }
  }
  EXPECT_TRUE(registry.back().in_process_only);
  EXPECT_TRUE(registry[0].moves_device_memory);
}

TEST(TransferBackendFactoryTest, CapabilitiesAndDuplicateLoopbackNames) {
  auto loopback = CreateTransferBackend("loopback", Options("dup"));
  ASSERT_TRUE(loopback.ok());
  EXPECT_FALSE((*loopback)->capabilities().cross_process);
  EXPECT_TRUE((*loopback)->capabilities().notifications);
  EXPECT_EQ(CreateTransferBackend("loopback", Options("dup")).status().code(),
            absl::StatusCode::kAlreadyExists);
  if (!TransferBackendBuilt("ucx")) GTEST_SKIP() << "this build has no UCX";
  auto ucx = CreateTransferBackend("ucx", Options("u"));
  ASSERT_TRUE(ucx.ok()) << ucx.status();
  EXPECT_TRUE((*ucx)->capabilities().cross_process);
  EXPECT_EQ((*ucx)->name(), "ucx");
}

// The socket inodes this process holds (/proc/self/fd).
std::set<std::string> SocketInodes() {
  std::set<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && absl::StartsWith(target, "socket:[")) {
      out.insert(target.substr(8, target.size() - 9));
    }
  }
  return out;
}

// Local addresses (hex, as /proc/net/tcp writes them) of listening TCP sockets among `inodes`.
std::vector<std::string> ListeningAddresses(const std::set<std::string>& inodes) {
  std::vector<std::string> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() > 9 && f[3] == "0A" && inodes.contains(f[9])) out.push_back(f[1]);
  }
  return out;
}

// A worker bound to loopback gives UCX only the loopback device: its tcp transport must not
// listen on the machine's other interfaces.
TEST(UcxTransportsTest, LoopbackNetDevicesListenOnlyOnLoopback) {
  if (!TransferBackendBuilt("ucx")) GTEST_SKIP() << "this build has no UCX";
  const std::set<std::string> before = SocketInodes();
  BackendOptions options = Options(UniqueName("lo"));
  options.ucx_net_devices = "lo";
  auto backend = CreateTransferBackend("ucx", options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::set<std::string> added;
  for (const std::string& inode : SocketInodes()) {
    if (!before.contains(inode)) added.insert(inode);
  }
  const std::vector<std::string> listening = ListeningAddresses(added);
  EXPECT_FALSE(listening.empty()) << "UCX's tcp transport opened no listener";
  for (const std::string& address : listening) {
    EXPECT_TRUE(absl::StartsWith(address, "0100007F:")) << "listening on " << address;
  }
}

// UCX 1.13 quirk: its shared-memory transports (posix/sysv/cma) cannot detect a dead peer, so they
// cannot carry an endpoint with peer error handling. Peers on one host (same boot id in the
// address) go without it (the backend watches the peer's pid instead), so shared memory alone
// carries them; a peer on another host keeps error handling, and shared memory alone must then
// fail at Connect (not crash, not hang).
TEST(UcxTransportsTest, SharedMemoryOnlyWorksOnOneHostAndFailsAcrossHosts) {
  if (!TransferBackendBuilt("ucx")) GTEST_SKIP() << "this build has no UCX";
  auto a = MakeAgent("ucx_sm");
  auto b = MakeAgent("ucx_sm");
  ASSERT_TRUE(ConnectPumping(*a, *b).ok());
  std::vector<uint8_t> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  auto local = a->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto remote = b->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(local.ok() && remote.ok());
  auto h = a->PostWrite({.local_region = local->id,
                         .peer = b->agent_name(),
                         .remote_region = *b->ExportRegion(remote->id),
                         .ops = {{.local_offset = 0, .remote_offset = 0, .length = src.size()}},
                         .notification = ""});
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<TransferState> state;
  do {
    b->Progress();
    state = a->Poll(*h);
  } while (state.ok() && *state == TransferState::kInProgress && absl::Now() < deadline);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_TRUE(a->Release(*h).ok());
  EXPECT_TRUE(dst == src);

  // The same address claiming another host (another boot id): error handling, no transport.
  auto c = MakeAgent("ucx_sm");
  std::string address = *c->LocalAddress();
  const size_t boot = address.find(' ') + 1;
  address.replace(boot, 36, std::string(36, '0'));
  const absl::Time start = absl::Now();
  absl::Status status = a->Connect(c->agent_name(), address);
  EXPECT_FALSE(status.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The failed Connect left nothing behind: the peer is unknown.
  EXPECT_EQ(a->Disconnect(c->agent_name()).code(), absl::StatusCode::kNotFound);
  // A blob that is no tandem-ucx address at all.
  EXPECT_EQ(a->Connect("garbage", std::string(16, '\x01')).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- kLateWrite and kCorruptBytes: faults that report nothing, so the tests look at the bytes.

// A source and a destination region on a connected pair, and KV-like ops between them.
struct PairedRegions {
  KvLayout layout = TestLayout(2, 16, 1024);
  std::vector<uint8_t> src, dst, before, expected;  // before/expected: dst before/after `ops`
  std::vector<CopyOp> ops;
  MemoryRegion src_region, dst_region;
  std::string peer, blob;

  TransferRequest Request(std::string notification) const {
    return {.local_region = src_region.id,
            .peer = peer,
            .remote_region = blob,
            .ops = ops,
            .notification = std::move(notification)};
  }
};

void SetUpPair(FaultInjectingBackend& a, FaultInjectingBackend& b, uint32_t seed,
               PairedRegions& t) {
  t.src = RandomBytes(LayoutBytes(t.layout), seed);
  t.dst = RandomBytes(LayoutBytes(t.layout), seed + 1);
  t.before = t.dst;
  t.ops = KvOps(t.layout, 5, seed + 2);
  t.expected = Expected(t.dst, t.src, t.ops);
  ASSERT_NE(t.expected, t.before);
  auto src_region = a.RegisterMemory(t.src.data(), t.src.size(), MemoryKind::kHost);
  auto dst_region = b.RegisterMemory(t.dst.data(), t.dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok() && dst_region.ok());
  t.src_region = *src_region;
  t.dst_region = *dst_region;
  auto blob = b.ExportRegion(dst_region->id);
  ASSERT_TRUE(blob.ok());
  t.blob = *blob;
  t.peer = b.agent_name();
  ASSERT_TRUE(ConnectPumping(a, b).ok());
}

TEST_P(BackendTest, LateWriteLandsAfterReleaseOnlyInItsRangesOnceItsDelayPassed) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 21, t));
  constexpr absl::Duration kDelay = absl::Milliseconds(300);
  a_->SetPlan({.stage = FaultStage::kLateWrite, .late_write_delay = kDelay});
  TransferRequest request = t.Request("late");
  const absl::Time posted = absl::Now();  // before PostWrite: the write is due no earlier
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(a_->faults_injected(), 1);
  EXPECT_EQ(a_->late_writes_pending(), 1);
  auto state = a_->Poll(*h);
  ASSERT_TRUE(state.ok());
  if (absl::Now() < posted + kDelay) {
    EXPECT_EQ(*state, TransferState::kInProgress);
  }
  // The initiator gives up; the write is still held, and still uses its region and peer.
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_EQ(a_->Poll(*h).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->late_writes_pending(), 1);
  EXPECT_EQ(a_->DeregisterMemory(t.src_region.id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a_->Disconnect(b_->agent_name()).code(), absl::StatusCode::kFailedPrecondition);

  // Until the delay passed nothing lands (the wrapper posts only inside these calls).
  int notifications = 0;
  for (;;) {
    a_->Progress();
    b_->Progress();
    notifications += static_cast<int>(b_->GetNotifications().size());
    if (absl::Now() >= posted + kDelay) break;
    ASSERT_EQ(t.dst, t.before) << "a late write landed before its delay";
    ASSERT_EQ(notifications, 0);
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Then it lands, in exactly the ops' ranges, and the target is told.
  const absl::Time deadline = absl::Now() + kDeadline;
  while ((a_->late_writes_pending() > 0 || notifications == 0) && absl::Now() < deadline) {
    a_->Progress();
    b_->Progress();
    notifications += static_cast<int>(b_->GetNotifications().size());
  }
  EXPECT_EQ(a_->late_writes_pending(), 0);
  EXPECT_EQ(notifications, 1);
  EXPECT_GE(absl::Now() - posted, kDelay);
  EXPECT_EQ(t.dst, t.expected);
  EXPECT_TRUE(a_->DeregisterMemory(t.src_region.id).ok());
  EXPECT_TRUE(b_->DeregisterMemory(t.dst_region.id).ok());
  EXPECT_TRUE(a_->Disconnect(b_->agent_name()).ok());
}

TEST_P(BackendTest, LateWriteReportsInProgressUntilItsDelayThenCompletes) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 31, t));
  constexpr absl::Duration kDelay = absl::Milliseconds(200);
  a_->SetPlan({.stage = FaultStage::kLateWrite, .late_write_delay = kDelay});
  TransferRequest request = t.Request("");
  // Only the local side is checked while the write is held; a bad request posts nothing.
  TransferRequest bad = request;
  bad.ops = {{.local_offset = t.src.size(), .remote_offset = 0, .length = 1}};
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.local_region = 9999;
  EXPECT_EQ(a_->PostWrite(bad).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->faults_injected(), 0);

  const absl::Time posted = absl::Now();
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<TransferState> state;
  const absl::Time deadline = posted + kDeadline;
  do {
    const bool early = absl::Now() < posted + kDelay;
    state = a_->Poll(*h);
    ASSERT_TRUE(state.ok()) << state.status();
    if (early) {
      ASSERT_EQ(t.dst, t.before);
    }
    b_->Progress();
  } while (*state == TransferState::kInProgress && absl::Now() < deadline);
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_GE(absl::Now() - posted, kDelay);
  EXPECT_EQ(t.dst, t.expected);
  EXPECT_EQ(a_->late_writes_pending(), 0);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_TRUE(a_->DeregisterMemory(t.src_region.id).ok());
}

TEST_P(BackendTest, LateWriteReleasedBeforeItsDelayCanBeDropped) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 41, t));
  constexpr absl::Duration kDelay = absl::Milliseconds(100);
  a_->SetPlan({.stage = FaultStage::kLateWrite,
               .late_write_delay = kDelay,
               .late_write_survives_release = false});
  TransferRequest request = t.Request("dropped");
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_EQ(a_->late_writes_pending(), 0);
  EXPECT_TRUE(a_->DeregisterMemory(t.src_region.id).ok());  // nothing uses it any more
  const absl::Time until = absl::Now() + 3 * kDelay;
  int notifications = 0;
  while (absl::Now() < until) {
    a_->Progress();
    b_->Progress();
    notifications += static_cast<int>(b_->GetNotifications().size());
  }
  EXPECT_EQ(notifications, 0);
  EXPECT_EQ(t.dst, t.before);
}

TEST_P(BackendTest, DestroyingTheWrapperDropsItsHeldWrites) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 51, t));
  constexpr absl::Duration kDelay = absl::Milliseconds(100);
  a_->SetPlan({.stage = FaultStage::kLateWrite, .once = false, .late_write_delay = kDelay});
  TransferRequest request = t.Request("never");
  auto owned = a_->PostWrite(request);
  auto released = a_->PostWrite(request);
  ASSERT_TRUE(owned.ok() && released.ok());
  EXPECT_TRUE(a_->Release(*released).ok());
  EXPECT_EQ(a_->late_writes_pending(), 2);
  a_.reset();
  const absl::Time until = absl::Now() + 3 * kDelay;
  int notifications = 0;
  while (absl::Now() < until) {
    b_->Progress();
    notifications += static_cast<int>(b_->GetNotifications().size());
  }
  EXPECT_EQ(notifications, 0);
  EXPECT_EQ(t.dst, t.before);
}

// `expected` with the bytes kCorruptBytes overwrites for `ops` (host source: flipped bits).
std::vector<uint8_t> Corrupted(std::vector<uint8_t> expected, const std::vector<uint8_t>& src,
                               const std::vector<CopyOp>& ops) {
  const CopyOp& first = ops.front();
  const size_t length = std::min<size_t>(16, first.length);
  const size_t middle = (first.length - length) / 2;
  for (size_t i = 0; i < length; ++i) {
    expected[first.remote_offset + middle + i] =
        static_cast<uint8_t>(~src[first.local_offset + middle + i]);
  }
  return expected;
}

// Offsets where the two differ.
std::vector<size_t> Differences(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<size_t> at;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) at.push_back(i);
  }
  return at;
}

TEST_P(BackendTest, CorruptBytesDifferFromTheSourceInExactlyTheCorruptedRange) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 61, t));
  a_->SetPlan({.stage = FaultStage::kCorruptBytes});
  TransferRequest request = t.Request("corrupt");
  const std::vector<uint8_t> corrupted = Corrupted(t.expected, t.src, t.ops);
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  int notifications = 0;
  bool done = false;
  const absl::Time deadline = absl::Now() + kDeadline;
  while ((!done || notifications == 0) && absl::Now() < deadline) {
    if (!done) {
      auto state = a_->Poll(*h);
      ASSERT_TRUE(state.ok()) << state.status();
      ASSERT_NE(*state, TransferState::kFailed);
      done = *state == TransferState::kDone;
      if (done) {
        EXPECT_EQ(t.dst, corrupted) << "kDone before the corrupting write landed";
      }
    }
    for (const Notification& n : b_->GetNotifications()) {
      ++notifications;
      EXPECT_EQ(n.message, "corrupt");
      EXPECT_EQ(t.dst, corrupted) << "notification before the corrupting write landed";
    }
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(notifications, 1);
  EXPECT_EQ(a_->faults_injected(), 1);
  // 16 bytes in the middle of the first op's destination, every one unlike the source.
  const CopyOp& first = t.ops.front();
  ASSERT_GE(first.length, 16u);
  const size_t begin = first.remote_offset + (first.length - 16) / 2;
  std::vector<size_t> expected_at(16);
  std::iota(expected_at.begin(), expected_at.end(), begin);
  EXPECT_EQ(Differences(t.dst, t.expected), expected_at);
  EXPECT_TRUE(a_->Release(*h).ok());

  // Disarmed: the same write again repairs the range.
  h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  auto state = PollToEnd(*a_, *b_, *h);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_EQ(t.dst, t.expected);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_TRUE(a_->DeregisterMemory(t.src_region.id).ok());
  EXPECT_TRUE(b_->DeregisterMemory(t.dst_region.id).ok());
}

TEST_P(BackendTest, CorruptBytesOfShortAndEmptyFirstOps) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 71, t));
  a_->SetPlan({.stage = FaultStage::kCorruptBytes});
  TransferRequest request = t.Request("");
  // An empty first op has nothing to corrupt: the write is clean and the plan stays armed.
  request.ops = {{.local_offset = 0, .remote_offset = 0, .length = 0},
                 {.local_offset = 0, .remote_offset = 4096, .length = 64}};
  auto h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  auto state = PollToEnd(*a_, *b_, *h);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_EQ(a_->faults_injected(), 0);
  std::vector<uint8_t> expected = Expected(t.before, t.src, request.ops);
  EXPECT_EQ(t.dst, expected);

  // A first op shorter than 16 bytes is corrupted whole; the second op lands intact.
  request.ops = {{.local_offset = 100, .remote_offset = 200, .length = 5},
                 {.local_offset = 1000, .remote_offset = 8192, .length = 300}};
  h = a_->PostWrite(request);
  ASSERT_TRUE(h.ok()) << h.status();
  state = PollToEnd(*a_, *b_, *h);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_TRUE(a_->Release(*h).ok());
  EXPECT_EQ(a_->faults_injected(), 1);
  expected = Expected(expected, t.src, request.ops);
  EXPECT_EQ(Differences(t.dst, expected), (std::vector<size_t>{200, 201, 202, 203, 204}));
  EXPECT_EQ(t.dst, Corrupted(expected, t.src, request.ops));
}

TEST_P(BackendTest, ManyCorruptedWritesInFlightEachStayInsideItsOwnRange) {
  PairedRegions t;
  ASSERT_NO_FATAL_FAILURE(SetUpPair(*a_, *b_, 81, t));
  a_->SetPlan({.stage = FaultStage::kCorruptBytes, .once = false});
  std::vector<TransferHandle> handles;
  std::vector<uint8_t> expected = t.before;
  for (int block = 0; block < 8; ++block) {
    TransferRequest request = t.Request(absl::StrCat("c", block));
    const uint64_t off = KvBlockOffset(t.layout, 1, 0, block);
    request.ops = {{.local_offset = off, .remote_offset = off, .length = t.layout.block_bytes}};
    expected = Corrupted(Expected(expected, t.src, request.ops), t.src, request.ops);
    auto h = a_->PostWrite(request);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  for (TransferHandle h : handles) {
    auto state = PollToEnd(*a_, *b_, h);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    EXPECT_TRUE(a_->Release(h).ok());
  }
  EXPECT_EQ(a_->faults_injected(), 8);
  EXPECT_EQ(t.dst, expected);
}

// Not "cma": these tests (and FaultTest's) lean on notifications, which cma does not deliver (the
// product acknowledges over gRPC); kvtransfer/cma/cma_cross_process_test.cc covers it between
// processes instead.
// The UCX variants only where this build has UCX (TANDEM_UCX).
std::vector<std::string> HostBackends(std::vector<std::string> ucx_variants) {
  std::vector<std::string> params = {"loopback"};
  if (TransferBackendBuilt("ucx"))
    params.insert(params.end(), ucx_variants.begin(), ucx_variants.end());
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest,
                         ::testing::ValuesIn(HostBackends({"ucx", "ucx_tcp"})),
                         [](const auto& info) { return info.param; });

// ---- Failure points (STYLE.md 10): each fault surfaces as an error or kFailed, nothing leaks,
// and the next handoff through the same agents succeeds.

struct HandoffResult {
  absl::Status status;
  int notifications = 0;
  bool bytes_ok = false;
  absl::Duration elapsed;
};

// One full KV handoff: register both sides, export, connect, write, wait, release, deregister.
HandoffResult RunHandoff(TransferBackend& a, TransferBackend& b, uint32_t seed) {
  HandoffResult result;
  const KvLayout layout = TestLayout(3, 12, 2048);
  std::vector<uint8_t> src = RandomBytes(LayoutBytes(layout), seed);
  std::vector<uint8_t> dst(LayoutBytes(layout), 0);
  const std::vector<CopyOp> ops = KvOps(layout, 9, seed);
  const std::vector<uint8_t> expected = Expected(dst, src, ops);
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(MemoryRegion dst_region,
                     b.RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost));
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::string blob, b.ExportRegion(dst_region.id));
      ASSIGN_OR_RETURN(MemoryRegion src_region,
                       a.RegisterMemory(src.data(), src.size(), MemoryKind::kHost));
      absl::Status inner = [&]() -> absl::Status {
        RETURN_IF_ERROR(ConnectPumping(a, b));
        ASSIGN_OR_RETURN(TransferHandle h,
                         a.PostWrite({.local_region = src_region.id,
                                      .peer = b.agent_name(),
                                      .remote_region = blob,
                                      .ops = ops,
                                      .notification = absl::StrCat("done-", seed)}));
        absl::StatusOr<TransferState> state = PollToEnd(a, b, h);
        absl::Status release = a.Release(h);
        RETURN_IF_ERROR(state.status());
        if (*state == TransferState::kFailed) return absl::UnavailableError("transfer failed");
        RETURN_IF_ERROR(release);
        const absl::Time deadline = absl::Now() + absl::Seconds(1);
        while (result.notifications == 0 && absl::Now() < deadline) {
          a.Progress();
          result.notifications += static_cast<int>(b.GetNotifications().size());
        }
        if (result.notifications == 0) return absl::DeadlineExceededError("no notification");
        return absl::OkStatus();
      }();
      // Deregistration may need a few rounds while released leftovers drain.
      absl::Status dereg;
      for (int i = 0; i < 20; ++i) {
        b.Progress();
        dereg = a.DeregisterMemory(src_region.id);
        if (dereg.code() != absl::StatusCode::kFailedPrecondition) break;
      }
      if (inner.ok()) inner = dereg;
      return inner;
    }();
    absl::Status dereg = b.DeregisterMemory(dst_region.id);
    if (status.ok()) status = dereg;
    return status;
  };
  const absl::Time start = absl::Now();
  result.status = run();
  result.elapsed = absl::Now() - start;
  for (int i = 0; i < 20; ++i) {
    a.Progress();
    result.notifications += static_cast<int>(b.GetNotifications().size());
  }
  result.bytes_ok = dst == expected;
  return result;
}

class FaultTest : public ::testing::TestWithParam<std::tuple<std::string, FaultStage>> {};

TEST_P(FaultTest, FailureSurfacesAndBackendStaysUsable) {
  const auto [backend, stage] = GetParam();
  auto a = MakeAgent(backend);
  auto b = MakeAgent(backend);
  // kRegister/kExport are armed on whichever side performs the call first in RunHandoff.
  FaultInjectingBackend& faulty = (stage == FaultStage::kExport) ? *b : *a;
  faulty.SetPlan({.stage = stage, .once = true, .polls_before_failure = 2});
  HandoffResult failed = RunHandoff(*a, *b, 11);
  EXPECT_EQ(faulty.faults_injected(), 1);
  // kLateWrite and kCorruptBytes report no failure at all: the handoff "succeeds".
  const bool silent = stage == FaultStage::kLateWrite || stage == FaultStage::kCorruptBytes;
  if (stage == FaultStage::kNotificationDrop) {
    // The data lands, the notice does not: the waiter sees a deadline, never a false success.
    EXPECT_EQ(failed.status.code(), absl::StatusCode::kDeadlineExceeded) << failed.status;
    EXPECT_TRUE(failed.bytes_ok);
  } else if (stage == FaultStage::kLateWrite) {
    // A waiter that waits long enough sees the whole write, after the (default) delay.
    EXPECT_TRUE(failed.status.ok()) << failed.status;
    EXPECT_TRUE(failed.bytes_ok);
    EXPECT_GE(failed.elapsed, FaultPlan{}.late_write_delay);
    EXPECT_EQ(a->late_writes_pending(), 0);
  } else if (stage == FaultStage::kCorruptBytes) {
    // Done and notified, with wrong bytes: only a checksum of the KV tells.
    EXPECT_TRUE(failed.status.ok()) << failed.status;
    EXPECT_FALSE(failed.bytes_ok);
  } else {
    EXPECT_FALSE(failed.status.ok());
    EXPECT_THAT(failed.status.message(),
                ::testing::AnyOf(HasSubstr("injected fault"), HasSubstr("transfer failed")));
  }
  if (stage == FaultStage::kRelease) {
    // The transfer itself completed before the injected Release error.
    EXPECT_TRUE(failed.bytes_ok);
    EXPECT_LE(failed.notifications, 1);
  } else if (silent) {
    EXPECT_EQ(failed.notifications, 1);
  } else {
    EXPECT_EQ(failed.notifications, 0);
  }

  HandoffResult ok = RunHandoff(*a, *b, 12);
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_TRUE(ok.bytes_ok);
  EXPECT_EQ(ok.notifications, 1);
  EXPECT_EQ(faulty.faults_injected(), 1);

  // An "always" plan keeps failing (a silent one keeps being late or corrupt), and clearing it
  // heals.
  if (stage != FaultStage::kNotificationDrop) {
    faulty.SetPlan({.stage = stage, .once = false});
    for (uint32_t seed : {13, 14}) {
      HandoffResult always = RunHandoff(*a, *b, seed);
      if (silent) {
        EXPECT_TRUE(always.status.ok()) << always.status;
        EXPECT_EQ(always.bytes_ok, stage == FaultStage::kLateWrite);
      } else {
        EXPECT_FALSE(always.status.ok());
      }
    }
    faulty.SetPlan({});
    HandoffResult healed = RunHandoff(*a, *b, 15);
    EXPECT_TRUE(healed.status.ok()) << healed.status;
    EXPECT_TRUE(healed.bytes_ok);
  }
}

std::string StageName(FaultStage stage) {
  switch (stage) {
    case FaultStage::kNone:
      return "None";
    case FaultStage::kRegister:
      return "Register";
    case FaultStage::kExport:
      return "Export";
    case FaultStage::kConnect:
      return "Connect";
    case FaultStage::kPost:
      return "Post";
    case FaultStage::kMidTransfer:
      return "MidTransfer";
    case FaultStage::kRelease:
      return "Release";
    case FaultStage::kNotificationDrop:
      return "NotificationDrop";
    case FaultStage::kAccept:
      return "Accept";  // two-sided backends only (nccl); loopback and ucx need no Accept
    case FaultStage::kLateWrite:
      return "LateWrite";
    case FaultStage::kCorruptBytes:
      return "CorruptBytes";
  }
  return "Unknown";
}

INSTANTIATE_TEST_SUITE_P(
    Stages, FaultTest,
    ::testing::Combine(::testing::ValuesIn(HostBackends({"ucx"})),
                       ::testing::Values(FaultStage::kRegister, FaultStage::kExport,
                                         FaultStage::kConnect, FaultStage::kPost,
                                         FaultStage::kMidTransfer, FaultStage::kRelease,
                                         FaultStage::kNotificationDrop, FaultStage::kLateWrite,
                                         FaultStage::kCorruptBytes)),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), "_", StageName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace tandem::kvtransfer
