// A cuda_ipc agent in its own process, driven over stdin/stdout by the cross-process GPU test and
// by bench/kv_ipc_bench (not installed). It allocates `--bytes` of device memory (zeroed),
// registers and exports it, prints
//   address <agent address blob>
//   region <region blob>
// and then answers one command per line:
//   hash                 -> "hash <FNV-1a 64 of the whole region, hex>"
//   zero                 -> "ok" (region set to zero)
//   quit                 -> exits 0
// Anything else -> "error <why>". Exit status 1 when set-up fails (the reason on stderr).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/transfer_backend.h"

namespace {

uint64_t Fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

int Fail(const std::string& why) {
  std::cerr << "cuda_ipc_peer: " << why << "\n";
  return 1;
}

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
  if (cudaMemset(memory, 0, bytes) != cudaSuccess) return Fail("cudaMemset failed");
  tandem::kvtransfer::BackendOptions options;
  options.agent_name = absl::StrCat("cuda-ipc-peer-", getpid());
  options.cuda_device = device;
  auto backend = tandem::kvtransfer::CreateTransferBackend("cuda_ipc", options);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  auto region = (*backend)->RegisterMemory(memory, bytes, tandem::kvtransfer::MemoryKind::kCuda);
  if (!region.ok()) return Fail(std::string(region.status().message()));
  auto blob = (*backend)->ExportRegion(region->id);
  auto address = (*backend)->LocalAddress();
  if (!blob.ok() || !address.ok()) return Fail("export failed");
  std::cout << "address " << *address << "\nregion " << *blob << std::endl;

  std::string line;
  std::vector<unsigned char> host;
  while (std::getline(std::cin, line)) {
    if (line == "quit") break;
    if (line == "hash") {
      host.resize(bytes);
      if (cudaMemcpy(host.data(), memory, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        std::cout << "error cudaMemcpy failed" << std::endl;
        continue;
      }
      std::printf("hash %016llx\n", static_cast<unsigned long long>(Fnv1a(host)));
      std::fflush(stdout);
    } else if (line == "zero") {
      const bool ok =
          cudaMemset(memory, 0, bytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
      std::cout << (ok ? "ok" : "error cudaMemset failed") << std::endl;
    } else {
      std::cout << "error unknown command '" << line << "'" << std::endl;
    }
  }
  return 0;
}
