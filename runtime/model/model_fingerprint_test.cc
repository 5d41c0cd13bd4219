#include "runtime/model/model_fingerprint.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"

namespace tandem {
namespace {

std::string Synth(uint64_t seed) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/fingerprint_", getpid(), "_", seed);
  SynthOptions options;
  options.like = "tiny";
  options.out_dir = dir;
  options.seed = seed;
  options.num_threads = 2;
  EXPECT_TRUE(SynthesizeModel(options, nullptr).ok());
  return dir;
}

std::string FingerprintOf(const std::string& dir) {
  auto store = TensorStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? ModelFingerprint(**store) : "";
}

TEST(ModelFingerprintTest, SameWeightsAgreeOtherWeightsOfTheSameShapeDiffer) {
  const std::string a = Synth(1);
  const std::string b = Synth(2);
  const std::string fa = FingerprintOf(a);
  EXPECT_EQ(fa.size(), 16u);
  EXPECT_EQ(fa, FingerprintOf(a));  // a second open of the same directory
  EXPECT_NE(fa, FingerprintOf(b));  // same config and shapes, other random weights
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
}

}  // namespace
}  // namespace tandem
