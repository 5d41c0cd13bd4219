// The GPU data plane's completion flags (ipc_flags.h) between two processes, on the device: a
// signal releases the other process's bounded wait; a peer that dies with its signal still
// queued behind long GPU work costs the waiter its timeout, not its stream (with an interprocess
// event the waiter's stream, and a fresh one, never moved again: bench/RESULTS.md); a failed
// status is reported. The peer is this binary run again (its child test). Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/mlp/cuda/ipc_flags.h"

namespace tandem::mlp {
namespace {

constexpr char kChildEnv[] = "TANDEM_IPC_FLAGS_CHILD";  // "slow", "fast" or "failed"

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The child: a flags buffer exported to the parent (its handle in hex on stdout), then, on its
// stream, 5 s of GPU work (a wait on a flag nobody signals) before it signals call 1 ("slow"),
// or the signal at once ("fast"), or at once with a failed status ("failed"); then it sleeps
// until killed.
TEST(IpcFlagsChild, Run) {
  const char* mode = std::getenv(kChildEnv);
  if (mode == nullptr) GTEST_SKIP() << "run by IpcFlagsCudaTest as its peer process";
  void* flags = nullptr;
  ASSERT_EQ(cudaMalloc(&flags, kIpcFlagsBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(flags, 0, kIpcFlagsBytes), cudaSuccess);
  void* local = nullptr;  // a flag nobody signals, a status word, the child's failure word
  ASSERT_EQ(cudaMalloc(&local, 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(local, 0, 64), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, flags), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto* never = static_cast<IpcFlag*>(local);
  auto* status = reinterpret_cast<uint32_t*>(static_cast<char*>(local) + 16);
  auto* failed = reinterpret_cast<uint32_t*>(static_cast<char*>(local) + 32);
  if (std::string(mode) == "slow") {
    ASSERT_TRUE(EnqueueIpcWait(never, 1, 5'000'000'000ull, failed, s).ok());
  }
  if (std::string(mode) == "failed") {
    const uint32_t bad = 7;
    ASSERT_EQ(cudaMemcpy(status, &bad, sizeof(bad), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_TRUE(EnqueueIpcSignal(&static_cast<IpcFlag*>(flags)[1], 1, status, s).ok());
  const std::string hex =
      absl::BytesToHexString(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  std::printf("HANDLE %s\n", hex.c_str());
  std::fflush(stdout);
  sleep(60);
}

struct Child {
  pid_t pid = -1;
  std::string handle;  // the raw cudaIpcMemHandle_t bytes
};

Child Spawn(const char* mode) {
  Child c;
  int out[2];
  if (pipe(out) != 0) return c;
  c.pid = fork();
  if (c.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    setenv(kChildEnv, mode, 1);
    execl("/proc/self/exe", "ipc_flags_cuda_test", "--gtest_filter=IpcFlagsChild.Run",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[512];
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (text.find('\n', text.find("HANDLE ")) == std::string::npos && absl::Now() < give_up) {
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  const size_t at = text.find("HANDLE ");
  if (at != std::string::npos) {
    const size_t end = text.find('\n', at);
    c.handle = absl::HexStringToBytes(text.substr(at + 7, end - at - 7));
  }
  return c;
}

void Kill(Child& c) {
  if (c.pid > 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    c.pid = -1;
  }
}

// Waits (polling, bounded) for `s` to finish; false when it did not within `limit`.
bool Drains(cudaStream_t s, absl::Duration limit) {
  const absl::Time give_up = absl::Now() + limit;
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return cudaStreamQuery(s) == cudaSuccess;
}

class IpcFlagsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv(kChildEnv) != nullptr) GTEST_SKIP() << "the child runs only its own test";
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    void* host = nullptr;
    ASSERT_EQ(cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped), cudaSuccess);
    host_ = host;
    failed_ = static_cast<volatile uint32_t*>(host);
    *failed_ = 0;
    void* device = nullptr;
    ASSERT_EQ(cudaHostGetDevicePointer(&device, host, 0), cudaSuccess);
    failed_device_ = static_cast<uint32_t*>(device);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  // Opens the child's flags and queues the bounded wait for its call 1.
  IpcFlag* OpenAndWait(const Child& child, absl::Duration timeout) {
    EXPECT_EQ(child.handle.size(), sizeof(cudaIpcMemHandle_t));
    if (child.handle.size() != sizeof(cudaIpcMemHandle_t)) return nullptr;
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, child.handle.data(), sizeof(handle));
    void* flags = nullptr;
    EXPECT_EQ(cudaIpcOpenMemHandle(&flags, handle, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    if (flags == nullptr) return nullptr;
    EXPECT_TRUE(EnqueueIpcWait(&static_cast<IpcFlag*>(flags)[1], 1,
                               static_cast<uint64_t>(absl::ToInt64Nanoseconds(timeout)),
                               failed_device_, stream_)
                    .ok());
    return static_cast<IpcFlag*>(flags);
  }

  void* host_ = nullptr;
  volatile uint32_t* failed_ = nullptr;  // host_, read after the stream drained
  uint32_t* failed_device_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(IpcFlagsCudaTest, ASignalReleasesTheWait) {
  Child child = Spawn("fast");
  ASSERT_FALSE(child.handle.empty()) << "the child gave no handle";
  IpcFlag* flags = OpenAndWait(child, absl::Seconds(10));
  ASSERT_NE(flags, nullptr);
  EXPECT_TRUE(Drains(stream_, absl::Seconds(5)));
  EXPECT_EQ(*failed_, 0u);
  cudaIpcCloseMemHandle(flags);
  Kill(child);
}

TEST_F(IpcFlagsCudaTest, AFailedStatusIsReported) {
  Child child = Spawn("failed");
  ASSERT_FALSE(child.handle.empty()) << "the child gave no handle";
  IpcFlag* flags = OpenAndWait(child, absl::Seconds(10));
  ASSERT_NE(flags, nullptr);
  EXPECT_TRUE(Drains(stream_, absl::Seconds(5)));
  EXPECT_EQ(*failed_, 1u);
  cudaIpcCloseMemHandle(flags);
  Kill(child);
}

// The hazard itself: the peer dies with its signal queued behind 5 s of GPU work. The wait gives
// up after its 1 s, the stream goes on, and new work on a fresh stream runs.
TEST_F(IpcFlagsCudaTest, APeerKilledBeforeItsSignalCostsTheTimeoutNotTheStream) {
  Child child = Spawn("slow");
  ASSERT_FALSE(child.handle.empty()) << "the child gave no handle";
  IpcFlag* flags = OpenAndWait(child, absl::Seconds(1));
  ASSERT_NE(flags, nullptr);
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time killed = absl::Now();
  Kill(child);
  EXPECT_TRUE(Drains(stream_, absl::Seconds(10))) << "the wait never gave up";
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3));
  EXPECT_EQ(*failed_, 1u);
  cudaStream_t fresh;
  ASSERT_EQ(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(scratch, 1, 1 << 20, fresh), cudaSuccess);
  EXPECT_TRUE(Drains(fresh, absl::Seconds(5))) << "a fresh stream did not run";
  cudaFree(scratch);
  cudaStreamDestroy(fresh);
  cudaIpcCloseMemHandle(flags);
}

}  // namespace
}  // namespace tandem::mlp
