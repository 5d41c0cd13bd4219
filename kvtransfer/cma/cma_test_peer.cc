// A cma transfer agent in its own process (kvtransfer/cma/test_peer_protocol.h says how it is
// driven). Exit status: 0 done, 64 usage, 10-13 set-up failures (SIGALRM: no command in 20 s).
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "kvtransfer/cma/test_peer_protocol.h"
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
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc != 3) return 64;
  size_t bytes = 0;
  if (!absl::SimpleAtoi(argv[1], &bytes) || bytes == 0) return 64;
  const std::string mode = argv[2];
  if (mode != "serve" && mode != "idle") return 64;
  BackendOptions options;
  options.agent_name = "cma-peer-" + std::to_string(getpid());
  auto backend = CreateTransferBackend("cma", options);
  if (!backend.ok()) return 10;
  std::vector<uint8_t> memory(bytes, 0);
  auto region = (*backend)->RegisterMemory(memory.data(), memory.size(), MemoryKind::kHost);
  if (!region.ok()) return 11;
  auto blob = (*backend)->ExportRegion(region->id);
  auto address = (*backend)->LocalAddress();
  if (!blob.ok() || !address.ok()) return 12;
  if (!WriteField(options.agent_name) || !WriteField(*address) || !WriteField(*blob)) return 13;
  if (mode == "idle") {
    while (true) pause();
  }
  while (true) {
    alarm(20);  // bounded: SIGALRM's default action ends the process
    char command = 0;
    const ssize_t r = read(STDIN_FILENO, &command, 1);
    alarm(0);
    if (r <= 0 || command == cma::kQuitCommand) return 0;
    if (command == cma::kHashCommand) {
      const uint64_t hash = cma::RegionHash(memory.data(), memory.size());
      if (!WriteAll(&hash, sizeof(hash))) return 13;
    }
  }
}
