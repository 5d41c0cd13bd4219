#pragma once
// Where a sender converts KV that the destination needs in another block format (block size,
// dtype, head range: kv_convert.h): staging memory of the lane's kind, and the routine that fills
// it from the source. The host one converts with ConvertOnHost into heap memory; the device one
// (kvtransfer/cuda_convert/, the GPU kernel with the same bytes) into device memory of the
// source's GPU, so a GPU pair that differs in format still moves GPU to GPU.
//
// Threading: one owner (a sender's lane thread); Convert returns when the buffer holds the KV.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtransfer/kv_convert.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

class KvStaging {
 public:
  virtual ~KvStaging() = default;
  virtual MemoryKind kind() const = 0;
  // ResourceExhausted when there is no memory for it.
  virtual absl::StatusOr<void*> Allocate(uint64_t bytes) = 0;
  virtual void Free(void* buffer) = 0;
  // Converts every piece of `pack` from `src` (the lane's registered memory) into `buffer`.
  // InvalidArgument (nothing written) for a piece outside either.
  virtual absl::Status Convert(const ConversionPlan& pack, const void* src, uint64_t src_length,
                               void* buffer, uint64_t length) = 0;
};

std::unique_ptr<KvStaging> CreateHostStaging();
// On CUDA device `cuda_device`; Unimplemented in a build without CUDA.
absl::StatusOr<std::unique_ptr<KvStaging>> CreateDeviceStaging(int cuda_device);

}  // namespace tandem::kvtransfer
