#pragma once
// DeviceCallSlots: the bookkeeping of MlpBackend::SubmitOnDevice calls in flight (mlp_backend.h,
// "Ping-pong on the device path"), shared by the GPU backends. Each of a fixed number of slots
// owns a non-blocking stream and an event on one GPU: a backend queues a call's last step (its
// output copy or its compute) on the slot's stream and records the event there; the caller's
// JoinOnDevice makes its own stream wait for that event.
//
// Handles carry the slot index and a generation, so a stale or forged handle (joined twice,
// never issued) is refused, not mistaken for another call. A slot also remembers the call's rows
// [first, end) in the step's batch, for backends whose buffers are shared by the calls in flight
// (cuda_ipc), which must not overlap.
//
// Thread-safety: one thread at a time (the backend's caller). No CUDA types in this header.

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::mlp {

class DeviceCallSlots {
 public:
  static constexpr int kSlots = 8;

  struct Slot {
    void* stream = nullptr;  // cudaStream_t
    void* done = nullptr;    // cudaEvent_t
    bool busy = false;
    int first = 0, end = 0;
    uint64_t generation = 0;
  };

  DeviceCallSlots() = default;
  DeviceCallSlots(const DeviceCallSlots&) = delete;
  DeviceCallSlots& operator=(const DeviceCallSlots&) = delete;
  // Waits for every slot's stream, then frees them (binds the thread to the GPU).
  ~DeviceCallSlots();

  // Creates the streams and events on GPU `device`; `owner` ("cuda MLP") starts every error.
  absl::Status Init(int device, std::string owner);

  bool any_busy() const;

  // A free slot for rows [first, end): InvalidArgument when they overlap a call in flight (and
  // `exclusive_rows`), ResourceExhausted when every slot is busy. The slot stays free until
  // Issue().
  absl::StatusOr<Slot*> Find(int first, int end, bool exclusive_rows);
  // Marks `slot` busy with rows [first, end) (after its event was recorded) and returns the
  // call's handle.
  uint64_t Issue(Slot* slot, int first, int end);
  // Frees the call `handle` and makes `stream` (a cudaStream_t) wait for its event;
  // InvalidArgument for a handle not in flight.
  absl::Status Join(uint64_t handle, void* stream);

 private:
  int device_ = 0;
  std::string owner_ = "MLP call slots";
  std::array<Slot, kSlots> slots_;
};

}  // namespace tandem::mlp
