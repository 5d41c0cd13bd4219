// The profiler on the CPU runner over a synthesized tiny model: every point measured (positive
// times; no timing is compared, a loaded machine may reorder them), the file valid, KV geometry
// from the runner, decode points that do not fit the cache left out, transfers over the
// in-process backends, bad options refused.
#include "planning/profiler.h"

#include <atomic>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/engine/tiny_model_test_util.h"

namespace tandem::planning {
namespace {

using ::testing::HasSubstr;

// A runner that counts its forward passes (from the neighbour's thread) and can fail them.
class CountingRunner : public ModelRunner {
 public:
  explicit CountingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int num_blocks() const override { return inner_->num_blocks(); }
  KvCacheLayout kv_layout() const override { return inner_->kv_layout(); }
  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    ++forwards;
    if (fail) return absl::InternalError("injected neighbour failure");
    return inner_->Forward(batch, out);
  }
  std::atomic<int> forwards{0};
  std::atomic<bool> fail{false};

 private:
  std::unique_ptr<ModelRunner> inner_;
};

TEST(ProfilerTest, MeasuresEveryPointOnTheCpuRunner) {
  TinyModel model("profiler_tiny", 3);
  std::unique_ptr<ModelRunner> runner = model.MakeCpuRunner(64, 4);
  ProfilerOptions options;
  options.prompt_lens = {8, 32, 96};
  options.batch_sizes = {1, 4, 16};
  options.contexts = {4, 24};
  options.max_num_batched_tokens = 32;
  options.prefill_batch_prompts = {2, 4, 64};
  options.prefill_batch_tokens = 8;
  options.repeats = 2;
  int calls = 0, last_total = 0;
  absl::StatusOr<DeviceProfile> p =
      MeasureProfile(*runner, options, [&](int done, int total, const std::string& what) {
        EXPECT_EQ(done, ++calls) << what;
        last_total = total;
      });
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(calls, last_total);
  EXPECT_EQ(p->kv_capacity_tokens, 64 * 4);
  const KvCacheLayout layout = runner->kv_layout();
  EXPECT_EQ(p->kv_bytes_per_token, int64_t{layout.num_layers} * 2 * layout.num_kv_heads *
                                       layout.head_dim * layout.elem_bytes);
  // 3 lengths + 3 cache hits (each has a whole block in its first half).
  ASSERT_EQ(p->prefill.size(), 6u);
  for (const PrefillPoint& x : p->prefill) EXPECT_GT(x.ms, 0);
  // 64 prompts of 2 blocks need 128 blocks of the 64: that batched point is left out.
  ASSERT_EQ(p->prefill_batches.size(), 2u);
  EXPECT_EQ(p->prefill_batches[1].prompts, 4);
  EXPECT_EQ(p->prefill_batches[1].tokens, 8);
  EXPECT_GT(p->prefill_batches[1].ms, 0);
  // Batch 16 at context 24 needs 16 * 7 = 112 blocks of the 64: that batch is left out.
  ASSERT_EQ(p->decode.size(), 4u);
  EXPECT_EQ(p->decode.back().batch, 4);
  ASSERT_EQ(p->transfer.size(), 3u);
  EXPECT_EQ(p->transfer_backend, "loopback");
  EXPECT_EQ(p->transfer[2].bytes, 24 * 4 * p->kv_bytes_per_token);  // 24 whole blocks of 4
  p->model = "tiny";
  p->device = "cpu";
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(*p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->prefill_batches.size(), 2u);
}

TEST(ProfilerTest, UcxTransfersAndRefusals) {
  TinyModel model("profiler_refusals", 4);
  std::unique_ptr<ModelRunner> runner = model.MakeCpuRunner(32, 4);
  ProfilerOptions options;
  options.prompt_lens = {8, 16};
  options.batch_sizes = {1};
  options.contexts = {4};
  options.repeats = 1;
  options.prefill_batch_tokens = 8;
  if (kvtransfer::TransferBackendBuilt("ucx")) {
    options.transfer_backend = "ucx";
    absl::StatusOr<DeviceProfile> p = MeasureProfile(*runner, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->transfer.size(), 2u);
  }
  options.transfer_backend = "cuda_ipc";
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("needs two processes"));
  options.transfer_backend = "none";
  options.prompt_lens = {16, 8};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("ascending"));
  options.prompt_lens = {8, 100000};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("outside"));
  options.prompt_lens = {8, 16};
  options.prefill_batch_prompts = {1, 2};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("prefill batch prompts: 1 is outside"));
  options.prefill_batch_prompts = {2};
  options.prefill_batch_tokens = 17;
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("prefill batch tokens"));
  options.prefill_batch_tokens = 8;
  options.batch_sizes = {64};
  options.contexts = {100};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("no decode point fits"));
}

TEST(ProfilerTest, NeighboursRepeatThePointsAndTheirErrorsAreReported) {
  TinyModel model("profiler_neighbours", 5);
  std::unique_ptr<ModelRunner> runner = model.MakeCpuRunner(64, 4);
  CountingRunner neighbour(model.MakeCpuRunner(64, 4));
  ProfilerOptions options;
  options.prompt_lens = {8, 32};
  options.batch_sizes = {1, 4};
  options.contexts = {4, 24};
  options.repeats = 3;
  options.prefill_batch_tokens = 8;
  options.neighbours = {&neighbour};
  absl::StatusOr<DeviceProfile> p = MeasureProfile(*runner, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->neighbours, 1);
  EXPECT_GT(neighbour.forwards.load(), 0);  // it ran beside the measurement
  p->model = "tiny";
  p->device = "cpu";
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(*p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->neighbours, 1);

  neighbour.fail = true;
  absl::Status failed = MeasureProfile(*runner, options).status();
  EXPECT_THAT(std::string(failed.message()), HasSubstr("neighbour: injected neighbour failure"));

  // The measured runner itself, or one of another cache geometry, is no neighbour.
  options.neighbours = {runner.get()};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("another runner of the same model"));
  std::unique_ptr<ModelRunner> small = model.MakeCpuRunner(32, 4);
  options.neighbours = {small.get()};
  EXPECT_THAT(std::string(MeasureProfile(*runner, options).status().message()),
              HasSubstr("another runner of the same model"));
}

}  // namespace
}  // namespace tandem::planning
