#include "kvtransfer/handoff/kv_staging.h"

#include <new>

#include "absl/strings/str_cat.h"
#if TANDEM_KVTRANSFER_CUDA_CONVERT
#include "kvtransfer/cuda_convert/device_staging.h"
#endif

namespace tandem::kvtransfer {
namespace {

class HostStaging final : public KvStaging {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    void* p = ::operator new(bytes, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no memory for a ", bytes, "-byte KV conversion buffer"));
    }
    return p;
  }
  void Free(void* buffer) override { ::operator delete(buffer); }
  absl::Status Convert(const ConversionPlan& pack, const void* src, uint64_t src_length,
                       void* buffer, uint64_t length) override {
    return ConvertOnHost(pack, src, src_length, buffer, length);
  }
};

}  // namespace

std::unique_ptr<KvStaging> CreateHostStaging() { return std::make_unique<HostStaging>(); }

absl::StatusOr<std::unique_ptr<KvStaging>> CreateDeviceStaging(int cuda_device) {
#if TANDEM_KVTRANSFER_CUDA_CONVERT
  return cuda_convert::CreateCudaStaging(cuda_device);
#else
  (void)cuda_device;
  return absl::UnimplementedError("KV conversion on a GPU: this build has no CUDA");
#endif
}

}  // namespace tandem::kvtransfer
