#pragma once
// The decode side of a KV handoff: "expect these blocks" (DESIGN.md "A request, end to end",
// steps 3 and 5). One KvReceiver per decode worker. It owns the worker's lanes: each backend on
// its TransferThread, with the transfer memory registered and exported once. These are the
// endpoints offered to prefill workers in the pair handshake. It also owns every expected
// transfer's blocks, from the moment they are promised to a sender until they are safe to use:
// - Landed: the sender says every write landed (optionally verified against its checksum,
//   kv_checksum.h, where the memory is host memory); the blocks hold the prompt's KV.
// - Quarantine: the transfer failed or was given up, and writes may still land. Nobody may use
//   the blocks until Release(confirmed by the sender's fence) or the lease has passed
//   (options.fence_lease). The quarantined blocks are counted.
// The caller (decode/) drives the RPCs and the engine; it asks the expectation what it may do.
//
// Threading: thread-safe. An Expected belongs to one caller thread; its destructor ends a
// quarantine still held (the blocks then go back to the engine with the request).
// Lifetime: Stop (also the destructor) stops the lanes' threads; Expected objects must not
// outlive the receiver.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/transfer_thread.h"
#include "kvtransfer/kv_layout.h"

namespace tandem::kvtransfer {

// One backend of the decode worker, started: its thread (which owns the backend), the id its
// transfer memory is registered under, and that memory.
struct ReceiverLane {
  std::unique_ptr<TransferThread> thread;
  uint64_t region_id = 0;
  KvLayout layout;      // offsets within the registered region
  bool staged = false;  // the region is the engine's host mirror (received blocks are staged)
  // The registered memory when it is host memory (verification reads it); null for device memory.
  const void* host_memory = nullptr;
  size_t host_bytes = 0;
};

// What a prefill worker needs to write into one lane (the handshake's KvEndpoint).
struct ReceiverEndpoint {
  std::string backend;
  std::string agent_name;
  std::string agent_address;
  std::string region;  // ExportRegion blob
  KvLayout layout;
  bool staged = false;
  bool host_memory = false;  // verification can read it
};

struct KvReceiverOptions {
  // Without the sender's confirmation, how long a quarantine lasts.
  absl::Duration fence_lease = absl::Seconds(10);
  // Exporting each lane's identity at start-up.
  absl::Duration setup_timeout = absl::Seconds(30);
  // Called with +n / -n as blocks enter and leave quarantine (a gauge); may be empty.
  std::function<void(int)> on_quarantine;
};

class KvReceiver {
 public:
  // Exports each lane's identity on its thread. Errors: no lane, or a backend's export / address
  // error (the lanes are stopped then).
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Create(std::vector<ReceiverLane> lanes,
                                                            KvReceiverOptions options);
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // In preference order (the lanes' order).
  const std::vector<ReceiverEndpoint>& endpoints() const { return endpoints_; }
  // The endpoint running `backend`, or nullopt.
  std::optional<size_t> FindEndpoint(const std::string& backend) const;
  // Two-sided backends (nccl): joins the connection initiator `peer` started, on the lane's thread.
  absl::Status Accept(size_t endpoint, const std::string& peer, const std::string& reply,
                      absl::Duration timeout);

  class Expected {
   public:
    ~Expected();
    Expected(const Expected&) = delete;
    Expected& operator=(const Expected&) = delete;

    // Unique per receiver, never 0: the sender's fence names it.
    uint64_t epoch() const { return epoch_; }
    // Whether Landed can verify a checksum here (the endpoint's memory is host memory).
    bool verifiable() const;
    // The sender reported every write landed. With `checksum`, the blocks are verified first:
    // DataLoss when they differ (nothing is in flight: the caller recomputes into them).
    absl::Status Landed(std::optional<uint64_t> checksum);
    // The transfer failed or was given up: quarantines the blocks until Release.
    void Quarantine(absl::Time now);
    bool quarantined() const { return quarantined_; }
    absl::Time lease_end() const { return lease_end_; }
    // Ends the quarantine when the sender confirmed (its fence said quiescent) or the lease has
    // passed at `now`; true when the blocks may be reused (also when none was quarantined).
    bool Release(bool confirmed, absl::Time now);
    // Ends a quarantine regardless (the worker shuts down: the blocks go with the engine).
    void Drop();

   private:
    friend class KvReceiver;
    Expected(KvReceiver* receiver, size_t endpoint, std::vector<int32_t> blocks, int num_cached,
             int num_tokens, uint64_t epoch);

    KvReceiver* const receiver_;
    const size_t endpoint_;
    const std::vector<int32_t> blocks_;
    const int num_cached_;
    const int num_tokens_;
    const uint64_t epoch_;
    bool quarantined_ = false;
    absl::Time lease_end_;
  };
  // Expects the KV of tokens [num_cached, num_tokens) in `blocks` (position order) of `endpoint`.
  std::unique_ptr<Expected> Expect(size_t endpoint, std::vector<int32_t> blocks, int num_cached,
                                   int num_tokens);

  int quarantined_blocks() const { return quarantined_.load(); }

  void Stop();

 private:
  KvReceiver(std::vector<ReceiverLane> lanes, std::vector<ReceiverEndpoint> endpoints,
             KvReceiverOptions options);
  void AddQuarantined(int n);

  std::vector<ReceiverLane> lanes_;
  const std::vector<ReceiverEndpoint> endpoints_;
  const KvReceiverOptions options_;
  std::atomic<uint64_t> next_epoch_{1};
  std::atomic<int> quarantined_{0};
};

}  // namespace tandem::kvtransfer
