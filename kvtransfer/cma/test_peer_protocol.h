#pragma once
// How kvtransfer_cma_test_peer (a cma agent in its own process, for tests and
// bench/kv_host_bench; not a product binary) talks to the process that started it.
//
//   kvtransfer_cma_test_peer <bytes> <serve|idle>
// Registers <bytes> zeroed bytes and writes {agent name, address, region blob} to stdout, each as
// a u32 length (host order) and the bytes. Then
//   serve: reads one command byte at a time from stdin: kHashCommand -> writes RegionHash of its
//          region (u64, host order) to stdout; kQuitCommand or end of input -> exits 0; nothing
//          for 20 s -> dies of SIGALRM;
//   idle:  sleeps until killed.
// Either way it dies with its parent (PR_SET_PDEATHSIG).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::kvtransfer::cma {

inline constexpr char kHashCommand = 'H';
inline constexpr char kQuitCommand = 'Q';

// A fast 64-bit hash of `n` bytes (word-wise FNV-1a style mixing; for comparing regions only).
inline uint64_t RegionHash(const uint8_t* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h ^ n;
}

}  // namespace tandem::kvtransfer::cma
