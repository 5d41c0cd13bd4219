// Safetensors loading (TensorStore::Open: the 8-byte header length, the JSON header, dtypes,
// shapes and data offsets; the sharded index model.safetensors.index.json), then every tensor
// read back through TensorStore::ToFloat32. The loader reads files, so each input is written to a
// scratch directory first.
//
// Input: one mode byte, then
//   mode & 1 == 0: the bytes of model.safetensors;
//   mode & 1 == 1: a 2-byte little-endian length L, L bytes of model.safetensors.index.json, and
//                  the rest as the shard "a.safetensors" (the index may name it, or anything).
// Properties: no crash; every accepted tensor has non-negative dimensions and nbytes ==
// numel * dtype size, and (single file) its offsets, read from the header independently, lie in
// the file's data region.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "nlohmann/json.hpp"
#include "runtime/model/safetensors.h"

namespace {

using tandem::fuzz::ScratchDir;
using tandem::fuzz::WriteFile;

// Reads the header as the safetensors format defines it, to judge what Open accepted.
void CheckAgainstHeader(std::string_view file, const tandem::TensorStore& store) {
  FUZZ_CHECK(file.size() >= 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[i]);
  FUZZ_CHECK(header_len <= file.size() - 8);
  const uint64_t data_size = file.size() - 8 - header_len;
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, header_len), nullptr, false);
  FUZZ_CHECK(header.is_object());
  const uint8_t* lowest = nullptr;
  const uint8_t* highest_end = nullptr;
  for (const std::string& name : store.Names()) {
    auto entry = header.find(name);
    FUZZ_CHECK(entry != header.end() && entry->is_object());
    const nlohmann::json& offsets = entry->at("data_offsets");
    FUZZ_CHECK(offsets.is_array() && offsets.size() == 2);
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    FUZZ_CHECK(begin <= end && end <= data_size);
    absl::StatusOr<tandem::TensorView> view = store.Get(name);
    FUZZ_CHECK(view.ok());
    FUZZ_CHECK(view->nbytes == end - begin);
    const auto* p = static_cast<const uint8_t*>(view->data);
    if (lowest == nullptr || p < lowest) lowest = p;
    if (highest_end == nullptr || p + view->nbytes > highest_end) highest_end = p + view->nbytes;
  }
  // All views lie within one span no longer than the data region.
  if (lowest != nullptr) FUZZ_CHECK(static_cast<uint64_t>(highest_end - lowest) <= data_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool sharded = (data[0] & 1) != 0;
  const std::string dir = ScratchDir() + "/model";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  std::string_view single;
  if (!sharded) {
    single = input;
    WriteFile(dir + "/model.safetensors", single);
  } else {
    if (input.size() < 2) return 0;
    const size_t len = std::min<size_t>(
        static_cast<uint8_t>(input[0]) | (static_cast<size_t>(static_cast<uint8_t>(input[1])) << 8),
        input.size() - 2);
    WriteFile(dir + "/model.safetensors.index.json", input.substr(2, len));
    WriteFile(dir + "/a.safetensors", input.substr(2 + len));
  }

  absl::StatusOr<std::unique_ptr<tandem::TensorStore>> store = tandem::TensorStore::Open(dir);
  if (!store.ok()) return 0;
  std::vector<float> values;
  for (const std::string& name : (*store)->Names()) {
    FUZZ_CHECK((*store)->Has(name));
    absl::StatusOr<tandem::TensorView> view = (*store)->Get(name);
    FUZZ_CHECK(view.ok());
    for (int64_t d : view->shape) FUZZ_CHECK(d >= 0);
    FUZZ_CHECK(view->numel() >= 0);
    FUZZ_CHECK(view->nbytes ==
               static_cast<uint64_t>(view->numel()) * tandem::DTypeSize(view->dtype));
    tandem::TensorStore::ToFloat32(*view, &values);
    FUZZ_CHECK(values.size() == static_cast<size_t>(view->numel()));
    FUZZ_CHECK((*store)->GetWithShape(name, view->shape).ok());
  }
  if (!sharded) CheckAgainstHeader(single, **store);
  return 0;
}
