#include "planning/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::planning {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

absl::Status CheckGrid(const std::vector<int>& grid, const char* name, int lo, int hi) {
  if (grid.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty"));
  for (size_t i = 0; i < grid.size(); ++i) {
    if (grid[i] < lo || grid[i] > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", grid[i], " is outside [", lo, ", ", hi, "]"));
    }
    if (i > 0 && grid[i] <= grid[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be ascending and distinct"));
    }
  }
  return absl::OkStatus();
}

// Times `run` (a forward pass or a transfer) once to warm up, then `repeats` times.
template <typename F>
absl::StatusOr<double> MedianMs(int repeats, F&& run) {
  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = run(); !s.ok()) return s;
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) ms.push_back(elapsed);
  }
  return Median(std::move(ms));
}

class Measurer {
 public:
  Measurer(ModelRunner& runner, const ProfilerOptions& options)
      : runner_(runner), options_(options), rng_(options.seed) {
    const int vocab = runner.config().vocab_size;
    tokens_.resize(static_cast<size_t>(std::max(options.prompt_lens.back(), 1)) + 1);
    for (int32_t& t : tokens_) t = static_cast<int32_t>(rng_() % static_cast<uint32_t>(vocab));
  }

  // Positions [start, end) of one sequence over blocks [first_block, ...), in chunks of at most
  // the step budget; the last chunk asks for logits.
  absl::Status Prefill(int start, int end) {
    const int bs = runner_.block_size();
    std::vector<int32_t> table((end + bs - 1) / bs);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    for (int pos = start; pos < end;) {
      const int n = std::min(end - pos, options_.max_num_batched_tokens);
      ForwardBatch batch;
      SequenceChunk chunk;
      chunk.tokens = std::span<const int32_t>(tokens_).subspan(pos, n);
      chunk.start_pos = pos;
      chunk.block_table = std::span<const int32_t>(table).first((pos + n + bs - 1) / bs);
      chunk.need_logits = pos + n == end;
      batch.chunks.push_back(chunk);
      ForwardOutput out;
      if (absl::Status s = runner_.Forward(batch, &out); !s.ok()) return s;
      pos += n;
    }
    return absl::OkStatus();
  }

  // One step prefilling `prompts` prompts of `len` tokens each (distinct blocks each, nothing
  // cached), every chunk asking for logits as a prefill worker's last chunks do.
  absl::Status PrefillBatch(int prompts, int len) {
    const int bs = runner_.block_size();
    const int per_seq = (len + bs - 1) / bs;
    tables_.assign(static_cast<size_t>(prompts), std::vector<int32_t>(per_seq));
    ForwardBatch fb;
    for (int b = 0; b < prompts; ++b) {
      for (int i = 0; i < per_seq; ++i) tables_[b][i] = b * per_seq + i;
      SequenceChunk chunk;
      chunk.tokens = std::span<const int32_t>(tokens_).subspan(0, static_cast<size_t>(len));
      chunk.start_pos = 0;
      chunk.block_table = tables_[b];
      chunk.need_logits = true;
      fb.chunks.push_back(chunk);
    }
    ForwardOutput out;
    return runner_.Forward(fb, &out);
  }

  // One decode step of `batch` sequences at position `context` (distinct blocks each).
  absl::Status Decode(int batch, int context) {
    const int bs = runner_.block_size();
    const int per_seq = context / bs + 1;
    tables_.assign(static_cast<size_t>(batch), std::vector<int32_t>(per_seq));
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < per_seq; ++i) tables_[b][i] = b * per_seq + i;
    }
    ForwardBatch fb;
    for (int b = 0; b < batch; ++b) {
      SequenceChunk chunk;
      chunk.tokens = std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(b) % 7, 1);
      chunk.start_pos = context;
      chunk.block_table = tables_[b];
      chunk.need_logits = true;
      fb.chunks.push_back(chunk);
    }
    ForwardOutput out;
    return runner_.Forward(fb, &out);
  }

 private:
  ModelRunner& runner_;
  const ProfilerOptions& options_;
  std::mt19937 rng_;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<int32_t>> tables_;
};

// Two agents of `backend` in this process, with a prompt's worth of KV registered on each.
class TransferPair {
 public:
  static absl::StatusOr<std::unique_ptr<TransferPair>> Create(const std::string& backend,
                                                              size_t bytes) {
    if (backend == "cuda_ipc" || backend == "nccl") {
      return absl::InvalidArgumentError(
          absl::StrCat("--transfer-backend ", backend,
                       ": needs two processes (or GPUs); measure it with bench/disagg and profile "
                       "loopback, ucx or cma here"));
    }
    auto pair = std::unique_ptr<TransferPair>(new TransferPair);
    kvtransfer::BackendOptions options;
    options.ucx_transports = "tcp,sm,self";
    options.agent_name = "profile-initiator";
    absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> a =
        kvtransfer::CreateTransferBackend(backend, options);
    if (!a.ok()) return a.status();
    options.agent_name = "profile-target";
    absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> b =
        kvtransfer::CreateTransferBackend(backend, options);
    if (!b.ok()) return b.status();
    pair->initiator_ = *std::move(a);
    pair->target_ = *std::move(b);
    pair->src_.assign(bytes, 0x5a);
    pair->dst_.assign(bytes, 0);
    absl::StatusOr<kvtransfer::MemoryRegion> src =
        pair->initiator_->RegisterMemory(pair->src_.data(), bytes, kvtransfer::MemoryKind::kHost);
    if (!src.ok()) return src.status();
    pair->src_region_ = src->id;
    absl::StatusOr<kvtransfer::MemoryRegion> dst =
        pair->target_->RegisterMemory(pair->dst_.data(), bytes, kvtransfer::MemoryKind::kHost);
    if (!dst.ok()) return dst.status();
    absl::StatusOr<std::string> blob = pair->target_->ExportRegion(dst->id);
    if (!blob.ok()) return blob.status();
    pair->blob_ = *std::move(blob);
    absl::StatusOr<std::string> address = pair->target_->LocalAddress();
    if (!address.ok()) return address.status();
    std::atomic<bool> stop{false};
    std::thread pump([&] {  // the target progresses while the initiator connects
      while (!stop.load()) pair->target_->Progress();
    });
    absl::Status connected = pair->initiator_->Connect(pair->target_->agent_name(), *address);
    stop.store(true);
    pump.join();
    if (!connected.ok()) return connected;
    if (absl::StatusOr<std::string> reply =
            pair->initiator_->ConnectReply(pair->target_->agent_name());
        reply.ok() && !reply->empty()) {
      if (absl::Status s = pair->target_->Accept(pair->initiator_->agent_name(), *reply); !s.ok()) {
        return s;
      }
    }
    return pair;
  }

  // Writes `ops`; returns once they landed (deadline 60 s).
  absl::Status Write(std::vector<kvtransfer::CopyOp> ops) {
    kvtransfer::TransferRequest request;
    request.local_region = src_region_;
    request.peer = target_->agent_name();
    request.remote_region = blob_;
    request.ops = std::move(ops);
    absl::StatusOr<kvtransfer::TransferHandle> h = initiator_->PostWrite(request);
    if (!h.ok()) return h.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    absl::Status result = absl::DeadlineExceededError("transfer did not land within 60 s");
    while (absl::Now() < deadline) {
      target_->Progress();
      absl::StatusOr<kvtransfer::TransferState> state = initiator_->Poll(*h);
      if (!state.ok()) {
        result = state.status();
        break;
      }
      if (*state == kvtransfer::TransferState::kDone) {
        result = absl::OkStatus();
        break;
      }
      if (*state == kvtransfer::TransferState::kFailed) {
        result = absl::UnavailableError("transfer failed");
        break;
      }
    }
    (void)initiator_->Release(*h);
    return result;
  }

 private:
  TransferPair() = default;
  std::unique_ptr<kvtransfer::TransferBackend> initiator_, target_;
  std::vector<uint8_t> src_, dst_;
  uint64_t src_region_ = 0;
  std::string blob_;
};

// Neighbour runners on threads of their own, each repeating the point being measured (the same
// prefill or decode step, on its own runner and cache) until the next one, or idling when none
// is set (transfer points). Errors of a neighbour are kept and returned by Stop.
class Neighbours {
 public:
  using Job = std::function<absl::Status(Measurer&)>;

  Neighbours(const std::vector<ModelRunner*>& runners, const ProfilerOptions& options) {
    for (ModelRunner* runner : runners) {
      measurers_.push_back(std::make_unique<Measurer>(*runner, options));
    }
    for (auto& m : measurers_) threads_.emplace_back([this, mp = m.get()] { Run(*mp); });
  }
  ~Neighbours() { (void)Stop(); }
  Neighbours(const Neighbours&) = delete;
  Neighbours& operator=(const Neighbours&) = delete;

  void Set(Job job) {
    absl::MutexLock lock(&mu_);
    job_ = std::make_shared<const Job>(std::move(job));
  }
  absl::Status Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Run(Measurer& m) {
    while (true) {
      std::shared_ptr<const Job> job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || job_ != nullptr; };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        job = job_;
      }
      if (absl::Status s = (*job)(m); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (error_.ok()) error_ = absl::Status(s.code(), absl::StrCat("neighbour: ", s.message()));
        stop_ = true;
        return;
      }
    }
  }

  std::vector<std::unique_ptr<Measurer>> measurers_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::shared_ptr<const Job> job_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<DeviceProfile> MeasureProfile(ModelRunner& runner, const ProfilerOptions& options,
                                             const ProfileProgress& progress) {
  const int max_pos = runner.config().max_position_embeddings;
  const int bs = runner.block_size();
  const int64_t capacity = static_cast<int64_t>(runner.num_blocks()) * bs;
  const int max_len = static_cast<int>(std::min<int64_t>(capacity - bs, max_pos - 1));
  if (absl::Status s = CheckGrid(options.prompt_lens, "prompt lengths", 2, max_len); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckGrid(options.batch_sizes, "batch sizes", 1, 4096); !s.ok()) return s;
  if (absl::Status s = CheckGrid(options.contexts, "contexts", 0, max_pos - 2); !s.ok()) return s;
  if (options.repeats < 1 || options.repeats > 1000) {
    return absl::InvalidArgumentError("repeats: must be in [1, 1000]");
  }
  if (options.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("max_num_batched_tokens: must be >= 1");
  }
  for (ModelRunner* n : options.neighbours) {
    if (n == nullptr || n == &runner || n->block_size() != bs ||
        n->num_blocks() != runner.num_blocks() ||
        n->config().vocab_size != runner.config().vocab_size) {
      return absl::InvalidArgumentError(
          "neighbours: each must be another runner of the same model and cache geometry");
    }
  }
  const KvCacheLayout layout = runner.kv_layout();
  DeviceProfile p;
  p.block_size = bs;
  p.kv_capacity_tokens = capacity;
  p.kv_bytes_per_token = static_cast<int64_t>(layout.num_layers) * 2 * layout.num_kv_heads *
                         layout.head_dim * layout.elem_bytes;
  p.max_num_batched_tokens = options.max_num_batched_tokens;
  const bool transfer = !options.transfer_backend.empty() && options.transfer_backend != "none";
  if (transfer) p.transfer_backend = options.transfer_backend;

  const int hits = static_cast<int>(options.prompt_lens.size());  // half of each prompt cached
  if (!options.prefill_batch_prompts.empty()) {
    if (absl::Status s = CheckGrid(options.prefill_batch_prompts, "prefill batch prompts", 2, 4096);
        !s.ok()) {
      return s;
    }
    if (options.prefill_batch_tokens < 1 ||
        options.prefill_batch_tokens > options.prompt_lens.back()) {
      return absl::InvalidArgumentError(absl::StrCat("prefill batch tokens: must be in [1, ",
                                                     options.prompt_lens.back(),
                                                     "] (the longest prompt length)"));
    }
  }
  // Batched points whose blocks fit the cache.
  std::vector<int> batch_prompts;
  for (int k : options.prefill_batch_prompts) {
    const int64_t blocks = static_cast<int64_t>(k) * ((options.prefill_batch_tokens + bs - 1) / bs);
    if (blocks <= runner.num_blocks()) batch_prompts.push_back(k);
  }
  int decode_points = 0;
  for (int b : options.batch_sizes) {
    for (int c : options.contexts) {
      if (static_cast<int64_t>(b) * (c / bs + 1) <= runner.num_blocks()) ++decode_points;
    }
  }
  const int total = static_cast<int>(options.prompt_lens.size()) + hits +
                    static_cast<int>(batch_prompts.size()) + decode_points +
                    (transfer ? static_cast<int>(options.prompt_lens.size()) : 0);
  int done = 0;
  const auto tick = [&](const std::string& what) {
    ++done;
    if (progress) progress(done, total, what);
  };

  p.neighbours = static_cast<int>(options.neighbours.size());
  Neighbours neighbours(options.neighbours, options);
  Measurer m(runner, options);
  for (int len : options.prompt_lens) {
    neighbours.Set([len](Measurer& n) { return n.Prefill(0, len); });
    absl::StatusOr<double> ms = MedianMs(options.repeats, [&] { return m.Prefill(0, len); });
    if (!ms.ok()) return ms.status();
    p.prefill.push_back({len, 0, *ms});
    tick(absl::StrCat("prefill ", len, " tokens"));
  }
  for (int len : options.prompt_lens) {
    const int cached = len / 2 / bs * bs;  // whole blocks, as the prefix cache hits
    if (cached == 0) {
      tick(absl::StrCat("prefill ", len, " tokens, no whole block to hit"));
      continue;
    }
    neighbours.Set([cached, len](Measurer& n) { return n.Prefill(cached, len); });
    absl::StatusOr<double> ms = MedianMs(options.repeats, [&] { return m.Prefill(cached, len); });
    if (!ms.ok()) return ms.status();
    p.prefill.push_back({len, cached, *ms});
    tick(absl::StrCat("prefill ", len, " tokens, ", cached, " cached"));
  }
  const int batch_len = options.prefill_batch_tokens;
  for (int k : batch_prompts) {
    neighbours.Set([k, batch_len](Measurer& n) { return n.PrefillBatch(k, batch_len); });
    absl::StatusOr<double> ms =
        MedianMs(options.repeats, [&] { return m.PrefillBatch(k, batch_len); });
    if (!ms.ok()) return ms.status();
    p.prefill_batches.push_back({k, batch_len, *ms});
    tick(absl::StrCat("prefill ", k, " prompts of ", batch_len, " tokens in one step"));
  }
  std::vector<std::string> skipped;
  for (int b : options.batch_sizes) {
    bool any = false;
    for (int c : options.contexts) {
      if (static_cast<int64_t>(b) * (c / bs + 1) > runner.num_blocks()) {
        skipped.push_back(absl::StrCat(b, "x", c));
        continue;
      }
      neighbours.Set([b, c](Measurer& n) { return n.Decode(b, c); });
      absl::StatusOr<double> ms = MedianMs(options.repeats, [&] { return m.Decode(b, c); });
      if (!ms.ok()) return ms.status();
      p.decode.push_back({b, c, *ms});
      any = true;
      tick(absl::StrCat("decode batch ", b, " at context ", c));
    }
    if (any && p.decode.size() % options.contexts.size() != 0) {
      // A batch that fits only some contexts would leave a ragged grid: drop it.
      p.decode.resize(p.decode.size() - p.decode.size() % options.contexts.size());
    }
  }
  if (p.decode.empty()) {
    return absl::InvalidArgumentError(
        "no decode point fits the KV cache: use smaller batch sizes or contexts, or a larger "
        "cache");
  }
  // Transfers run between two agents of this process: the neighbours are done by then.
  if (absl::Status s = neighbours.Stop(); !s.ok()) return s;
  if (transfer) {
    const size_t bytes = static_cast<size_t>(p.kv_bytes_per_token) * options.prompt_lens.back() +
                         layout.block_bytes * 2 * layout.num_layers;
    absl::StatusOr<std::unique_ptr<TransferPair>> pair =
        TransferPair::Create(options.transfer_backend, bytes);
    if (!pair.ok()) return pair.status();
    for (int len : options.prompt_lens) {
      // One op per (layer, K or V, block), block after block: the handoff's shape.
      const int blocks = (len + bs - 1) / bs;
      std::vector<kvtransfer::CopyOp> ops;
      size_t offset = 0;
      for (int l = 0; l < layout.num_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          for (int i = 0; i < blocks; ++i) {
            ops.push_back({offset, offset, layout.block_bytes});
            offset += layout.block_bytes;
          }
        }
      }
      absl::StatusOr<double> ms = MedianMs(options.repeats, [&] { return (*pair)->Write(ops); });
      if (!ms.ok()) return ms.status();
      p.transfer.push_back({len, static_cast<int64_t>(offset), *ms});
      tick(absl::StrCat("transfer ", len, " tokens over ", options.transfer_backend));
    }
  }
  return p;
}

}  // namespace tandem::planning
