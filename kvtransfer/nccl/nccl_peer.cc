// An nccl target agent in its own process, driven over stdin/stdout by the two-GPU test (not
// installed; spawned through cuda_ipc/peer_process.h). It allocates `--bytes` of device memory
// on `--device` (zeroed), registers and exports it, prints
//   address <agent address blob>
//   region <region blob>
// and then drives the backend's progress continuously (the target posts the receives) while
// answering one command per line:
//   accept <initiator> <reply>  -> "ok" or "error <why>"
//   notes                       -> "notes <count> <messages joined by ','>"
//   hash                        -> "hash <FNV-1a 64 of the whole region, hex>"
//   quit                        -> exits 0
// Anything else -> "error <why>". Exit status 1 when set-up fails (the reason on stderr).
#include <cuda_runtime_api.h>
#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/transfer_backend.h"

namespace {

uint64_t Fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

int Fail(const std::string& why) {
  std::cerr << "nccl_peer: " << why << "\n";
  return 1;
}

void Answer(const std::string& line) { std::cout << line << std::endl; }

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 0;
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--bytes" && absl::SimpleAtoi(argv[i + 1], &bytes)) continue;
    if (flag == "--device" && absl::SimpleAtoi(argv[i + 1], &device)) continue;
    return Fail(absl::StrCat("usage: ", argv[0], " --bytes N [--device D]"));
  }
  if (bytes == 0) return Fail("--bytes must be positive");
  if (cudaSetDevice(device) != cudaSuccess) return Fail("cudaSetDevice failed");
  void* memory = nullptr;
  if (cudaMalloc(&memory, bytes) != cudaSuccess) return Fail("cudaMalloc failed");
  if (cudaMemset(memory, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    return Fail("cudaMemset failed");
  }
  tandem::kvtransfer::BackendOptions options;
  options.agent_name = absl::StrCat("nccl-peer-", getpid());
  options.cuda_device = device;
  options.connect_timeout = absl::Seconds(30);
  options.transfer_timeout = absl::Seconds(30);
  auto backend = tandem::kvtransfer::CreateTransferBackend("nccl", options);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  auto region = (*backend)->RegisterMemory(memory, bytes, tandem::kvtransfer::MemoryKind::kCuda);
  if (!region.ok()) return Fail(std::string(region.status().message()));
  auto blob = (*backend)->ExportRegion(region->id);
  auto address = (*backend)->LocalAddress();
  if (!blob.ok() || !address.ok()) return Fail("export failed");
  Answer(absl::StrCat("address ", *address, "\nregion ", *blob));

  std::vector<std::string> notes;
  std::string pending;
  while (true) {
    for (auto& n : (*backend)->GetNotifications()) notes.push_back(n.message);
    pollfd fd{.fd = STDIN_FILENO, .events = POLLIN, .revents = 0};
    if (poll(&fd, 1, 1) > 0) {
      char chunk[4096];
      const ssize_t n = read(STDIN_FILENO, chunk, sizeof(chunk));
      if (n <= 0) break;  // the test went away
      pending.append(chunk, static_cast<size_t>(n));
    }
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      std::vector<std::string> words = absl::StrSplit(line, ' ');
      if (words[0] == "quit") return 0;
      if (words[0] == "accept" && words.size() == 3) {
        const absl::Status s = (*backend)->Accept(words[1], words[2]);
        Answer(s.ok() ? "ok" : absl::StrCat("error ", s.message()));
      } else if (words[0] == "notes") {
        Answer(absl::StrCat("notes ", notes.size(), " ", absl::StrJoin(notes, ",")));
      } else if (words[0] == "hash") {
        std::vector<unsigned char> host(bytes);
        if (cudaMemcpy(host.data(), memory, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
          Answer("error cudaMemcpy failed");
          continue;
        }
        char hex[32];
        std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(host)));
        Answer(absl::StrCat("hash ", hex));
      } else {
        Answer(absl::StrCat("error unknown command '", line, "'"));
      }
    }
  }
  return 0;
}
