// main() for every Tandem gtest binary. ctest runs the tests of one binary as parallel processes,
// so each process gets its own temporary directory (TEST_TMPDIR, which testing::TempDir() reads)
// and removes it at exit: tests may use fixed names under TempDir() without racing each other.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* base = getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/tandem-test-XXXXXX";
  char* dir = mkdtemp(pattern.data());
  if (dir != nullptr) setenv("TEST_TMPDIR", (std::string(dir) + "/").c_str(), /*overwrite=*/1);
  int result = RUN_ALL_TESTS();
  if (dir != nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return result;
}
