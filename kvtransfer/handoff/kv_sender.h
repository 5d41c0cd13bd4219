#pragma once
// The prefill side of a KV handoff: "send these blocks there" (DESIGN.md "A request, end to end",
// step 4). One KvSender per transfer backend of a prefill worker (a lane). It owns the lane's
// TransferThread, and so its backend, the connections to decode workers' agents, and every send
// from start to end:
// - planning the block copies, or converting the KV into a staging buffer of the destination's
//   format (kv_convert.h; kv_staging.h: on the host, or on the GPU for device lanes) when block
//   size, dtype or head range differ;
// - posting the writes, whole after the prompt, or layer by layer while the prompt is still
//   being computed (streamed);
// - polling them to remote completion, releasing every handle;
// - handing the source blocks back, exactly once.
// Nothing outside the sender posts, polls or releases a write, or gives back source blocks.
//
// Life of a send (all calls from any thread; the work runs on the lane's thread):
//   send = sender.Begin(id, destination, deadline, streamed, on_done)
//   KvSender::Chunk(send, chunk)     before each step of the prompt (streamed sends only)
//   KvSender::Whole(send, blocks, n, release_source)   the prompt's KV is complete and held
//     or KvSender::Failed(send, status)                 it will never be (the prefill failed)
//   KvSender::Abandon(send)          the consumer gave up: release everything (returns at once)
//   KvSender::Fence(send, deadline)  abandon, and wait until no write of it is in flight
// Contracts:
// - release_source runs exactly once per Whole: after every write that reads the source blocks
//   was released and, when the backend could not recall it (TransferBackend::Lingering), has
//   finished; on the lane's thread, or at once on the caller's thread when the sender has
//   stopped or the send already ended.
// - on_done runs exactly once per send with its report, when the send succeeded (every write
//   landed remotely) or failed. A send that fails before Whole reports then; its writes are
//   released first, its source blocks when Whole comes.
// - A streamed send posts a layer's writes once the chunk's progress counter passes that layer,
//   never earlier; everything left goes after Whole.
// - Every wait is bounded: the send's deadline, and options.transfer_timeout from Whole on.
// - After Fence returns quiescent, no write of that send is posted or in flight, lingering ones
//   included.
// Threading: the sender and sends are thread-safe; callbacks run without the sender's locks held.
// Lifetime: sends may outlive the sender (engine callbacks hold them); a send whose sender has
// stopped fails with Unavailable and gives its source back at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/kv_staging.h"
#include "kvtransfer/handoff/transfer_thread.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// What the lane reads: the worker's transfer memory, registered with the lane's backend.
struct KvSource {
  KvLayout layout;         // offsets within the registered region
  uint64_t region_id = 0;  // the region's id in the lane's backend
  // The registered memory: host memory (a CPU KV cache or the engine's pinned host mirror) or a
  // GPU's. KV of another block format is converted from it (KvStaging).
  MemoryKind kind = MemoryKind::kHost;
  const void* memory = nullptr;
  size_t bytes = 0;
};

// Where one prompt's KV goes: a decode worker's agent, region and blocks.
struct KvDestination {
  std::string agent_name;
  std::string agent_address;
  std::string region;  // the decode worker's ExportRegion blob
  KvLayout layout;
  std::vector<int32_t> block_ids;  // position order, covering the prompt
  int num_cached_tokens = 0;       // leading positions the destination holds already (not sent)
  // Compute KvSendReport::checksum over the source (kv_checksum.h) when the source is host memory
  // of the destination's element format.
  bool want_checksum = false;
};

// One step's chunk of a prompt about to be computed (see Engine's KvChunk): the KV of positions
// [begin, end) is complete for layer l once *progress >= first_value + l + 1.
struct KvChunkReady {
  std::vector<int32_t> block_ids;  // the source blocks of positions [0, end)
  int begin = 0;
  int end = 0;
  const volatile uint64_t* progress = nullptr;  // null: complete only at Whole
  uint64_t first_value = 0;
};

// Where a failed send stopped (metrics label them; kProducer is not a transfer failure).
enum class SendStage {
  kNone,
  kConnect,    // the destination's agent could not be connected
  kPlan,       // the copies could not be planned (the blocks do not fit the layout)
  kConvert,    // converting into the destination's format failed
  kPost,       // the backend refused a write
  kTransfer,   // a posted write failed
  kDeadline,   // not acknowledged in time
  kCancelled,  // the consumer gave up (Abandon, Fence)
  kShutdown,   // the sender stopped
  kProducer,   // the prompt's KV never became whole (Failed)
};
std::string_view SendStageName(SendStage stage);

struct KvSendReport {
  absl::Status status;
  SendStage failed_stage = SendStage::kNone;
  int64_t bytes = 0;           // written (only a successful send's count is final)
  int64_t streamed_bytes = 0;  // of those, posted before the KV was whole
  int64_t ops = 0;             // copy ops posted
  int writes = 0;              // PostWrite calls
  // From the first post to the last write landing, and from Whole to it (what the first token
  // waited for); zero when nothing was written.
  absl::Duration latency;
  absl::Duration exposed;
  // With KvDestination::want_checksum, where it could be computed: KvChecksum of what was sent
  // (tokens [num_cached_tokens, num_tokens), the destination's heads, every layer).
  std::optional<uint64_t> checksum;
};

struct KvSenderOptions {
  // From Whole to the last write landing (keep below the engine's held-KV lease).
  absl::Duration transfer_timeout = absl::Seconds(20);
};

class KvSend;

class KvSender {
 public:
  // `staging`: where KV of another block format is converted (of the source's memory kind); null:
  // this lane sends only byte copies of its own format.
  KvSender(std::unique_ptr<TransferThread> thread, KvSource source,
           std::unique_ptr<KvStaging> staging, KvSenderOptions options);
  ~KvSender();  // Stop()
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  const std::string& backend_name() const;

  // OK when this lane can write its KV into blocks of `target`'s format: byte copies of the same
  // block format, or a conversion through its staging. FailedPrecondition saying why not.
  absl::Status Admit(const KvLayout& target) const;
  // Admit, and the destination's blocks cover a prompt of `num_tokens` (planned with stand-in
  // source blocks, before anything is computed).
  absl::Status CheckDestination(const KvDestination& destination, int num_tokens) const;

  // Connects the lane's backend to a decode worker's agent (kept for its sends) and returns the
  // backend's ConnectReply (empty for one-sided backends) and this lane's agent name.
  struct Joined {
    std::string reply;
    std::string agent_name;
  };
  absl::StatusOr<Joined> Connect(const std::string& agent_name, const std::string& address,
                                 absl::Duration timeout);

  using DoneCallback = std::function<void(const KvSendReport&)>;
  std::shared_ptr<KvSend> Begin(std::string id, KvDestination destination, absl::Time deadline,
                                bool streamed, DoneCallback on_done);
  // A send's events are static: a send keeps what its sender shares alive, so engine callbacks
  // may outlive the sender object.
  static void Chunk(const std::shared_ptr<KvSend>& send, KvChunkReady chunk);
  static void Whole(const std::shared_ptr<KvSend>& send, std::vector<int32_t> block_ids,
                    int num_tokens, std::function<void()> release_source);
  static void Failed(const std::shared_ptr<KvSend>& send, absl::Status status);
  static void Abandon(const std::shared_ptr<KvSend>& send);
  // True when nothing of the send is in flight by `deadline` (no write is posted after the call
  // started; it waits for the posted ones to be released). False when that could not be
  // confirmed in time.
  static bool Fence(const std::shared_ptr<KvSend>& send, absl::Time deadline);

  // Every live send fails (kShutdown) and gives its source back; the backend is destroyed.
  void Stop();

  struct Core;  // shared with the sends

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace tandem::kvtransfer
