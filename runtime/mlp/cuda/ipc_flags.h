#pragma once
// Completion flags of the GPU data plane (docs/mlp.md, "GPU data plane"): how one process's
// stream waits for another's work without an interprocess event.
//
// Why not events: a stream waiting (cudaStreamWaitEvent) on an interprocess event whose recording
// process dies before its GPU work ran is never released, and with it this process's other GPU
// work stops too (measured on an H100: the waiting stream and a fresh stream's 1 ms kernel were
// still not done 60 s after the peer's SIGKILL, and the process could not exit cleanly;
// bench/RESULTS.md). So every cross-process wait of the plane is a bounded spin on a flag word in
// a device buffer both processes map (CUDA IPC memory stays valid for the importer after the
// exporter dies):
//   signal: after the work queued before it on `stream`, writes {seq, status} into the flag;
//   wait:   a one-thread kernel on `stream` that returns once the flag's seq has reached `seq`
//           (wrap-around safe) or `timeout_ns` has passed (%globaltimer); on a timeout, or when
//           the flag's status is not 0, it stores `seq` into `*failed` (never clears it).
// A wait that gave up lets the stream go on: what it then reads is garbage, and its owner must
// read `*failed` after synchronizing and discard the step (MlpBackend::CheckDevice).
//
// Threading: enqueue functions as the CUDA stream's owner; no host synchronization.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::mlp {

struct IpcFlag {
  uint32_t seq = 0;     // the last call signalled
  uint32_t status = 0;  // 0: its work ran on good inputs
};
// The flags buffer of a session: [0] the client's, [1] the shard's (and room to spare).
inline constexpr size_t kIpcFlagsBytes = 256;

// Queues the write of {seq, *status_source (0 when null)} into `flag` on `stream` (a
// cudaStream_t).
absl::Status EnqueueIpcSignal(IpcFlag* flag, uint32_t seq, const uint32_t* status_source,
                              void* stream);

// Queues the bounded wait for `flag` to reach `seq` on `stream`; `failed` is device-visible
// memory (a device word, or mapped pinned host memory).
absl::Status EnqueueIpcWait(const IpcFlag* flag, uint32_t seq, uint64_t timeout_ns,
                            uint32_t* failed, void* stream);

}  // namespace tandem::mlp
