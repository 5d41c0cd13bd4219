// Differential tests of the CUDA runner against the CPU reference runner on the same bf16
// checkpoints: logits of mixed batches (prefill chunks, decodes, prefix-cache starts), KV cache
// contents, greedy decoding, CUDA graphs on vs off; the mixed batches and graphs again under the
// other GEMM routings of the runner's plan (cuda_tuning.h). Skipped without a GPU.
//
// Models: `tiny` synthesized here (random weights, head_dim 32, tied embeddings), the bundled
// trained target model (head_dim 64; $TANDEM_MODELS_DIR or <source>/models), and a small Qwen2-like
// checkpoint written here (q/k/v biases, untied LM head, head_dim 64).

#include "runtime/model/cuda/cuda_model_runner.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/cuda/random_checkpoint_for_test.h"
#include "runtime/model/cuda/test_paths_for_test.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"
#include "runtime/model/weights.h"

namespace tandem {
namespace {

std::string TempDirFor(const std::string& name) {
  return testing_util::TestTempDir("tandem_cuda_runner", name);
}

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

// A small Qwen2-shaped checkpoint with q/k/v biases large enough to matter.
std::string WriteQwenLike() {
  testing_util::RandomCheckpoint spec;
  spec.qwen2 = true;
  return testing_util::WriteRandomCheckpoint(TempDirFor("qwen"), spec);
}

struct Model {
  std::string name;
  ModelConfig config;
  std::unique_ptr<TensorStore> store;
};

// Logit comparison: errors relative to the row's logit scale (max |cpu logit|).
struct Diff {
  double max_abs = 0, max_rel = 0;
};

Diff CompareLogits(const ForwardOutput& cpu, const ForwardOutput& gpu, int vocab,
                   const std::string& what, double rel_tol) {
  Diff d;
  EXPECT_EQ(cpu.rows, gpu.rows) << what;
  if (cpu.rows != gpu.rows || gpu.logits.size() != cpu.logits.size()) return d;
  for (int r = 0; r < cpu.rows; ++r) {
    const float* c = cpu.logits.data() + static_cast<size_t>(r) * vocab;
    const float* g = gpu.logits.data() + static_cast<size_t>(r) * vocab;
    double scale = 1e-6, err = 0;
    int worst = 0;
    for (int v = 0; v < vocab; ++v) {
      scale = std::max(scale, std::fabs(static_cast<double>(c[v])));
      const double e = std::fabs(static_cast<double>(c[v]) - g[v]);
      if (!(e <= err)) {
        err = e;
        worst = v;
      }
    }
    d.max_abs = std::max(d.max_abs, err);
    d.max_rel = std::max(d.max_rel, err / scale);
    EXPECT_LE(err / scale, rel_tol)
        << what << " row " << r << ": max |cpu - gpu| = " << err << " at token " << worst
        << " (cpu " << c[worst] << ", gpu " << g[worst] << "), logit scale " << scale;
  }
  return d;
}

// A runner plan (cuda_tuning.h) the tests run under, by name.
struct Tuning {
  const char* name;
  const char* spec;
};

void PrintTo(const Tuning& t, std::ostream* os) { *os << t.name << " (" << t.spec << ")"; }

// The default plan, then: the skinny GEMM taking every 2-64-row projection on any GPU (every test
// model's dimensions are multiples of 64; by default it takes 2-32 rows on compute capability 9.0
// and none elsewhere), with RoPE and the KV append in its QKV epilogue; the skinny GEMM off
// (cuBLASLt for every multi-row projection, the default on other GPUs); the cluster GEMM taking
// every projection of 2-64 rows it has a plan for (any fill of the SMs: the test models are small;
// compute capability 9.0 only); cuBLASLt's autotuning over 32 heuristic candidates plus their
// split-K variants, logged.
const Tuning kDefaultTuning = {"default", ""};
const Tuning kSplitKTuning = {"gemm_splitk",
                              "autotune.candidates=32,autotune.splitk=1,autotune.log=1"};
const Tuning kTunings[] = {
    kDefaultTuning,
    {"skinny_on", "skinny=on"},
    {"skinny_off", "skinny=off"},
    {"cluster_gemm", "cluster=on,cluster.rows=1-64,cluster.min_fill=0,skinny=off"},
    kSplitKTuning};

CudaTuning ParseTuning(const Tuning& t) {
  absl::StatusOr<CudaTuning> parsed = ParseCudaTuning(t.spec);
  EXPECT_TRUE(parsed.ok()) << t.name << ": " << parsed.status();
  return parsed.ok() ? *parsed : CudaTuning{};
}

// Blocks handed out in order; each sequence owns its table.
struct Seq {
  std::vector<int32_t> tokens;  // every token so far (the KV of [0, cached) is in the cache)
  std::vector<int32_t> table;
  int cached = 0;
};

class CudaRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok() || *count == 0) return;
    have_gpu_ = true;
    SynthOptions o;
    o.like = "tiny";
    o.out_dir = TempDirFor("tiny");
    o.seed = 1;
    const absl::Status s = SynthesizeModel(o, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    models_ = new std::map<std::string, std::string>{
        {"tiny", o.out_dir},
        {"target", testing_util::BundledModelsDir() + "/target"},
        {"qwen", WriteQwenLike()}};
  }

  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    ASSERT_TRUE(have_gpu_ && models_ != nullptr);
  }

  Model Load(const std::string& name) {
    Model m;
    m.name = name;
    const std::string dir = models_->at(name);
    auto config = LoadModelConfig(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    if (config.ok()) m.config = *config;
    auto store = TensorStore::Open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    if (store.ok()) m.store = std::move(*store);
    return m;
  }

  std::unique_ptr<ModelRunner> Cpu(const Model& m) {
    auto w = LoadCpuWeights(m.config, *m.store);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return nullptr;
    CpuRunnerOptions o;
    o.block_size = kBlockSize;
    o.num_blocks = kNumBlocks;
    auto r = CreateCpuModelRunner(m.config, std::move(*w), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  std::unique_ptr<CudaModelRunner> Gpu(const Model& m, bool graphs, const CudaTuning& tuning = {}) {
    CudaRunnerOptions o;
    o.block_size = kBlockSize;
    o.num_blocks = kNumBlocks;
    o.cuda_graphs = graphs;
    o.tuning = tuning;
    o.max_batch_tokens = 64;  // small, so the mixed batches also exercise workspace growth
    auto r = CreateCudaModelRunner(m.config, *m.store, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Extends seq by `tokens` and returns its chunk (block table grown to cover them).
  SequenceChunk Chunk(Seq* s, const std::vector<int32_t>& tokens, bool logits = true) {
    const int start = static_cast<int>(s->tokens.size());
    s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
    while (static_cast<int>(s->table.size()) * kBlockSize < static_cast<int>(s->tokens.size())) {
      s->table.push_back(next_block_++);
    }
    SequenceChunk c;
    c.tokens = std::span<const int32_t>(s->tokens).subspan(start);
    c.start_pos = start;
    c.block_table = s->table;
    c.need_logits = logits;
    return c;
  }

  std::vector<int32_t> RandomTokens(int n, int vocab) {
    std::vector<int32_t> t(n);
    std::uniform_int_distribution<int32_t> d(3, vocab - 1);
    for (auto& x : t) x = d(rng_);
    return t;
  }

  static bool have_gpu_;
  static std::map<std::string, std::string>* models_;
  int next_block_ = 1;
  std::mt19937 rng_{12345};
};
bool CudaRunnerTest::have_gpu_ = false;
std::map<std::string, std::string>* CudaRunnerTest::models_ = nullptr;

int Argmax(const ForwardOutput& out, int row, int vocab) {
  return cpu::Argmax(out.logits.data() + static_cast<size_t>(row) * vocab, vocab);
}

// Parameters: the model and the runner's plan.
class MixedBatchTest : public CudaRunnerTest,
                       public ::testing::WithParamInterface<std::tuple<std::string, Tuning>> {};

// Prefills, a mixed step (decode + continued prefill + new prefill + prefix-cache hit), then
// decode-only steps (graphed: buckets 4 exact, then 3 padded to 4): logits vs the CPU runner, and
// the KV cache contents of every used block.
TEST_P(MixedBatchTest, LogitsAndKvMatchCpu) {
  Model m = Load(std::get<0>(GetParam()));
  ASSERT_FALSE(HasFailure());
  auto cpu = Cpu(m);
  auto gpu = Gpu(m, /*graphs=*/true, ParseTuning(std::get<1>(GetParam())));
  ASSERT_TRUE(cpu != nullptr && gpu != nullptr);
  const int vocab = m.config.vocab_size;
  constexpr double kRelTol = 0.03;
  double worst = 0;
  auto step = [&](ForwardBatch& batch, const std::string& what) {
    ForwardOutput co, go;
    absl::Status cs = cpu->Forward(batch, &co);
    absl::Status gs = gpu->Forward(batch, &go);
    EXPECT_TRUE(cs.ok()) << what << ": " << cs;
    EXPECT_TRUE(gs.ok()) << what << ": " << gs;
    const Diff d = CompareLogits(co, go, vocab, m.name + " " + what, kRelTol);
    worst = std::max(worst, d.max_rel);
    std::printf("[%s] %-28s rows=%d max_abs_err=%.4g max_rel_err=%.4g graph_bucket=%d replay=%d\n",
                m.name.c_str(), what.c_str(), co.rows, d.max_abs, d.max_rel,
                gpu->last_step_stats().graph_bucket, gpu->last_step_stats().graph_replayed);
    return co;
  };

  Seq a, b, c, d, e;
  {
    ForwardBatch batch;
    batch.chunks = {Chunk(&a, RandomTokens(20, vocab)), Chunk(&b, RandomTokens(7, vocab))};
    step(batch, "prefill 20 + 7");
  }
  {
    // d shares a's first (full) block: same 16 tokens, then its own. Its KV for positions
    // [0, 16) is already in the cache, so its chunk starts at 16.
    d.tokens.assign(a.tokens.begin(), a.tokens.begin() + kBlockSize);
    d.table = {a.table[0]};
    ForwardBatch batch;
    batch.chunks = {Chunk(&a, RandomTokens(1, vocab)), Chunk(&b, RandomTokens(5, vocab), false),
                    Chunk(&c, RandomTokens(13, vocab)), Chunk(&d, RandomTokens(6, vocab)),
                    Chunk(&e, RandomTokens(1, vocab))};
    step(batch, "mixed decode+prefill+prefix");
  }
  std::vector<Seq*> live = {&a, &b, &c, &d};
  for (int i = 0; i < 6; ++i) {
    ForwardBatch batch;
    for (Seq* s : live) batch.chunks.push_back(Chunk(s, RandomTokens(1, vocab)));
    step(batch, "decode x4 #" + std::to_string(i));
    if (i > 0) {
      EXPECT_TRUE(gpu->last_step_stats().graph_replayed) << "the bucket-4 graph must replay";
    }
  }
  live.pop_back();
  for (int i = 0; i < 3; ++i) {
    ForwardBatch batch;
    for (Seq* s : live) batch.chunks.push_back(Chunk(s, RandomTokens(1, vocab)));
    step(batch, "decode x3 (padded) #" + std::to_string(i));
    EXPECT_EQ(gpu->last_step_stats().graph_bucket, 4);
  }
  {
    // A long prefill after a prefix (start_pos > 0, many blocks) beside decodes; 303 rows grow
    // the 256-row workspaces, which drops the captured graphs.
    ForwardBatch batch;
    batch.chunks = {Chunk(&a, RandomTokens(300, vocab)), Chunk(&b, RandomTokens(1, vocab)),
                    Chunk(&c, RandomTokens(1, vocab))};
    step(batch, "prefill 300 after prefix");
  }
  for (int i = 0; i < 2; ++i) {
    // Graphs are captured again over the grown workspaces.
    ForwardBatch batch;
    for (Seq* s : live) batch.chunks.push_back(Chunk(s, RandomTokens(1, vocab)));
    step(batch, "decode x3 after growth #" + std::to_string(i));
  }
  for (int i = 0; i < 3; ++i) {
    // Speculative verification: a's last token and 4 drafts, b's and 2, c plain: 9 decode rows,
    // each attending to its own prefix, graphed in the bucket of 16 (replayed after the first).
    ForwardBatch batch;
    batch.chunks = {Chunk(&a, RandomTokens(5, vocab)), Chunk(&b, RandomTokens(3, vocab)),
                    Chunk(&c, RandomTokens(1, vocab))};
    batch.chunks[0].num_logits = 5;
    batch.chunks[1].num_logits = 3;
    const ForwardOutput co = step(batch, "verify 5+3+1 #" + std::to_string(i));
    EXPECT_EQ(co.rows, 9);
    EXPECT_EQ(gpu->last_step_stats().graph_bucket, 16);
    if (i > 0) {
      EXPECT_TRUE(gpu->last_step_stats().graph_replayed);
    }
    // The same rows sampled greedily on the GPU: each row's token is its logits' argmax.
    if (!gpu->SupportsDeviceSampling()) continue;
    ForwardOutput logits_out, sampled_out;
    ASSERT_TRUE(gpu->Forward(batch, &logits_out).ok());
    std::vector<SampleRequest> greedy(9);
    for (SampleRequest& r : greedy) r.greedy = 1;
    batch.chunks[0].sample = &greedy[0];
    batch.chunks[1].sample = &greedy[5];
    batch.chunks[2].sample = &greedy[8];
    ASSERT_TRUE(gpu->Forward(batch, &sampled_out).ok());
    ASSERT_EQ(sampled_out.tokens.size(), 9u);
    EXPECT_TRUE(sampled_out.logits.empty());
    for (int r = 0; r < 9; ++r) {
      EXPECT_EQ(sampled_out.tokens[r], Argmax(logits_out, r, vocab)) << "row " << r;
    }
  }
  std::printf("[%s] worst relative logit error %.4g (tolerance %.3g)\n", m.name.c_str(), worst,
              kRelTol);

  // KV: every block written so far, every layer, K and V, bf16 GPU vs f32 CPU.
  const KvCacheLayout cl = cpu->kv_layout(), gl = gpu->kv_layout();
  ASSERT_EQ(gl.elem_bytes, 2);
  ASSERT_EQ(gl.num_blocks, kNumBlocks);
  ASSERT_EQ(gl.bytes, gl.layer_stride * gl.num_layers);
  std::vector<uint16_t> g(gl.bytes / 2);
  ASSERT_EQ(cudaMemcpy(g.data(), gl.base, gl.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  double kv_err = 0, kv_scale = 1e-6;
  for (int l = 0; l < cl.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int blk = 1; blk < next_block_; ++blk) {
        const float* cp = reinterpret_cast<const float*>(cl.BlockPtr(l, kv, blk));
        const uint16_t* gp = g.data() + gl.Offset(l, kv, blk) / 2;
        for (size_t i = 0; i < gl.block_bytes / 2; ++i) {
          kv_scale = std::max(kv_scale, std::fabs(static_cast<double>(cp[i])));
          kv_err = std::max(kv_err, std::fabs(static_cast<double>(cp[i]) - Bf16ToFloat(gp[i])));
        }
      }
    }
  }
  std::printf("[%s] KV cache: max |cpu - gpu| = %.4g, scale %.4g\n", m.name.c_str(), kv_err,
              kv_scale);
  EXPECT_LE(kv_err / kv_scale, 0.03) << "KV cache contents differ from the CPU runner's";
}

// Test names: Models/MixedBatchTest.LogitsAndKvMatchCpu/<model>_<tuning>.
std::string ModelAndTuningName(
    const ::testing::TestParamInfo<std::tuple<std::string, Tuning>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Models, MixedBatchTest,
                         ::testing::Combine(::testing::Values("tiny", "target", "qwen"),
                                            ::testing::ValuesIn(kTunings)),
                         ModelAndTuningName);

class GreedyTest : public CudaRunnerTest,
                   public ::testing::WithParamInterface<std::tuple<std::string, Tuning>> {};

// 64 greedy steps, teacher-forced with the CPU's tokens: the GPU's argmax must equal the CPU's
// except on near-ties (CPU logit gap below 1% of the logit scale), which bf16 may flip.
TEST_P(GreedyTest, ArgmaxMatchesCpuFor64Steps) {
  Model m = Load(std::get<0>(GetParam()));
  ASSERT_FALSE(HasFailure());
  auto cpu = Cpu(m);
  auto gpu = Gpu(m, /*graphs=*/true, ParseTuning(std::get<1>(GetParam())));
  ASSERT_TRUE(cpu != nullptr && gpu != nullptr);
  const int vocab = m.config.vocab_size;
  Seq s;
  std::vector<int32_t> next = RandomTokens(12, vocab);
  int exact = 0, near_ties = 0;
  for (int i = 0; i < 64; ++i) {
    ForwardBatch batch;
    batch.chunks = {Chunk(&s, next)};
    ForwardOutput co, go;
    ASSERT_TRUE(cpu->Forward(batch, &co).ok());
    const absl::Status gs = gpu->Forward(batch, &go);
    ASSERT_TRUE(gs.ok()) << gs;
    ASSERT_EQ(go.rows, 1);
    const int ct = Argmax(co, 0, vocab), gt = Argmax(go, 0, vocab);
    if (ct == gt) {
      ++exact;
    } else {
      double scale = 1e-6;
      for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(double{co.logits[v]}));
      const double gap = co.logits[ct] - co.logits[gt];
      EXPECT_LE(gap, 0.01 * scale) << m.name << " step " << i << ": cpu token " << ct << ", gpu "
                                   << gt << ", cpu logit gap " << gap << " (scale " << scale << ")";
      ++near_ties;
    }
    next = {ct};
  }
  std::printf("[%s] greedy 64 steps: %d identical argmax, %d near-tie flips\n", m.name.c_str(),
              exact, near_ties);
}

// Single-row steps take the GEMV whatever the plan; the autotuning's wider search is the plan
// that changes them (the LM head and prefill GEMMs).
INSTANTIATE_TEST_SUITE_P(Models, GreedyTest,
                         ::testing::Combine(::testing::Values("tiny", "target", "qwen"),
                                            ::testing::Values(kDefaultTuning, kSplitKTuning)),
                         ModelAndTuningName);

class GraphsTest : public CudaRunnerTest, public ::testing::WithParamInterface<Tuning> {};

// Graphs on vs off: identical logits when the batch is exactly a bucket (same kernels, same
// arguments), and close when padding changes the GEMM shapes.
TEST_P(GraphsTest, GraphsOnAndOffGiveTheSameLogits) {
  Model m = Load("tiny");
  ASSERT_FALSE(HasFailure());
  const CudaTuning tuning = ParseTuning(GetParam());
  auto on = Gpu(m, true, tuning);
  auto off = Gpu(m, false, tuning);
  ASSERT_TRUE(on != nullptr && off != nullptr);
  const int vocab = m.config.vocab_size;
  std::vector<Seq> seqs(8);
  // The same block ids for both runners: Chunk() allocates once and both runners get the chunk.
  auto both = [&](ForwardBatch& batch, bool expect_identical, const std::string& what) {
    ForwardOutput a, b;
    ASSERT_TRUE(on->Forward(batch, &a).ok()) << what;
    const CudaStepStats stats = on->last_step_stats();
    ASSERT_TRUE(off->Forward(batch, &b).ok()) << what;
    EXPECT_EQ(off->last_step_stats().graph_bucket, 0);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    double max_diff = 0;
    for (size_t i = 0; i < a.logits.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a.logits[i]) - b.logits[i]));
    }
    std::printf("graphs on/off %-16s bucket=%d replay=%d host_us=%.1f max |diff|=%.3g\n",
                what.c_str(), stats.graph_bucket, stats.graph_replayed, stats.host_us, max_diff);
    if (expect_identical) {
      EXPECT_EQ(max_diff, 0.0) << what << ": graph replay must reproduce the eager logits";
    } else {
      EXPECT_LE(max_diff, 0.05) << what;
    }
  };
  {
    ForwardBatch batch;
    for (Seq& s : seqs) batch.chunks.push_back(Chunk(&s, RandomTokens(9, vocab)));
    both(batch, true, "prefill x8");
  }
  for (int n : {8, 4, 8, 4, 1, 1}) {
    ForwardBatch batch;
    for (int i = 0; i < n; ++i) batch.chunks.push_back(Chunk(&seqs[i], RandomTokens(1, vocab)));
    both(batch, true, "decode x" + std::to_string(n));
  }
  for (int n : {3, 5, 3}) {
    ForwardBatch batch;
    for (int i = 0; i < n; ++i) batch.chunks.push_back(Chunk(&seqs[i], RandomTokens(1, vocab)));
    both(batch, false, "decode x" + std::to_string(n) + " padded");
  }
}

INSTANTIATE_TEST_SUITE_P(Tunings, GraphsTest, ::testing::ValuesIn(kTunings),
                         [](const auto& info) { return std::string(info.param.name); });

// A plan filled in code with a field out of range fails creation, naming the field's key.
TEST_F(CudaRunnerTest, RejectsATuningOutOfRange) {
  Model m = Load("tiny");
  ASSERT_FALSE(HasFailure());
  CudaRunnerOptions o;
  o.block_size = kBlockSize;
  o.num_blocks = kNumBlocks;
  o.tuning.decode.min_split_tokens = 100;
  auto r = CreateCudaModelRunner(m.config, *m.store, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("decode.min_split_tokens"), std::string::npos) << r.status();
}

TEST_F(CudaRunnerTest, RejectsBadBatchesAndKeepsWorking) {
  Model m = Load("tiny");
  ASSERT_FALSE(HasFailure());
  auto gpu = Gpu(m, true);
  ASSERT_TRUE(gpu != nullptr);
  const std::vector<int32_t> bad = {m.config.vocab_size};
  const std::vector<int32_t> table = {1};
  ForwardBatch batch;
  batch.chunks = {{bad, 0, table, true}};
  ForwardOutput out;
  EXPECT_EQ(gpu->Forward(batch, &out).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> ok = {1, 2, 3};
  batch.chunks = {{ok, 0, table, true}};
  ASSERT_TRUE(gpu->Forward(batch, &out).ok());
  EXPECT_EQ(out.rows, 1);
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(m.config.vocab_size));
  for (float v : out.logits) ASSERT_TRUE(std::isfinite(v));
  ForwardBatch empty;
  ASSERT_TRUE(gpu->Forward(empty, &out).ok());
  EXPECT_EQ(out.rows, 0);
}

}  // namespace
}  // namespace tandem
