// doorbell_bench: the host cost of one MLP call on the GPU data plane (runtime/mlp/ipc_doorbell.h):
// a client rings the doorbell and waits for the answer of a shard thread that waits for calls and
// answers at once, over two mappings of one shared page. Prints the round trip's percentiles.
//
//   doorbell_bench [--calls 200000] [--gap-us 0]
//
// --gap-us sleeps that long between calls, so the shard has gone from spinning to the futex (the
// case of a GPU layer longer than the spin).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "runtime/mlp/ipc_doorbell.h"

int main(int argc, char** argv) {
  int calls = 200000;
  int gap_us = 0;
  CLI::App app("Round trips through the MLP shard's doorbell page");
  app.add_option("--calls", calls, "Calls to time")->check(CLI::Range(1, 100000000));
  app.add_option("--gap-us", gap_us, "Microseconds between calls")->check(CLI::Range(0, 1000000));
  CLI11_PARSE(app, argc, argv);
  auto shard = tandem::mlp::IpcDoorbell::Create();
  if (!shard.ok()) {
    std::fprintf(stderr, "doorbell_bench: %s\n", std::string(shard.status().message()).c_str());
    return 1;
  }
  auto client = tandem::mlp::IpcDoorbell::Open(shard->name());
  if (!client.ok()) {
    std::fprintf(stderr, "doorbell_bench: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  std::thread server([&] {
    for (int i = 0; i < calls; ++i) {
      auto r = shard->WaitRequest(absl::Now() + absl::Seconds(10));
      if (!r.ok()) return;
      shard->Finish(r->seq, 0);
    }
  });
  std::vector<double> us(static_cast<size_t>(calls));
  for (int i = 0; i < calls; ++i) {
    if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    const auto t0 = std::chrono::steady_clock::now();
    const uint32_t seq = client->Ring(i % 32, 0, 64);
    auto code = client->WaitDone(seq, absl::Now() + absl::Seconds(10));
    const auto t1 = std::chrono::steady_clock::now();
    if (!code.ok()) {
      std::fprintf(stderr, "doorbell_bench: call %d: %s\n", i,
                   std::string(code.status().message()).c_str());
      server.join();
      return 1;
    }
    us[static_cast<size_t>(i)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  server.join();
  std::sort(us.begin(), us.end());
  const auto pct = [&](double p) { return us[static_cast<size_t>(p * (us.size() - 1))]; };
  std::printf("calls %d, gap %d us: round trip p50 %.2f us, p90 %.2f, p99 %.2f, max %.2f\n", calls,
              gap_us, pct(0.5), pct(0.9), pct(0.99), us.back());
  return 0;
}
