// cma between processes: child agents (kvtransfer_cma_test_peer, fork+exec'd, "serve" mode)
// register memory and send their address and region blob through a pipe; this process writes
// into them and asks for a hash of their region to check where the bytes landed. Also forged
// addresses, ops outside the region, a peer killed mid-run and Release of a running transfer.
// Every wait has a deadline, so a bug fails the test instead of hanging it.
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/cma/cma_wire.h"
#include "kvtransfer/cma/test_peer_protocol.h"
#include "kvtransfer/testing/framed_pipe.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

// Whether this machine lets a process read a child's memory (process_vm_readv needs ptrace
// permission: a seccomp profile or Yama can forbid it). Where it cannot, cma cannot work at all
// and its cross-process tests are skipped, saying why (the pair handshake then falls back).
bool CrossMemoryAttachPermitted() {
  static const bool permitted = [] {
    volatile uint64_t probe = 0x5a5a5a5a5a5a5a5aull;
    const pid_t child = fork();
    if (child == 0) {
      pause();
      _exit(0);
    }
    if (child < 0) return false;
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{const_cast<uint64_t*>(&probe), sizeof(probe)};
    const ssize_t n = process_vm_readv(child, &local, 1, &remote, 1, 0);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return n == static_cast<ssize_t>(sizeof(got)) && got == probe;
  }();
  return permitted;
}

#define SKIP_WITHOUT_CMA()                                                             \
  if (!CrossMemoryAttachPermitted())                                                   \
  GTEST_SKIP() << "process_vm_readv on a child process is not permitted here (ptrace " \
                  "restrictions), so the cma backend cannot work on this machine"

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(10);
constexpr size_t kBlock = 32 << 10;
constexpr size_t kBlocks = 8192;  // 256 MiB in all

// A child agent with pipes to its stdin/stdout. Killed and reaped on destruction.
class PeerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(size_t bytes) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return absl::InternalError("pipe failed");
    const std::string bytes_arg = std::to_string(bytes);
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      execl(KVT_CMA_TEST_PEER, KVT_CMA_TEST_PEER, bytes_arg.c_str(), "serve",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    auto peer = std::unique_ptr<PeerProcess>(new PeerProcess(pid, to_child[1], from_child[0]));
    ASSIGN_OR_RETURN(peer->name_, peer->ReadField());
    ASSIGN_OR_RETURN(peer->address_, peer->ReadField());
    ASSIGN_OR_RETURN(peer->region_, peer->ReadField());
    return peer;
  }

  ~PeerProcess() {
    if (pid_ > 0) KillAndReap();
    close(in_);
    close(out_);
  }

  const std::string& name() const { return name_; }
  const std::string& address() const { return address_; }
  const std::string& region() const { return region_; }
  pid_t pid() const { return pid_; }

  // The hash of the child's whole region (test_peer_protocol.h).
  absl::StatusOr<uint64_t> Hash() {
    if (write(in_, &cma::kHashCommand, 1) != 1) return absl::UnavailableError("child is gone");
    uint64_t hash = 0;
    RETURN_IF_ERROR(ReadExact(&hash, sizeof(hash)));
    return hash;
  }

  void KillAndReap() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  PeerProcess(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out) {}

  absl::Status ReadExact(void* data, size_t n) {
    return testing::ReadExact(out_, data, n, absl::Now() + kDeadline);
  }
  absl::StatusOr<std::string> ReadField() {
    return testing::ReadField(out_, absl::Now() + kDeadline);
  }

  pid_t pid_;
  int in_, out_;
  std::string name_, address_, region_;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(bytes.data() + i, &r, 8);
  }
  return bytes;
}

// kBlocks blocks of kBlock bytes: source block order[i] into destination block perm(i), posted
// in shuffled order.
std::vector<CopyOp> ShuffledBlocks(uint32_t seed) {
  std::vector<size_t> src(kBlocks), dst(kBlocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<CopyOp> ops;
  for (size_t i = 0; i < kBlocks; ++i) {
    ops.push_back(
        {.local_offset = src[i] * kBlock, .remote_offset = dst[i] * kBlock, .length = kBlock});
  }
  return ops;
}

// What a zeroed destination of `bytes` holds after `ops` moved `src` into it.
uint64_t ExpectedHash(const std::vector<uint8_t>& src, const std::vector<CopyOp>& ops,
                      size_t bytes) {
  std::vector<uint8_t> dst(bytes, 0);
  for (const CopyOp& op : ops) {
    std::memcpy(dst.data() + op.remote_offset, src.data() + op.local_offset, op.length);
  }
  return cma::RegionHash(dst.data(), dst.size());
}

std::unique_ptr<TransferBackend> MakeBackend(int threads = 2) {
  BackendOptions options;
  options.agent_name = absl::StrCat("parent-", getpid());
  options.cma_threads = threads;
  auto backend = CreateTransferBackend("cma", options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

absl::StatusOr<TransferState> PollToEnd(TransferBackend& backend, TransferHandle handle) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (absl::Now() < deadline) {
    ASSIGN_OR_RETURN(TransferState state, backend.Poll(handle));
    if (state != TransferState::kInProgress) return state;
  }
  return absl::DeadlineExceededError("transfer neither finished nor failed in time");
}

absl::StatusOr<TransferState> WriteAndWait(TransferBackend& backend, uint64_t region,
                                           PeerProcess& peer, std::vector<CopyOp> ops) {
  ASSIGN_OR_RETURN(TransferHandle h, backend.PostWrite({.local_region = region,
                                                        .peer = peer.name(),
                                                        .remote_region = peer.region(),
                                                        .ops = std::move(ops),
                                                        .notification = ""}));
  absl::StatusOr<TransferState> state = PollToEnd(backend, h);
  RETURN_IF_ERROR(backend.Release(h));
  return state;
}

TEST(CmaBackendTest, CapabilitiesAndHostMemoryOnly) {
  auto backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cma");
  EXPECT_TRUE(backend->capabilities().host_memory);
  EXPECT_TRUE(backend->capabilities().cross_process);
  EXPECT_FALSE(backend->capabilities().cuda_memory);
  EXPECT_FALSE(backend->capabilities().notifications);
  EXPECT_TRUE(backend->capabilities().read);
  int x = 0;
  auto cuda = backend->RegisterMemory(&x, sizeof(x), MemoryKind::kCuda);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cuda.status().message(), HasSubstr("host memory"));
  BackendOptions options;
  options.cma_threads = 0;
  EXPECT_EQ(CreateTransferBackend("cma", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// 256 MiB of random bytes as 8,192 shuffled 32 KiB blocks, then as one op, then as 20,000 small
// scattered ops, with 1, 2 and 4 copy threads; the child's region must hash to exactly what the
// ops describe.
TEST(CmaCrossProcessTest, BytesLandExactly) {
  SKIP_WITHOUT_CMA();
  const size_t bytes = kBlock * kBlocks;
  auto peer = PeerProcess::Start(bytes);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const std::vector<uint8_t> src = RandomBytes(bytes, 7);
  const std::vector<CopyOp> scattered = ShuffledBlocks(3);
  const uint64_t scattered_hash = ExpectedHash(src, scattered, bytes);
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    auto backend = MakeBackend(threads);
    ASSERT_NE(backend, nullptr);
    auto region =
        backend->RegisterMemory(const_cast<uint8_t*>(src.data()), bytes, MemoryKind::kHost);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
    // Connect is idempotent for the same address.
    ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
    // Zero the child's region first (a source of zeros of its size), so each round starts clean.
    std::vector<uint8_t> zeros(bytes, 0);
    auto zero_region = backend->RegisterMemory(zeros.data(), bytes, MemoryKind::kHost);
    ASSERT_TRUE(zero_region.ok());
    auto zeroed = WriteAndWait(*backend, zero_region->id, **peer,
                               {{.local_offset = 0, .remote_offset = 0, .length = bytes}});
    ASSERT_TRUE(zeroed.ok()) << zeroed.status();
    ASSERT_EQ(*zeroed, TransferState::kDone);

    auto state = WriteAndWait(*backend, region->id, **peer, scattered);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    auto hash = (*peer)->Hash();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, scattered_hash);

    // One big op, at an odd offset and length, over what the blocks wrote.
    const std::vector<CopyOp> big = {
        {.local_offset = 13, .remote_offset = 4099, .length = bytes - 8191}};
    std::vector<uint8_t> expected(bytes, 0);
    for (const CopyOp& op : scattered) {
      std::memcpy(expected.data() + op.remote_offset, src.data() + op.local_offset, op.length);
    }
    std::memcpy(expected.data() + 4099, src.data() + 13, bytes - 8191);
    state = WriteAndWait(*backend, region->id, **peer, big);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    hash = (*peer)->Hash();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, cma::RegionHash(expected.data(), expected.size()));

    // 20,000 small ops that touch neither side's neighbour: every call is IOV_MAX iovecs a side.
    std::vector<CopyOp> gapped;
    for (size_t i = 0; i < 20000; ++i) {
      gapped.push_back({.local_offset = ((i * 7919) % 20000) * 8192 + 5,
                        .remote_offset = i * 8192 + 100,
                        .length = 3000});
    }
    for (const CopyOp& op : gapped) {
      std::memcpy(expected.data() + op.remote_offset, src.data() + op.local_offset, op.length);
    }
    state = WriteAndWait(*backend, region->id, **peer, gapped);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    hash = (*peer)->Hash();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, cma::RegionHash(expected.data(), expected.size()));

    // No ops: done at once.
    state = WriteAndWait(*backend, region->id, **peer, {});
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    EXPECT_TRUE(backend->Disconnect((*peer)->name()).ok());
    EXPECT_TRUE(backend->DeregisterMemory(region->id).ok());
    EXPECT_TRUE(backend->DeregisterMemory(zero_region->id).ok());
  }
}

TEST(CmaCrossProcessTest, OpsOutsideTheRegionsAreRejectedAndWriteNothing) {
  SKIP_WITHOUT_CMA();
  const size_t bytes = 1 << 20;
  auto peer = PeerProcess::Start(bytes);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<uint8_t> src(2 * bytes, 0xab);
  auto region = backend->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
  const std::vector<std::vector<CopyOp>> bad = {
      {{.local_offset = 0, .remote_offset = 1, .length = bytes}},      // one past the end
      {{.local_offset = 0, .remote_offset = 0, .length = bytes + 1}},  // longer than it
      {{.local_offset = 0, .remote_offset = SIZE_MAX, .length = 2}},   // wraps
      {{.local_offset = 0, .remote_offset = 0, .length = 8},
       {.local_offset = 0, .remote_offset = bytes - 4, .length = 8}},  // the last op straddles
      {{.local_offset = 2 * bytes, .remote_offset = 0, .length = 1}},  // outside the source
  };
  for (const std::vector<CopyOp>& ops : bad) {
    auto h = backend->PostWrite({.local_region = region->id,
                                 .peer = (*peer)->name(),
                                 .remote_region = (*peer)->region(),
                                 .ops = ops,
                                 .notification = ""});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
  }
  // A mangled region blob is refused.
  auto mangled = backend->PostWrite({.local_region = region->id,
                                     .peer = (*peer)->name(),
                                     .remote_region = (*peer)->region().substr(1),
                                     .ops = {{.local_offset = 0, .remote_offset = 0, .length = 8}},
                                     .notification = ""});
  EXPECT_EQ(mangled.status().code(), absl::StatusCode::kInvalidArgument);
  auto notify = backend->PostWrite({.local_region = region->id,
                                    .peer = (*peer)->name(),
                                    .remote_region = (*peer)->region(),
                                    .ops = {{.local_offset = 0, .remote_offset = 0, .length = 8}},
                                    .notification = "done"});
  EXPECT_EQ(notify.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend
                ->PostWrite({.local_region = region->id + 100,
                             .peer = (*peer)->name(),
                             .remote_region = (*peer)->region(),
                             .ops = {},
                             .notification = ""})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  std::vector<uint8_t> zeros(bytes, 0);
  auto hash = (*peer)->Hash();
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, cma::RegionHash(zeros.data(), zeros.size())) << "a rejected post wrote";
}

// PostRead: the peer's region (written first) read back into a local buffer by scattered ops,
// with 1 and 2 copy threads; only the ops' local ranges change, the peer's region is left as it
// was, and reads outside the peer's region are refused before anything moves.
TEST(CmaCrossProcessTest, ReadsThePeersRegionBack) {
  SKIP_WITHOUT_CMA();
  const size_t bytes = 4 << 20;
  auto peer = PeerProcess::Start(bytes);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const std::vector<uint8_t> src = RandomBytes(bytes, 11);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    auto backend = MakeBackend(threads);
    ASSERT_NE(backend, nullptr);
    auto source =
        backend->RegisterMemory(const_cast<uint8_t*>(src.data()), bytes, MemoryKind::kHost);
    ASSERT_TRUE(source.ok()) << source.status();
    ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
    auto written = WriteAndWait(*backend, source->id, **peer,
                                {{.local_offset = 0, .remote_offset = 0, .length = bytes}});
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_EQ(*written, TransferState::kDone);

    std::vector<uint8_t> back(bytes, 0);
    auto sink = backend->RegisterMemory(back.data(), bytes, MemoryKind::kHost);
    ASSERT_TRUE(sink.ok());
    // Blocks of 1 MiB + 3 from odd places, and many small ones (IOV_MAX iovecs a call).
    std::vector<CopyOp> ops = {
        {.local_offset = 7, .remote_offset = (1 << 20) + 5, .length = (1 << 20) + 3}};
    for (size_t i = 0; i < 3000; ++i) {
      ops.push_back({.local_offset = (2 << 20) + i * 512,
                     .remote_offset = ((i * 7919) % 8000) * 256,
                     .length = 200});
    }
    std::vector<uint8_t> expected(bytes, 0);
    for (const CopyOp& op : ops) {
      std::memcpy(expected.data() + op.local_offset, src.data() + op.remote_offset, op.length);
    }
    auto h = backend->PostRead({.local_region = sink->id,
                                .peer = (*peer)->name(),
                                .remote_region = (*peer)->region(),
                                .ops = ops,
                                .notification = ""});
    ASSERT_TRUE(h.ok()) << h.status();
    auto state = PollToEnd(*backend, *h);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, TransferState::kDone);
    EXPECT_TRUE(backend->Release(*h).ok());
    EXPECT_TRUE(back == expected) << "the read bytes differ from the peer's";
    auto hash = (*peer)->Hash();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, cma::RegionHash(src.data(), src.size())) << "a read changed the peer";

    auto outside =
        backend->PostRead({.local_region = sink->id,
                           .peer = (*peer)->name(),
                           .remote_region = (*peer)->region(),
                           .ops = {{.local_offset = 0, .remote_offset = bytes - 4, .length = 8}},
                           .notification = ""});
    EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument) << outside.status();
    EXPECT_TRUE(backend->DeregisterMemory(sink->id).ok());
    EXPECT_TRUE(backend->DeregisterMemory(source->id).ok());
    EXPECT_TRUE(backend->Disconnect((*peer)->name()).ok());
  }
}

// Forged addresses: the pid of another process (with its start time or not), another nonce,
// another boot id, a pid that no longer runs. Each is refused at Connect, and the backend still
// connects to the real peer afterwards.
TEST(CmaCrossProcessTest, ForgedAddressesAreRefusedAtConnect) {
  SKIP_WITHOUT_CMA();
  auto peer = PeerProcess::Start(1 << 20);
  auto other = PeerProcess::Start(1 << 20);
  ASSERT_TRUE(peer.ok() && other.ok());
  auto backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  auto real = cma::DecodeAgentAddress((*peer)->address());
  auto stranger = cma::DecodeAgentAddress((*other)->address());
  ASSERT_TRUE(real.ok() && stranger.ok());

  auto refused = [&](cma::AgentAddress forged, absl::StatusCode code, std::string_view says) {
    absl::Status s = backend->Connect((*peer)->name(), cma::EncodeAgentAddress(forged));
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(std::string(says)));
  };
  cma::AgentAddress a = *real;
  a.pid = stranger->pid;  // another process, the peer's start time
  if (a.start_time != stranger->start_time) {
    refused(a, absl::StatusCode::kFailedPrecondition, "started at");
  }
  a.start_time = stranger->start_time;  // another process, its own start time: the nonce decides
  refused(a, absl::StatusCode::kFailedPrecondition, "not the peer");
  a = *real;
  a.nonce[5] ^= 1;
  refused(a, absl::StatusCode::kFailedPrecondition, "identity nonce");
  a = *real;
  a.nonce_address += 1 << 30;  // most likely unmapped there
  refused(a, absl::StatusCode::kFailedPrecondition, "not the peer");
  a = *real;
  a.boot_id[0] = a.boot_id[0] == '0' ? '1' : '0';
  refused(a, absl::StatusCode::kFailedPrecondition, "cma needs both processes on one host");
  a = *stranger;
  (*other)->KillAndReap();
  refused(a, absl::StatusCode::kUnavailable, "shared pid namespace");
  EXPECT_EQ(backend->Connect((*peer)->name(), (*peer)->address().substr(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
}

// The peer is killed while a transfer runs: that transfer ends (either way) without a hang, every
// later one to it fails with kFailed, and the backend still writes to a new peer.
TEST(CmaCrossProcessTest, PeerKilledMidRunFailsLaterTransfers) {
  SKIP_WITHOUT_CMA();
  const size_t bytes = kBlock * kBlocks;
  auto peer = PeerProcess::Start(bytes);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  const std::vector<uint8_t> src = RandomBytes(bytes, 9);
  auto region = backend->RegisterMemory(const_cast<uint8_t*>(src.data()), bytes, MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
  const std::vector<CopyOp> ops = ShuffledBlocks(4);
  auto h = backend->PostWrite({.local_region = region->id,
                               .peer = (*peer)->name(),
                               .remote_region = (*peer)->region(),
                               .ops = ops,
                               .notification = ""});
  ASSERT_TRUE(h.ok()) << h.status();
  (*peer)->KillAndReap();
  const absl::Time start = absl::Now();
  auto state = PollToEnd(*backend, *h);
  ASSERT_TRUE(state.ok()) << state.status();  // never a hang
  EXPECT_LT(absl::Now() - start, kDeadline);
  EXPECT_TRUE(backend->Release(*h).ok());
  for (int i = 0; i < 3; ++i) {
    auto later = WriteAndWait(*backend, region->id, **peer, ops);
    ASSERT_TRUE(later.ok()) << later.status();
    EXPECT_EQ(*later, TransferState::kFailed);
  }
  EXPECT_TRUE(backend->Disconnect((*peer)->name()).ok());

  auto fresh = PeerProcess::Start(bytes);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE(backend->Connect((*fresh)->name(), (*fresh)->address()).ok());
  auto again = WriteAndWait(*backend, region->id, **fresh, ops);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, TransferState::kDone);
  auto hash = (*fresh)->Hash();
  ASSERT_TRUE(hash.ok());
  EXPECT_EQ(*hash, ExpectedHash(src, ops, bytes));
  EXPECT_TRUE(backend->DeregisterMemory(region->id).ok());
}

// Release of a running transfer waits for its copies (nothing lingers), and the backend, its
// region and its peer stay usable.
TEST(CmaCrossProcessTest, ReleaseOfARunningTransferWaitsAndLeavesTheBackendUsable) {
  SKIP_WITHOUT_CMA();
  const size_t bytes = kBlock * kBlocks;
  auto peer = PeerProcess::Start(bytes);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  const std::vector<uint8_t> src = RandomBytes(bytes, 11);
  auto region = backend->RegisterMemory(const_cast<uint8_t*>(src.data()), bytes, MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
  const std::vector<CopyOp> one = {{.local_offset = 0, .remote_offset = 0, .length = bytes}};
  for (int i = 0; i < 5; ++i) {
    auto h = backend->PostWrite({.local_region = region->id,
                                 .peer = (*peer)->name(),
                                 .remote_region = (*peer)->region(),
                                 .ops = one,
                                 .notification = ""});
    ASSERT_TRUE(h.ok()) << h.status();
    // While it runs, its region cannot go and its peer cannot be dropped.
    EXPECT_EQ(backend->DeregisterMemory(region->id).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(backend->Disconnect((*peer)->name()).code(), absl::StatusCode::kFailedPrecondition);
    const absl::Time start = absl::Now();
    EXPECT_TRUE(backend->Release(*h).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    EXPECT_FALSE(backend->Lingering(*h));
    EXPECT_EQ(backend->Poll(*h).status().code(), absl::StatusCode::kNotFound);
  }
  // Rewrite everything: the released transfers left nothing behind that could land later.
  const std::vector<CopyOp> scattered = ShuffledBlocks(5);
  auto state = WriteAndWait(*backend, region->id, **peer, scattered);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  auto hash = (*peer)->Hash();
  ASSERT_TRUE(hash.ok());
  EXPECT_EQ(*hash, ExpectedHash(src, scattered, bytes));
  EXPECT_TRUE(backend->Disconnect((*peer)->name()).ok());
  EXPECT_TRUE(backend->DeregisterMemory(region->id).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
