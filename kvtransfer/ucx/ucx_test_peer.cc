// A UCX transfer agent in its own process, for kvtransfer's cross-process tests (not a product
// binary). Usage: kvtransfer_ucx_test_peer <transports> <bytes> <seed> <verify|idle>
// Registers <bytes> zeroed bytes, writes {agent name, worker address, region blob} to stdout (each
// as u32 length + bytes), then
//   verify: waits (progressing) for one notification, checks that the region holds the bytes of
//           std::mt19937(seed) (the parent's pattern), writes 'Y' or 'N' and exits 0 / 1;
//   idle:   progresses until killed.
// Every wait is bounded: exits 2 if nothing arrives within 20 s.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "kvtransfer/testing/framed_pipe.h"
#include "kvtransfer/transfer_backend.h"

namespace {

bool WriteAll(const void* data, size_t n) {
  return tandem::kvtransfer::testing::WriteAll(STDOUT_FILENO, data, n);
}

bool WriteField(const std::string& field) {
  return tandem::kvtransfer::testing::WriteField(STDOUT_FILENO, field);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::kvtransfer;
  if (argc != 5) return 64;
  size_t bytes = 0;
  uint32_t seed = 0;
  if (!absl::SimpleAtoi(argv[2], &bytes) || !absl::SimpleAtoi(argv[3], &seed)) return 64;
  const std::string mode = argv[4];
  BackendOptions options;
  options.agent_name = "peer-" + std::to_string(getpid());
  options.ucx_transports = argv[1];
  auto backend = CreateTransferBackend("ucx", options);
  if (!backend.ok()) return 10;
  std::vector<uint8_t> memory(bytes, 0);
  auto region = (*backend)->RegisterMemory(memory.data(), memory.size(), MemoryKind::kHost);
  if (!region.ok()) return 11;
  auto blob = (*backend)->ExportRegion(region->id);
  auto address = (*backend)->LocalAddress();
  if (!blob.ok() || !address.ok()) return 12;
  if (!WriteField(options.agent_name) || !WriteField(*address) || !WriteField(*blob)) return 13;

  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::vector<Notification> notifications = (*backend)->GetNotifications();
    if (mode == "verify" && !notifications.empty()) {
      std::mt19937 rng(seed);
      bool same = true;
      for (uint8_t b : memory) same = same && b == static_cast<uint8_t>(rng());
      const char verdict = same ? 'Y' : 'N';
      WriteAll(&verdict, 1);
      return same ? 0 : 1;
    }
  }
  return 2;
}
