// UCX between processes: a child agent (kvtransfer_ucx_test_peer, fork+exec'd) registers memory
// and sends its address and region blob through a pipe; this process writes into it. Also dead
// peers: killed before Connect and killed mid-transfer. Every wait has a deadline, so a bug fails
// the test instead of hanging it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/testing/framed_pipe.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(10);

// A child agent process with pipes to its stdin/stdout. Killed and reaped on destruction.
class PeerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(const std::string& transports,
                                                            size_t bytes, uint32_t seed,
                                                            const std::string& mode) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return absl::InternalError("pipe failed");
    const std::string bytes_arg = std::to_string(bytes), seed_arg = std::to_string(seed);
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      execl(KVT_UCX_TEST_PEER, KVT_UCX_TEST_PEER, transports.c_str(), bytes_arg.c_str(),
            seed_arg.c_str(), mode.c_str(), static_cast<char*>(nullptr));
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
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(in_);
    close(out_);
  }

  const std::string& name() const { return name_; }
  const std::string& address() const { return address_; }
  const std::string& region() const { return region_; }

  absl::StatusOr<char> ReadVerdict() {
    char c = 0;
    RETURN_IF_ERROR(ReadExact(&c, 1));
    return c;
  }

  void Signal(int sig) { kill(pid_, sig); }

  // Exit status (or 128+signal) once the child ended, DeadlineExceeded if it did not in time.
  absl::StatusOr<int> Wait() {
    const absl::Time deadline = absl::Now() + kDeadline;
    while (absl::Now() < deadline) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::DeadlineExceededError("child did not exit");
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

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// The whole region in `chunk`-sized ops, posted in shuffled order.
std::vector<CopyOp> ShuffledChunks(size_t bytes, size_t chunk) {
  std::vector<CopyOp> ops;
  for (size_t off = 0; off < bytes; off += chunk) {
    ops.push_back(
        {.local_offset = off, .remote_offset = off, .length = std::min(chunk, bytes - off)});
  }
  std::shuffle(ops.begin(), ops.end(), std::mt19937(1));
  return ops;
}

std::unique_ptr<TransferBackend> MakeBackend(const std::string& transports) {
  BackendOptions options;
  options.agent_name = absl::StrCat("parent-", getpid());
  options.ucx_transports = transports;
  options.connect_timeout = absl::Seconds(3);
  auto backend = CreateTransferBackend("ucx", options);
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

// Writes the pattern into a fresh "verify" child and checks its verdict and exit code.
void WriteToChild(TransferBackend& backend, const std::string& transports, uint32_t seed) {
  const size_t bytes = 3 << 20;
  auto peer = PeerProcess::Start(transports, bytes, seed, "verify");
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<uint8_t> src = Pattern(bytes, seed);
  auto region = backend.RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_TRUE(backend.Connect((*peer)->name(), (*peer)->address()).ok());
  auto handle = backend.PostWrite({.local_region = region->id,
                                   .peer = (*peer)->name(),
                                   .remote_region = (*peer)->region(),
                                   .ops = ShuffledChunks(bytes, 40000),
                                   .notification = "written"});
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto state = PollToEnd(backend, *handle);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, TransferState::kDone);
  EXPECT_TRUE(backend.Release(*handle).ok());
  absl::StatusOr<char> verdict = (*peer)->ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, 'Y');
  auto exit_code = (*peer)->Wait();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  EXPECT_TRUE(backend.Disconnect((*peer)->name()).ok());
  EXPECT_TRUE(backend.DeregisterMemory(region->id).ok());
}

class UcxCrossProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxCrossProcessTest, ChildSeesWrittenBytesAfterNotification) {
  auto backend = MakeBackend(GetParam());
  ASSERT_NE(backend, nullptr);
  WriteToChild(*backend, GetParam(), 21);
  // The same backend serves a second peer process.
  WriteToChild(*backend, GetParam(), 22);
}

TEST_P(UcxCrossProcessTest, PeerDeadBeforeConnectFailsWithinDeadline) {
  auto backend = MakeBackend(GetParam());
  ASSERT_NE(backend, nullptr);
  auto peer = PeerProcess::Start(GetParam(), 1 << 20, 1, "idle");
  ASSERT_TRUE(peer.ok()) << peer.status();
  (*peer)->KillAndReap();
  std::vector<uint8_t> src(1 << 20, 7);
  auto region = backend->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  const absl::Time start = absl::Now();
  absl::Status connected = backend->Connect((*peer)->name(), (*peer)->address());
  bool failed = !connected.ok();
  if (!failed) {
    // Some transports connect lazily: then the first transfer must fail, not hang.
    auto handle =
        backend->PostWrite({.local_region = region->id,
                            .peer = (*peer)->name(),
                            .remote_region = (*peer)->region(),
                            .ops = {{.local_offset = 0, .remote_offset = 0, .length = src.size()}},
                            .notification = "x"});
    if (!handle.ok()) {
      failed = true;
    } else {
      auto state = PollToEnd(*backend, *handle);
      ASSERT_TRUE(state.ok()) << state.status();
      failed = *state == TransferState::kFailed;
      EXPECT_TRUE(backend->Release(*handle).ok());
    }
  }
  EXPECT_TRUE(failed) << "writing to a dead process reported success";
  EXPECT_LT(absl::Now() - start, kDeadline);
  // Nothing leaks and the backend still works with a live peer.
  backend->Disconnect((*peer)->name()).IgnoreError();
  EXPECT_TRUE(backend->DeregisterMemory(region->id).ok());
  WriteToChild(*backend, GetParam(), 23);
}

TEST_P(UcxCrossProcessTest, PeerKilledMidTransferFailsWithinDeadline) {
  auto backend = MakeBackend(GetParam());
  ASSERT_NE(backend, nullptr);
  const size_t bytes = 64 << 20;
  auto peer = PeerProcess::Start(GetParam(), bytes, 1, "idle");
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<uint8_t> src(bytes, 9);
  auto region = backend->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(backend->Connect((*peer)->name(), (*peer)->address()).ok());
  // Freeze the child so the transfer cannot finish (tcp needs target-side progress), then kill.
  (*peer)->Signal(SIGSTOP);
  auto handle = backend->PostWrite({.local_region = region->id,
                                    .peer = (*peer)->name(),
                                    .remote_region = (*peer)->region(),
                                    .ops = ShuffledChunks(bytes, 1 << 20),
                                    .notification = "x"});
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(backend->Poll(*handle).ok());
  (*peer)->KillAndReap();
  const absl::Time start = absl::Now();
  auto state = PollToEnd(*backend, *handle);
  ASSERT_TRUE(state.ok()) << state.status();  // never a hang
  if (GetParam() == "tcp,self") {
    EXPECT_EQ(*state, TransferState::kFailed);
  }
  EXPECT_LT(absl::Now() - start, kDeadline);
  EXPECT_TRUE(backend->Release(*handle).ok());
  // A new post to the dead peer fails at once.
  auto again = backend->PostWrite({.local_region = region->id,
                                   .peer = (*peer)->name(),
                                   .remote_region = (*peer)->region(),
                                   .ops = {{.local_offset = 0, .remote_offset = 0, .length = 8}},
                                   .notification = ""});
  if (again.ok()) {
    auto s = PollToEnd(*backend, *again);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(backend->Release(*again).ok());
  }
  backend->Disconnect((*peer)->name()).IgnoreError();
  absl::Status dereg = backend->DeregisterMemory(region->id);
  EXPECT_TRUE(dereg.ok()) << dereg;
  WriteToChild(*backend, GetParam(), 24);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxCrossProcessTest,
                         ::testing::Values("tcp,self", "tcp,sm,self"), [](const auto& info) {
                           return info.param == "tcp,self" ? std::string("tcp")
                                                           : std::string("tcp_sm");
                         });

}  // namespace
}  // namespace tandem::kvtransfer
