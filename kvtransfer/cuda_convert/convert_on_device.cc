#include "kvtransfer/cuda_convert/convert_on_device.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_convert/convert_kernel.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer::cuda_convert {
namespace {

int Kind(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 1;
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kRaw:
      break;
  }
  return 0;
}

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("KV conversion on the GPU: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status ConvertOnDevice(const ConversionPlan& plan, const void* src, uint64_t src_length,
                             void* dst, uint64_t dst_length, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckPiecesInBuffers(plan, src_length, dst_length));
  const int src_kind = Kind(plan.src_dtype);
  const int dst_kind = Kind(plan.dst_dtype);
  if ((src_kind == 0) != (dst_kind == 0) ||
      (src_kind == 0 && plan.src_elem_bytes != plan.dst_elem_bytes)) {
    return absl::InvalidArgumentError("KV conversion: raw elements convert only to themselves");
  }
  if (plan.pieces.empty()) return absl::OkStatus();
  if (plan.pieces.size() > static_cast<size_t>(1) << 30) {
    return absl::InvalidArgumentError("KV conversion: too many pieces for one launch");
  }
  std::vector<DevicePiece> host(plan.pieces.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const ConvertPiece& p = plan.pieces[i];
    host[i] =
        DevicePiece{p.src_offset, p.dst_offset, p.rows, p.row_elems, p.src_pitch, p.dst_pitch};
  }
  DevicePiece* device = nullptr;
  const size_t bytes = host.size() * sizeof(DevicePiece);
  RETURN_IF_ERROR(Cuda(cudaMallocAsync(reinterpret_cast<void**>(&device), bytes, stream),
                       "allocating the piece list"));
  absl::Status status =
      Cuda(cudaMemcpyAsync(device, host.data(), bytes, cudaMemcpyHostToDevice, stream),
           "uploading the piece list");
  if (status.ok()) {
    status = Cuda(LaunchConvertPieces(device, static_cast<int>(host.size()), src_kind, dst_kind,
                                      plan.src_elem_bytes, src, dst, stream),
                  "launching");
  }
  const absl::Status freed = Cuda(cudaFreeAsync(device, stream), "freeing the piece list");
  const absl::Status synced = Cuda(cudaStreamSynchronize(stream), "running");
  if (!status.ok()) return status;
  if (!freed.ok()) return freed;
  return synced;
}

}  // namespace tandem::kvtransfer::cuda_convert
