#pragma once
// Test-only: where the CUDA runner's GPU tests find their inputs and put their files. Header-only;
// include it from test files only. The environment variables are the test harness's locations
// (ctest, the GPU host's bundle), not tuning.
//   TestTempDir(prefix, name)  $TEST_TMPDIR (or /tmp) / prefix_name_PID, created
//   BundledModelsDir()          $TANDEM_MODELS_DIR, else <source>/models if it has target/, else
//                               "models"
//   TandemBinary()              $TANDEM_BIN, else $TANDEM_BUILD_DIR/tandem, else <build>/tandem

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::testing_util {

inline std::string TestTempDir(const std::string& prefix, const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") /
                              (prefix + "_" + name + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string BundledModelsDir() {
  if (const char* env = std::getenv("TANDEM_MODELS_DIR")) return env;
  const std::string src = std::string(TANDEM_SOURCE_DIR) + "/models";
  if (std::filesystem::exists(src + "/target/config.json")) return src;
  return "models";
}

inline std::string TandemBinary() {
  if (const char* env = std::getenv("TANDEM_BIN")) return env;
  if (const char* env = std::getenv("TANDEM_BUILD_DIR")) return std::string(env) + "/tandem";
  return std::string(TANDEM_BUILD_DIR) + "/tandem";
}

}  // namespace tandem::testing_util
