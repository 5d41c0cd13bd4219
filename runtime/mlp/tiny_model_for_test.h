#pragma once
// Test support for runtime/mlp: a synthesized `tiny` model (random weights) in a temporary
// directory that lives as long as the object, and its config and weights opened from there.
// Failures abort the test binary (CHECK): without the model no test of the suite means anything.

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"

namespace tandem::mlp {

class TinyModelDir {
 public:
  TinyModelDir(const std::string& tag, uint64_t seed)
      : path_(std::filesystem::temp_directory_path() / absl::StrCat(tag, "-", getpid())) {
    SynthOptions o;
    o.like = "tiny";
    o.out_dir = path_.string();
    o.seed = seed;
    const absl::Status s = SynthesizeModel(o, nullptr);
    CHECK(s.ok()) << s;
  }
  ~TinyModelDir() { std::filesystem::remove_all(path_); }
  TinyModelDir(const TinyModelDir&) = delete;
  TinyModelDir& operator=(const TinyModelDir&) = delete;

  // Its config and an open TensorStore over its weights.
  void Open(ModelConfig* config, std::unique_ptr<TensorStore>* store) const {
    auto c = LoadModelConfig(path_.string());
    CHECK(c.ok()) << c.status();
    *config = *std::move(c);
    auto s = TensorStore::Open(path_.string());
    CHECK(s.ok()) << s.status();
    *store = *std::move(s);
  }

 private:
  const std::filesystem::path path_;
};

// `rows` rows of `hidden` normally distributed floats, the same for the same seed.
inline std::vector<float> RandomRows(int rows, int hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(rows) * static_cast<size_t>(hidden));
  for (float& v : x) v = dist(rng);
  return x;
}

}  // namespace tandem::mlp
