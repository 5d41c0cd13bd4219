#pragma once
// Read-only, memory-mapped access to the tensors of a Hugging Face model directory:
// `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
//
// Thread-safety: immutable after Open; any thread may read. Tensor views point into the mmaps and
// stay valid while the TensorStore lives.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

enum class DType { kF32, kF16, kBF16 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "F32", "F16", "BF16" as in safetensors headers

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into the mmap; little-endian, row-major
  size_t nbytes = 0;
  std::string file;  // the shard it lives in, for error messages
  int64_t numel() const;
};

class TensorStore {
 public:
  // Opens every safetensors file of `model_dir`. Fails (naming the file) on: no weights file,
  // unreadable or truncated files, corrupt headers, unknown dtypes, offsets outside the file,
  // an index naming missing shards or tensors.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Open(const std::string& model_dir);
  ~TensorStore();

  bool Has(const std::string& name) const;
  // The tensor `name`; NotFound naming the tensor and directory when absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  // Like Get, and InvalidArgument naming tensor and file when the shape differs from `shape`.
  absl::StatusOr<TensorView> GetWithShape(const std::string& name,
                                          const std::vector<int64_t>& shape) const;
  std::vector<std::string> Names() const;

  // Copies a tensor of any supported dtype to float32 (`out` resized to numel).
  static void ToFloat32(const TensorView& view, std::vector<float>* out);

 private:
  struct Mapping;
  TensorStore() = default;
  std::string dir_;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::map<std::string, TensorView> tensors_;
};

// Writes one safetensors file. `tensors` maps name -> (dtype, shape, raw bytes). Used by
// `tandem model synth` and tests.
struct TensorToWrite {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, TensorToWrite>& tensors);

}  // namespace tandem
