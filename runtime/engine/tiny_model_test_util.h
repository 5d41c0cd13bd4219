#pragma once
// Test-only: a tiny Llama synthesized (`tandem model synth --like tiny`) into the test temp
// directory for one test suite, and CPU runners over it. Construction and runner creation
// CHECK-fail on error (a broken fixture, not a test outcome); the directory is removed on
// destruction.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"
#include "runtime/model/weights.h"

namespace tandem {

class TinyModel {
 public:
  // Synthesizes into <TempDir()>/name with `seed`.
  TinyModel(const std::string& name, uint64_t seed) : dir_(::testing::TempDir() + "/" + name) {
    SynthOptions options;
    options.like = "tiny";
    options.out_dir = dir_;
    options.seed = seed;
    options.num_threads = 2;
    const absl::Status s = SynthesizeModel(options, nullptr);
    CHECK(s.ok()) << s;
  }
  ~TinyModel() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TinyModel(const TinyModel&) = delete;
  TinyModel& operator=(const TinyModel&) = delete;

  const std::string& dir() const { return dir_; }

  // A CPU runner over the model with `num_blocks` blocks of `block_size` tokens.
  std::unique_ptr<ModelRunner> MakeCpuRunner(int num_blocks, int block_size = 4) const {
    auto config = LoadModelConfig(dir_);
    CHECK(config.ok()) << config.status();
    auto store = TensorStore::Open(dir_);
    CHECK(store.ok()) << store.status();
    auto weights = LoadCpuWeights(*config, **store);
    CHECK(weights.ok()) << weights.status();
    CpuRunnerOptions runner_options;
    runner_options.block_size = block_size;
    runner_options.num_blocks = num_blocks;
    auto runner = CreateCpuModelRunner(*config, std::move(*weights), runner_options);
    CHECK(runner.ok()) << runner.status();
    return *std::move(runner);
  }

 private:
  std::string dir_;
};

}  // namespace tandem
