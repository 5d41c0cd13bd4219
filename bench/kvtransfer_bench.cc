// UCX put bandwidth and latency between two workers in this process (tcp vs tcp+shared memory).
// One iteration = PostWrite of one block (one CopyOp) + Poll until kDone (remote completion),
// the target progressed by the same thread. Run: build/bench/kvtransfer_bench
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {
namespace {

const char* const kTransports[] = {"tcp,self", "tcp,sm,self"};

struct Pair {
  std::unique_ptr<TransferBackend> initiator, target;
  std::vector<uint8_t> src, dst;
  MemoryRegion src_region;
  std::string blob;
};

// Two connected agents with `bytes` registered on each side; nullptr (and an error) on failure.
std::unique_ptr<Pair> MakePair(const std::string& transports, size_t bytes,
                               benchmark::State& state) {
  static std::atomic<int> counter{0};
  auto pair = std::make_unique<Pair>();
  BackendOptions options;
  options.ucx_transports = transports;
  options.agent_name = absl::StrCat("bench-init-", counter.fetch_add(1));
  auto initiator = CreateTransferBackend("ucx", options);
  options.agent_name = absl::StrCat("bench-target-", counter.fetch_add(1));
  auto target = CreateTransferBackend("ucx", options);
  if (!initiator.ok() || !target.ok()) {
    state.SkipWithError("cannot create UCX agents");
    return nullptr;
  }
  pair->initiator = std::move(initiator).value();
  pair->target = std::move(target).value();
  pair->src.assign(bytes, 0x5a);
  pair->dst.assign(bytes, 0);
  auto src_region = pair->initiator->RegisterMemory(pair->src.data(), bytes, MemoryKind::kHost);
  auto dst_region = pair->target->RegisterMemory(pair->dst.data(), bytes, MemoryKind::kHost);
  if (!src_region.ok() || !dst_region.ok()) {
    state.SkipWithError("cannot register memory");
    return nullptr;
  }
  pair->src_region = *src_region;
  auto blob = pair->target->ExportRegion(dst_region->id);
  auto address = pair->target->LocalAddress();
  if (!blob.ok() || !address.ok()) {
    state.SkipWithError("cannot export region");
    return nullptr;
  }
  pair->blob = *blob;
  // Wireup needs the target to progress while Connect waits.
  std::atomic<bool> stop{false};
  std::thread pump([&] {
    while (!stop.load()) pair->target->Progress();
  });
  absl::Status connected = pair->initiator->Connect(pair->target->agent_name(), *address);
  stop.store(true);
  pump.join();
  if (!connected.ok()) {
    state.SkipWithError(std::string(connected.message()).c_str());
    return nullptr;
  }
  return pair;
}

// Args: block bytes, transports index, notify (0/1).
void BM_UcxPut(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const std::string transports = kTransports[state.range(1)];
  const bool notify = state.range(2) != 0;
  std::unique_ptr<Pair> pair = MakePair(transports, bytes, state);
  if (pair == nullptr) return;
  TransferRequest request{.local_region = pair->src_region.id,
                          .peer = pair->target->agent_name(),
                          .remote_region = pair->blob,
                          .ops = {{.local_offset = 0, .remote_offset = 0, .length = bytes}},
                          .notification = notify ? "done" : ""};
  for (auto _ : state) {
    auto handle = pair->initiator->PostWrite(request);
    if (!handle.ok()) {
      state.SkipWithError(std::string(handle.status().message()).c_str());
      return;
    }
    while (true) {
      auto poll = pair->initiator->Poll(*handle);
      if (!poll.ok() || *poll == TransferState::kFailed) {
        state.SkipWithError("transfer failed");
        return;
      }
      if (*poll == TransferState::kDone) break;
      pair->target->Progress();
    }
    if (notify) {
      while (pair->target->GetNotifications().empty()) pair->initiator->Progress();
    }
    (void)pair->initiator->Release(*handle);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.SetLabel(absl::StrCat(transports, notify ? " +notify" : ""));
  if (std::memcmp(pair->src.data(), pair->dst.data(), bytes) != 0) {
    state.SkipWithError("target bytes differ from source");
  }
}

BENCHMARK(BM_UcxPut)
    ->ArgsProduct({{4 << 10, 64 << 10, 1 << 20, 16 << 20}, {0, 1}, {0}})
    ->ArgNames({"bytes", "transports", "notify"})
    ->UseRealTime();
BENCHMARK(BM_UcxPut)
    ->ArgsProduct({{4 << 10}, {0, 1}, {1}})
    ->ArgNames({"bytes", "transports", "notify"})
    ->UseRealTime();

}  // namespace
}  // namespace tandem::kvtransfer

BENCHMARK_MAIN();
