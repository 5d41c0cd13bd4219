#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

// Headers beyond this are certainly corrupt (real ones are a few hundred KiB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(name);
}

std::string ErrnoText() { return std::strerror(errno); }

// A read-only mmap of a whole file; unmapped on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Maps `path` and parses its header into `tensors` (name -> view). Every error names the file.
absl::Status MapAndParse(const std::string& path, MappedFile* file,
                         std::map<std::string, TensorView>* tensors);

}  // namespace

struct TensorStore::Mapping {
  MappedFile file;
};

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorStore::~TensorStore() = default;

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<TensorStore> store(new TensorStore());
  store->dir_ = model_dir;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model directory ", model_dir, " does not exist"));
  }
  const std::string single = model_dir + "/model.safetensors";
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    auto mapping = std::make_unique<Mapping>();
    RETURN_IF_ERROR(MapAndParse(single, &mapping->file, &store->tensors_));
    store->mappings_.push_back(std::move(mapping));
    return store;
  }
  if (!fs::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no model.safetensors or model.safetensors.index.json in ", model_dir));
  }

  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", index_path));
  std::ostringstream text;
  text << in.rdbuf();
  Json index;
  try {
    index = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": invalid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing \"weight_map\" object"));
  }
  // shard file name -> tensor names the index places there.
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for \"", name, "\" is not a file name"));
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for \"", name,
                                                     "\" names an invalid shard \"", shard, "\""));
    }
    shards[shard].push_back(name);
  }
  if (shards.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
  }
  std::map<std::string, TensorView> listed;
  for (const auto& [shard, names] : shards) {
    const std::string path = model_dir + "/" + shard;
    if (!fs::exists(path, ec)) {
      return absl::NotFoundError(absl::StrCat(index_path, " names shard ", shard, " (for tensor \"",
                                              names.front(), "\"), but ", path, " does not exist"));
    }
    auto mapping = std::make_unique<Mapping>();
    std::map<std::string, TensorView> in_shard;
    RETURN_IF_ERROR(MapAndParse(path, &mapping->file, &in_shard));
    store->mappings_.push_back(std::move(mapping));
    for (const std::string& name : names) {
      auto it = in_shard.find(name);
      if (it == in_shard.end()) {
        return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is listed in ", index_path,
                                                " as in ", shard, ", but ", path,
                                                " does not contain it"));
      }
      listed[name] = it->second;
    }
    // Tensors a shard holds but the index does not list are still reachable (first one wins).
    for (auto& [name, view] : in_shard) store->tensors_.emplace(name, view);
  }
  for (auto& [name, view] : listed) store->tensors_[name] = view;
  return store;
}

namespace {

absl::Status MapAndParse(const std::string& path, MappedFile* file_out,
                         std::map<std::string, TensorView>* tensors) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", ErrnoText()));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const std::string why = ErrnoText();
    close(fd);
    return absl::DataLossError(absl::StrCat("cannot stat ", path, ": ", why));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file (", size,
                                            " bytes, shorter than the 8-byte header length)"));
  }
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string mmap_error = addr == MAP_FAILED ? ErrnoText() : "";
  close(fd);
  if (addr == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", mmap_error));
  }
  MappedFile file(static_cast<const uint8_t*>(addr), size);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.data()[i];
  if (header_len == 0 || header_len > kMaxHeaderBytes || header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt or truncated safetensors header (",
                                            "header length ", header_len, ", file size ", size,
                                            ")"));
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_len);
  } catch (const Json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(path, ": safetensors header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": safetensors header is not a JSON object"));
  }
  const uint8_t* data_begin = file.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    // (An init-capture: clang before 16 cannot capture a structured binding.)
    auto bad = [&path, &tensor = name](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", tensor, "\": ", why));
    };
    if (!entry.is_object()) return bad("header entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) return bad("missing dtype");
    const std::string dtype_name = entry["dtype"].get<std::string>();
    absl::StatusOr<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name,
                                                     "\" has unsupported dtype ", dtype_name,
                                                     " (supported: BF16, F16, F32)"));
    }
    if (!entry.contains("shape") || !entry["shape"].is_array()) return bad("missing shape");
    TensorView view;
    view.dtype = *dtype;
    view.file = path;
    // numel * size must not overflow: cap it by the data region as we go.
    uint64_t numel = 1;
    for (const Json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape has a non-integer or negative dimension");
      const uint64_t dim = d.get<uint64_t>();
      // (With a zero dimension numel stays 0, so the bound below never sees the others.)
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(
            absl::StrCat("shape ", entry["shape"].dump(), " has a dimension above 2^63 - 1"));
      }
      if (dim != 0 && numel > data_size / dim) {
        return bad(absl::StrCat("shape ", entry["shape"].dump(),
                                " is larger than the file's data region"));
      }
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2 || !entry["data_offsets"][0].is_number_unsigned() ||
        !entry["data_offsets"][1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t end = entry["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end,
                              "] fall outside the data region of ", data_size,
                              " bytes (truncated or corrupt file)"));
    }
    const uint64_t expected = numel * DTypeSize(view.dtype);
    if (end - begin != expected) {
      return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but shape ",
                              ShapeString(view.shape), " of ", dtype_name, " needs ", expected));
    }
    view.data = data_begin + begin;
    view.nbytes = static_cast<size_t>(expected);
    (*tensors)[name] = std::move(view);
  }
  *file_out = std::move(file);
  return absl::OkStatus();
}

}  // namespace

bool TensorStore::Has(const std::string& name) const { return tensors_.count(name) > 0; }

absl::StatusOr<TensorView> TensorStore::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", name, "\" not found in the safetensors files of ", dir_));
  }
  return it->second;
}

absl::StatusOr<TensorView> TensorStore::GetWithShape(const std::string& name,
                                                     const std::vector<int64_t>& shape) const {
  ASSIGN_OR_RETURN(TensorView view, Get(name));
  if (view.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" in ", view.file,
                                                   " has shape ", ShapeString(view.shape),
                                                   ", expected ", ShapeString(shape)));
  }
  return view;
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

namespace {

void ConvertRange(const TensorView& view, float* out, size_t begin, size_t end) {
  const uint8_t* src = static_cast<const uint8_t*>(view.data);
  switch (view.dtype) {
    case DType::kF32:
      std::memcpy(out + begin, src + begin * 4, (end - begin) * 4);
      return;
    case DType::kBF16:
      for (size_t i = begin; i < end; ++i) {
        uint16_t h;
        std::memcpy(&h, src + i * 2, 2);
        out[i] = Bf16ToFloat(h);
      }
      return;
    case DType::kF16:
      for (size_t i = begin; i < end; ++i) {
        uint16_t h;
        std::memcpy(&h, src + i * 2, 2);
        out[i] = F16ToFloat(h);
      }
      return;
  }
}

}  // namespace

void TensorStore::ToFloat32(const TensorView& view, std::vector<float>* out) {
  const size_t n = static_cast<size_t>(view.numel());
  out->resize(n);
  if (n == 0) return;  // (an empty vector's data() may be null, and memcpy must not see it)
  // Large tensors (embeddings of a 1B model are 260M values) convert on several threads.
  constexpr size_t kPerThread = size_t{1} << 22;
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({hw, 8, (n + kPerThread - 1) / kPerThread});
  if (threads <= 1) {
    ConvertRange(view, out->data(), 0, n);
    return;
  }
  std::vector<std::thread> workers;
  const size_t chunk = (n + threads - 1) / threads;
  for (size_t t = 1; t < threads; ++t) {
    const size_t begin = std::min(n, t * chunk);
    const size_t end = std::min(n, begin + chunk);
    workers.emplace_back(ConvertRange, std::cref(view), out->data(), begin, end);
  }
  ConvertRange(view, out->data(), 0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, TensorToWrite>& tensors) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", name, "\""));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\" has a negative dimension"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * DTypeSize(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": ", t.bytes.size(),
                                                     " bytes for shape ", ShapeString(t.shape),
                                                     " of ", DTypeName(t.dtype)));
    }
    header[name] = {{"dtype", DTypeName(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  uint8_t len_bytes[8];
  uint64_t len = header_text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const auto& [name, t] : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace tandem
