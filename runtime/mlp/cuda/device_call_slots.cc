#include "runtime/mlp/cuda/device_call_slots.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::mlp {

DeviceCallSlots::~DeviceCallSlots() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  for (Slot& slot : slots_) {
    cudaStream_t s = static_cast<cudaStream_t>(slot.stream);
    if (s != nullptr) cudaStreamSynchronize(s);
    if (slot.done != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(slot.done));
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

absl::Status DeviceCallSlots::Init(int device, std::string owner) {
  device_ = device;
  owner_ = std::move(owner);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "MLP call slots: cudaSetDevice");
  for (Slot& slot : slots_) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                         "MLP call slots: cudaStreamCreate");
    slot.stream = s;
    RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                         "MLP call slots: cudaEventCreate");
    slot.done = e;
  }
  return absl::OkStatus();
}

bool DeviceCallSlots::any_busy() const {
  for (const Slot& slot : slots_) {
    if (slot.busy) return true;
  }
  return false;
}

absl::StatusOr<DeviceCallSlots::Slot*> DeviceCallSlots::Find(int first, int end,
                                                             bool exclusive_rows) {
  Slot* free = nullptr;
  for (Slot& slot : slots_) {
    if (!slot.busy) {
      if (free == nullptr && slot.stream != nullptr) free = &slot;
    } else if (exclusive_rows && first < slot.end && slot.first < end) {
      return absl::InvalidArgumentError(
          absl::StrCat(owner_, ": rows [", first, ", ", end, ") overlap a call in flight"));
    }
  }
  if (free == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(owner_, ": more than ", kSlots, " calls in flight"));
  }
  return free;
}

uint64_t DeviceCallSlots::Issue(Slot* slot, int first, int end) {
  slot->busy = true;
  slot->first = first;
  slot->end = end;
  ++slot->generation;
  return (slot->generation << 8) | static_cast<uint64_t>(slot - slots_.data());
}

absl::Status DeviceCallSlots::Join(uint64_t handle, void* stream) {
  const uint64_t index = handle & 0xff;
  if (index >= slots_.size() || !slots_[index].busy || slots_[index].generation != (handle >> 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner_, ": no call in flight as handle ", handle));
  }
  Slot& slot = slots_[index];
  slot.busy = false;
  RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                           static_cast<cudaEvent_t>(slot.done), 0),
                       "cudaStreamWaitEvent (an MLP call's output)");
  return absl::OkStatus();
}

}  // namespace tandem::mlp
