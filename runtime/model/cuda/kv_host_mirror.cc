#include "runtime/model/cuda/kv_host_mirror.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem {

absl::StatusOr<std::vector<MirrorCopy>> PlanMirrorCopies(const KvCacheLayout& layout,
                                                         std::span<const int32_t> blocks) {
  std::vector<int32_t> ids(blocks.begin(), blocks.end());
  for (int32_t b : ids) {
    if (b < 0 || b >= layout.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV staging: block id ", b, " outside [0, ", layout.num_blocks, ")"));
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const bool slabs_evenly_spaced = layout.layer_stride == 2 * layout.kv_stride;
  std::vector<MirrorCopy> copies;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i + 1;
    while (j < ids.size() && ids[j] == ids[j - 1] + 1) ++j;
    const size_t first = static_cast<size_t>(ids[i]);
    const size_t width = (j - i - 1) * layout.block_stride + layout.block_bytes;
    const size_t start = first * layout.block_stride;
    if (width <= layout.kv_stride && slabs_evenly_spaced) {
      copies.push_back(
          {start, width, layout.kv_stride, 2 * static_cast<size_t>(layout.num_layers)});
    } else if (width <= layout.kv_stride) {
      for (int l = 0; l < layout.num_layers; ++l) {
        copies.push_back({layout.Offset(l, 0, 0) + start, width, layout.kv_stride, 2});
      }
    } else {  // K and V of a block interleaved: one copy per slab
      for (int l = 0; l < layout.num_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          copies.push_back({layout.Offset(l, kv, 0) + start, width, width, 1});
        }
      }
    }
    i = j;
  }
  return copies;
}

KvHostMirror::~KvHostMirror() {
  absl::MutexLock lock(&mu_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::StatusOr<KvCacheLayout> KvHostMirror::Layout(const KvCacheLayout& device,
                                                   int device_ordinal) {
  absl::MutexLock lock(&mu_);
  if (host_ == nullptr) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_ordinal), "KV host mirror: cudaSetDevice");
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, device.bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      const absl::Status s = CudaStatus(e, "cudaHostAlloc");
      return absl::Status(
          e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : s.code(),
          absl::StrCat("KV host mirror: cannot pin ", device.bytes,
                       " bytes of host memory (the KV cache's size): ", s.message()));
    }
    host_ = p;
    device_ = device;
    device_ordinal_ = device_ordinal;
  }
  KvCacheLayout mirror = device_;
  mirror.base = host_;
  mirror.on_device = false;
  return mirror;
}

absl::Status KvHostMirror::Stage(std::span<const int32_t> blocks, KvStage dir,
                                 cudaStream_t stream) {
  void* host;
  KvCacheLayout device;
  int device_ordinal;
  {
    absl::MutexLock lock(&mu_);
    host = host_;
    device = device_;
    device_ordinal = device_ordinal_;
  }
  if (host == nullptr) {
    return absl::FailedPreconditionError("KV staging before the host mirror was allocated");
  }
  ASSIGN_OR_RETURN(const std::vector<MirrorCopy> copies, PlanMirrorCopies(device, blocks));
  if (copies.empty()) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_ordinal), "KV staging: cudaSetDevice");
  char* const mirror = static_cast<char*>(host);
  char* const cache = static_cast<char*>(device.base);
  const bool to_mirror = dir == KvStage::kToMirror;
  const cudaMemcpyKind kind = to_mirror ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (const MirrorCopy& c : copies) {
    char* dst = (to_mirror ? mirror : cache) + c.offset;
    const char* src = (to_mirror ? cache : mirror) + c.offset;
    const cudaError_t e =
        cudaMemcpy2DAsync(dst, c.pitch, src, c.pitch, c.width, c.rows, kind, stream);
    if (e != cudaSuccess) {
      // The copies already queued must not land after the caller reuses the blocks.
      cudaStreamSynchronize(stream);
      return CudaStatus(e, "KV staging: cudaMemcpy2DAsync");
    }
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "KV staging: cudaStreamSynchronize");
  return absl::OkStatus();
}

}  // namespace tandem
