// The runner factory: device names, the CPU runner from a model directory, and CUDA requests in
// builds or on machines without CUDA (errors, never crashes).

#include "runtime/model/runner_factory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/model/synth.h"

namespace tandem {
namespace {

TEST(ParseRunnerDeviceTest, Names) {
  auto cpu = ParseRunnerDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->cuda);
  auto cuda = ParseRunnerDevice("cuda");
  ASSERT_TRUE(cuda.ok());
  EXPECT_TRUE(cuda->cuda);
  EXPECT_EQ(cuda->ordinal, 0);
  auto cuda3 = ParseRunnerDevice("cuda:3");
  ASSERT_TRUE(cuda3.ok());
  EXPECT_EQ(cuda3->ordinal, 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "", "cuda:99999999999"}) {
    EXPECT_EQ(ParseRunnerDevice(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

class RunnerFactoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string("/tmp/tandem_runner_factory_" + std::to_string(getpid()));
    SynthOptions o;
    o.like = "tiny";
    o.out_dir = *dir_;
    ASSERT_TRUE(SynthesizeModel(o, nullptr).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* RunnerFactoryTest::dir_ = nullptr;

TEST_F(RunnerFactoryTest, CpuRunnerFromModelDir) {
  RunnerOptions o;
  o.block_size = 8;
  o.num_blocks = 12;
  auto runner = CreateModelRunner("cpu", *dir_, o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->block_size(), 8);
  EXPECT_EQ((*runner)->num_blocks(), 12);
  EXPECT_EQ((*runner)->kv_layout().elem_bytes, 4);
}

TEST_F(RunnerFactoryTest, BadDeviceOrDirectory) {
  EXPECT_EQ(CreateModelRunner("tpu", *dir_, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CreateModelRunner("cpu", *dir_ + "/missing", {}).ok());
}

// Without CUDA in the build: FailedPrecondition. With it: a runner on a GPU machine, otherwise
// Unavailable (no driver or GPU) — never a crash.
TEST_F(RunnerFactoryTest, CudaWhereverItIsMissing) {
  auto runner = CreateModelRunner("cuda", *dir_, {});
  if (!CudaRunnerCompiledIn()) {
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition) << runner.status();
    EXPECT_NE(runner.status().message().find("TANDEM_CUDA"), std::string::npos);
    return;
  }
  if (runner.ok()) {
    EXPECT_EQ((*runner)->kv_layout().elem_bytes, 2);
  } else {
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnavailable) << runner.status();
  }
  auto far = CreateModelRunner("cuda:4096", *dir_, {});
  EXPECT_FALSE(far.ok());
}

}  // namespace
}  // namespace tandem
