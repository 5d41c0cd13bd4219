#include "runtime/model/model_fingerprint.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

class Fnv1a {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 1099511628211ull;
    }
  }
  void Add(const std::string& s) {
    Add(s.data(), s.size());
    Add("\0", 1);  // separator: ("ab","c") and ("a","bc") differ
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

constexpr size_t kSample = 256;

}  // namespace

std::string ModelFingerprint(const TensorStore& store) {
  Fnv1a h;
  for (const std::string& name : store.Names()) {  // sorted (std::map)
    auto view = store.Get(name);
    if (!view.ok()) continue;
    h.Add(name);
    const int32_t dtype = static_cast<int32_t>(view->dtype);
    h.Add(&dtype, sizeof(dtype));
    for (int64_t d : view->shape) h.Add(&d, sizeof(d));
    const auto* bytes = static_cast<const char*>(view->data);
    const size_t n = view->nbytes;
    const size_t head = std::min(n, kSample);
    h.Add(bytes, head);
    if (n > 2 * kSample) h.Add(bytes + n / 2, kSample);
    if (n > kSample)
      h.Add(bytes + n - std::min(kSample, n - kSample), std::min(kSample, n - kSample));
  }
  return absl::StrFormat("%016x", h.value());
}

}  // namespace tandem
