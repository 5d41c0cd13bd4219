// Every tandem.v1 message a worker (or the router) takes from a peer, parsed from bytes and run
// through the pure checks and conversions the services apply before anything reaches an engine
// or a transfer backend (runtime/server/proto_convert.h, kv_layout_convert.h; the KV planners;
// the backends' blob decoders). No network, no engine: the service handlers' inline checks
// (prefill/prefill_service.cc, decode/decode_service.cc) are mirrored here in the order they run.
//
// Input: one selector byte (mod 16), then the serialized message:
//   0 PrefillRequest   1 ConnectRequest   2 FenceRequest    3 GenerateRequest  4 CancelRequest
//   5 StatsRequest     6 ConnectResponse  7 PrefillResponse 8 GenerateResponse 9 WorkerStats
//   10 AdmitRequest    11 AdmitResponse   12 MlpComputeRequest (an MLP shard's)
//   13 MlpInfo (an attention worker's, from a shard)
//   14 MlpAttachRequest (a GPU shard's), and the same bytes as MlpHostAttachRequest (a CPU shard's)
//   15 MlpAttachResponse (an attention worker's, from a shard), and as MlpHostAttachResponse
// The worker serves the bundled model (its config.json); its KV is the CPU runner's f32 layout.
// Properties: no crash; conversions round-trip (SamplingParams, KvLayout, TokenLogprobs); an
// accepted compatibility block matches the model; every KV plan an accepted destination gets
// stays inside both layouts (kv_plan_check.h); a real admission queue (prefill/admission_queue.h)
// fed an accepted Admit answers every waiter exactly once, and neither a forged ticket nor a real
// one claimed twice leaves its window with tokens once every slot is gone; an MLP shard computes an
// accepted call over exactly its bytes (runtime/mlp/mlp_shard_checks.h, dense_mlp.h), and an
// accepted shard Info names a layer range inside the model; an accepted Attach request asks for
// rows within the shard's bound, and an accepted Attach answer carries handles of exactly the
// IPC handle size and a doorbell name that cannot leave /dev/shm (ipc_doorbell.h).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/kv_plan_check.h"
#include "kvtransfer/cma/cma_wire.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/nccl/nccl_wire.h"
#include "prefill/admission_queue.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/ipc_doorbell.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/model/model_config.h"
#include "runtime/sampling/sampling_params.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"
#include "tandem/v1/decode.pb.h"
#include "tandem/v1/mlp.pb.h"
#include "tandem/v1/prefill.pb.h"
#include "tandem/v1/worker.pb.h"

namespace {

namespace v1 = tandem::v1;
namespace server = tandem::server;
using tandem::kvtransfer::KvLayout;

constexpr int kMaxEndpoints = 8;  // PrefillService::Connect
using tandem::prefill::AdmissionQueue;
using tandem::prefill::AdmissionStats;

const tandem::ModelConfig& Config() {
  static const tandem::ModelConfig* config = [] {
    absl::StatusOr<tandem::ModelConfig> c = tandem::LoadModelConfig(tandem::fuzz::ModelDir());
    if (!c.ok()) std::abort();
    return new tandem::ModelConfig(*std::move(c));
  }();
  return *config;
}

// The CPU runner's cache (cpu_model_runner.cc): f32, [layer][kv][block], 16-token blocks.
KvLayout CpuLayout(int num_blocks) {
  tandem::KvCacheLayout l;
  const tandem::ModelConfig& c = Config();
  l.num_layers = c.num_layers;
  l.num_blocks = num_blocks;
  l.block_size = 16;
  l.num_kv_heads = c.num_kv_heads;
  l.head_dim = c.head_dim;
  l.elem_bytes = 4;
  l.block_bytes = static_cast<size_t>(l.block_size) * l.num_kv_heads * l.head_dim * l.elem_bytes;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * static_cast<size_t>(num_blocks);
  l.layer_stride = 2 * l.kv_stride;
  return server::ToTransferLayout(l);
}

bool SameFloat(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// FromProto, then ToProto and FromProto again, changes nothing; then the services' validation.
absl::Status CheckSampling(const v1::SamplingParams& proto) {
  const tandem::SamplingParams p = server::SamplingParamsFromProto(proto);
  const tandem::SamplingParams q =
      server::SamplingParamsFromProto(server::SamplingParamsToProto(p));
  FUZZ_CHECK(SameFloat(p.temperature, q.temperature) && p.top_k == q.top_k &&
             SameFloat(p.top_p, q.top_p) && SameFloat(p.min_p, q.min_p) && p.seed == q.seed &&
             SameFloat(p.repetition_penalty, q.repetition_penalty) &&
             SameFloat(p.presence_penalty, q.presence_penalty) &&
             SameFloat(p.frequency_penalty, q.frequency_penalty) &&
             p.stop_token_ids == q.stop_token_ids && p.stop == q.stop &&
             p.max_tokens == q.max_tokens && p.ignore_eos == q.ignore_eos &&
             p.logprobs == q.logprobs && p.skip_special_tokens == q.skip_special_tokens &&
             p.min_tokens == q.min_tokens && p.allowed_token_ids == q.allowed_token_ids &&
             p.include_stop_str_in_output == q.include_stop_str_in_output &&
             p.guided.regex == q.guided.regex && p.guided.choices == q.guided.choices &&
             p.logit_bias.size() == q.logit_bias.size());
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    FUZZ_CHECK(p.logit_bias[i].first == q.logit_bias[i].first &&
               SameFloat(p.logit_bias[i].second, q.logit_bias[i].second));
  }
  const absl::Status s = tandem::ValidateSamplingParams(p, Config().vocab_size);
  if (s.ok()) {
    for (int32_t id : p.stop_token_ids) FUZZ_CHECK(id >= 0 && id < Config().vocab_size);
    FUZZ_CHECK(!p.logprobs.has_value() ||
               (*p.logprobs >= 0 && *p.logprobs <= tandem::kMaxLogprobs));
    FUZZ_CHECK(p.min_tokens >= 0 &&
               p.logit_bias.size() <= static_cast<size_t>(tandem::kMaxLogitBiasEntries));
    for (const auto& [id, bias] : p.logit_bias) {
      FUZZ_CHECK(id >= 0 && id < Config().vocab_size && std::fabs(bias) <= tandem::kMaxLogitBias);
    }
    for (int32_t id : p.allowed_token_ids) FUZZ_CHECK(id >= 0 && id < Config().vocab_size);
  }
  return s;
}

void CheckLayoutRoundTrip(const v1::KvLayout& proto) {
  const KvLayout a = server::KvLayoutFromProto(proto);
  v1::KvLayout back;
  server::KvLayoutToProto(a, &back);
  const KvLayout b = server::KvLayoutFromProto(back);
  FUZZ_CHECK(a.num_layers == b.num_layers && a.num_blocks == b.num_blocks &&
             a.block_size == b.block_size && a.num_kv_heads == b.num_kv_heads &&
             a.head_dim == b.head_dim && a.elem_bytes == b.elem_bytes &&
             a.block_bytes == b.block_bytes && a.layer_stride == b.layer_stride &&
             a.kv_stride == b.kv_stride && a.block_stride == b.block_stride && a.dtype == b.dtype &&
             a.head_begin == b.head_begin && a.total_kv_heads == b.total_kv_heads);
}

void CheckTokenLogprobs(const v1::TokenLogprobs& proto) {
  const tandem::TokenLogprobs a = server::TokenLogprobsFromProto(proto);
  v1::TokenLogprobs back;
  server::TokenLogprobsToProto(a, &back);
  const tandem::TokenLogprobs b = server::TokenLogprobsFromProto(back);
  FUZZ_CHECK(a.token == b.token && SameFloat(a.logprob, b.logprob) && a.top.size() == b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    FUZZ_CHECK(a.top[i].token == b.top[i].token && SameFloat(a.top[i].logprob, b.top[i].logprob));
  }
}

// What the transfer backend named `backend` parses of a peer's connect and region blobs.
void DecodeBlobs(const std::string& backend, const std::string& address,
                 const std::string& region) {
  namespace kv = tandem::kvtransfer;
  if (backend == "cuda_ipc") {
    (void)kv::cuda_ipc::DecodeAgentAddress(address);
    (void)kv::cuda_ipc::DecodeRegionBlob(region);
  } else if (backend == "cma") {
    (void)kv::cma::DecodeAgentAddress(address);
    (void)kv::cma::DecodeRegionBlob(region);
  } else if (backend == "nccl") {
    (void)kv::nccl::DecodeAgentAddress(address);
    (void)kv::nccl::DecodeRegionBlob(region);
  }
  // ucx and loopback parse theirs inside the backend (docs/fuzzing.md).
}

// PrefillService::Prefill's checks, then KvSender::CheckDestination against `destination` (the
// layout the pair agreed on at Connect; here the request's own, or the decode worker's CPU one).
void Prefill(const v1::PrefillRequest& r) {
  if (r.request_id().empty() || r.prompt_token_ids_size() == 0) return;
  if (r.admission_ticket().size() > tandem::prefill::kMaxAdmissionTicketBytes) return;
  if (!CheckSampling(r.sampling()).ok()) return;
  const v1::KvTarget& target = r.target();
  const int num_tokens = r.prompt_token_ids_size();
  {
    // The claim of a ticket nobody issued (a forged or stale one): served, counted while the
    // slot lives, and the window is empty again after.
    auto queue = AdmissionQueue::Create({.window_tokens = 64, .ticket_lease = absl::Seconds(1)});
    {
      std::unique_ptr<AdmissionQueue::Slot> slot =
          queue->Claim(r.admission_ticket(), r.request_id(), num_tokens);
      FUZZ_CHECK(slot != nullptr && queue->stats().window_used_tokens == num_tokens);
    }
    FUZZ_CHECK(queue->stats().window_used_tokens == 0);
  }
  if (target.num_cached_tokens() < 0 || target.num_cached_tokens() > num_tokens) return;
  if (target.has_layout()) CheckLayoutRoundTrip(target.layout());
  const KvLayout destination =
      target.has_layout() ? server::KvLayoutFromProto(target.layout()) : CpuLayout(512);
  const std::vector<int32_t> block_ids(target.block_ids().begin(), target.block_ids().end());
  (void)tandem::fuzz::CheckDestination(CpuLayout(256), destination, block_ids, num_tokens,
                                       target.num_cached_tokens());
}

// PrefillService::Connect: compatibility first, then each endpoint's layout and blobs.
void Connect(const v1::ConnectRequest& r) {
  const tandem::ModelConfig& config = Config();
  const absl::Status compatible = server::CheckCompatibility(
      config, r.compatibility(), absl::StrCat("decode worker ", r.decode_worker()));
  if (!compatible.ok()) return;
  const v1::KvCompatibility& c = r.compatibility();
  FUZZ_CHECK(c.layout_version() == server::kKvLayoutVersion);
  FUZZ_CHECK(c.num_layers() == config.num_layers && c.num_kv_heads() == config.num_kv_heads &&
             c.head_dim() == config.head_dim && c.vocab_size() == config.vocab_size &&
             c.hidden_size() == config.hidden_size);
  if (r.endpoints_size() == 0 || r.endpoints_size() > kMaxEndpoints) return;
  const KvLayout local = CpuLayout(256);
  for (const v1::KvEndpoint& endpoint : r.endpoints()) {
    CheckLayoutRoundTrip(endpoint.layout());
    const KvLayout layout = server::KvLayoutFromProto(endpoint.layout());
    if (!tandem::fuzz::AdmitLayout(local, layout).ok()) continue;
    DecodeBlobs(endpoint.backend(), endpoint.agent_address(), endpoint.region());
  }
}

// DecodeService::Generate's checks and the engine's (Engine::Validate) on the prompt.
void Generate(const v1::GenerateRequest& r) {
  if (r.request_id().empty() || r.prompt_token_ids().empty()) return;
  const absl::Status sampling = CheckSampling(r.sampling());
  if (!sampling.ok()) return;
  const tandem::ModelConfig& config = Config();
  for (int32_t id : r.prompt_token_ids()) {
    if (id < 0 || id >= config.vocab_size) return;
  }
  const tandem::SamplingParams p = server::SamplingParamsFromProto(r.sampling());
  const int64_t len = r.prompt_token_ids_size();
  if (len >= config.max_position_embeddings) return;
  if (p.max_tokens.has_value()) FUZZ_CHECK(*p.max_tokens > 0);
}

// PrefillService::Admit's checks, then the admission queue the service hands the call to: the
// request waits behind another prompt that fills the window, is admitted when that prompt's slot
// goes, claims its ticket (the real one, then again, then a forged one) and leaves nothing behind.
void Admit(const v1::AdmitRequest& r) {
  const int max_model_len = Config().max_position_embeddings;
  if (r.request_id().empty() || r.request_id().size() > tandem::prefill::kMaxAdmitRequestIdBytes)
    return;
  if (r.num_prompt_tokens() < 1 || r.num_prompt_tokens() > max_model_len) return;
  const int64_t tokens = r.num_prompt_tokens();
  auto queue = AdmissionQueue::Create({.window_tokens = 256, .ticket_lease = absl::Seconds(30)});
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int answers = 0;
  absl::StatusOr<std::string> got = absl::UnknownError("no answer");
  std::unique_ptr<AdmissionQueue::Slot> blocker;
  {
    absl::StatusOr<std::string> first = absl::UnknownError("no answer");
    (void)queue->Wait("blocker", 0, 256, deadline,
                      [&](absl::StatusOr<std::string> t) { first = std::move(t); });
    FUZZ_CHECK(first.ok() && first->size() <= tandem::prefill::kMaxAdmissionTicketBytes);
    blocker = queue->Claim(*first, "blocker", 256);
  }
  const int64_t waiter = queue->Wait(r.request_id(), r.priority(), tokens, deadline,
                                     [&](absl::StatusOr<std::string> t) {
                                       ++answers;
                                       got = std::move(t);
                                     });
  FUZZ_CHECK(answers == 0 && queue->stats().waiting == 1 &&
             queue->stats().waiting_tokens == tokens);
  blocker.reset();  // room: the waiter is admitted on this thread
  FUZZ_CHECK(answers == 1 && got.ok() && !got->empty() &&
             got->size() <= tandem::prefill::kMaxAdmissionTicketBytes);
  FUZZ_CHECK(!queue->Cancel(waiter));  // answered already: nothing to take back
  FUZZ_CHECK(queue->stats().window_used_tokens == tokens);
  {
    std::unique_ptr<AdmissionQueue::Slot> slot = queue->Claim(*got, r.request_id(), tokens);
    FUZZ_CHECK(queue->stats().window_used_tokens == tokens);  // the ticket's tokens moved
    // Claimed again (a replayed request), and a ticket of someone else's request: both served.
    std::unique_ptr<AdmissionQueue::Slot> again = queue->Claim(*got, r.request_id(), tokens);
    std::unique_ptr<AdmissionQueue::Slot> foreign = queue->Claim(*got, "other", 1);
    FUZZ_CHECK(queue->stats().window_used_tokens == 2 * tokens + 1);
  }
  FUZZ_CHECK(queue->stats().window_used_tokens == 0 && queue->stats().admitted == 2);
  // After Close, a wait is answered UNAVAILABLE at once, exactly once.
  queue->Close();
  int late = 0;
  (void)queue->Wait(r.request_id(), r.priority(), tokens, deadline,
                    [&](absl::StatusOr<std::string> t) {
                      ++late;
                      FUZZ_CHECK(absl::IsUnavailable(t.status()));
                    });
  FUZZ_CHECK(late == 1);
}

// A small MLP shard (layers 1:3 of 4, hidden 8, intermediate 16, at most 64 rows a call): an
// accepted call is computed the way MlpShardService does, from a buffer its bytes fill exactly.
void MlpCompute(const v1::MlpComputeRequest& r) {
  static const tandem::mlp::DenseMlpWeights* weights = [] {
    auto* w = new tandem::mlp::DenseMlpWeights;
    w->shape = {.first_layer = 1, .end_layer = 3, .hidden_size = 8, .intermediate_size = 16};
    for (int l = 1; l < 3; ++l) {
      tandem::mlp::DenseMlpLayer layer;
      layer.gate_up.assign(2 * 16 * 8, 0.25f);
      layer.down.assign(8 * 16, -0.5f);
      w->layers.push_back(std::move(layer));
    }
    return w;
  }();
  if (!tandem::mlp::CheckComputeRequest(r, weights->shape, 64).ok()) return;
  if (r.session() != 0) {
    // The host data plane: the rows are in the session's slot (ShardHostSession::Claim bounds
    // slot and rows), never in the message.
    FUZZ_CHECK(r.activations().empty() && r.rows() >= 1 && r.rows() <= 64);
    return;
  }
  FUZZ_CHECK(r.slot() == 0);
  const int rows = static_cast<int>(r.rows());
  const size_t bytes = tandem::mlp::ComputeBytes(rows, weights->shape);
  FUZZ_CHECK(r.activations().size() == bytes && rows >= 1 && rows <= 64);
  std::vector<float> x(bytes / sizeof(float)), y(x.size()), scratch;
  std::memcpy(x.data(), r.activations().data(), bytes);
  tandem::mlp::DenseMlpForward(weights->layer(static_cast<int>(r.layer())), weights->shape,
                               x.data(), rows, y.data(), &scratch);
}

void MlpInfo(const v1::MlpInfo& info) {
  const tandem::ModelConfig& c = Config();
  const tandem::mlp::MlpShape model{.first_layer = 0,
                                    .end_layer = c.num_layers,
                                    .hidden_size = c.hidden_size,
                                    .intermediate_size = c.intermediate_size};
  tandem::mlp::MlpShape served;
  if (!tandem::mlp::CheckShardInfo(info, model, "", &served).ok()) return;
  FUZZ_CHECK(served.first_layer >= 0 && served.first_layer < served.end_layer &&
             served.end_layer <= c.num_layers && served.hidden_size == c.hidden_size);
}

void MlpAttach(const v1::MlpAttachRequest& r) {
  if (!tandem::mlp::CheckAttachRequest(r, 4096).ok()) return;
  FUZZ_CHECK(r.max_rows() >= 1 && r.max_rows() <= 4096 && r.gpu_uuid().size() == 32 &&
             !r.boot_id().empty() && r.boot_id().size() <= 64);
}

// The same bytes as the host data plane's attach request and answer (AttachHost).
void MlpHostAttach(const v1::MlpHostAttachRequest& r) {
  if (!tandem::mlp::CheckHostAttachRequest(r, 4096).ok()) return;
  FUZZ_CHECK(r.backend() == "cma" || r.backend() == "ucx");
  FUZZ_CHECK(!r.agent().empty() && r.agent().size() <= tandem::mlp::kMaxAgentBytes);
  FUZZ_CHECK(!r.address().empty() && r.address().size() <= tandem::mlp::kMaxBlobBytes);
  FUZZ_CHECK(r.slots() >= 1 && r.slots() <= tandem::mlp::kMaxHostSlots);
  FUZZ_CHECK(r.slot_rows() >= 1 && r.slot_rows() <= 4096);
}

void MlpHostAttachAnswer(const v1::MlpHostAttachResponse& r) {
  if (!tandem::mlp::CheckHostAttachResponse(r).ok()) return;
  FUZZ_CHECK(r.session() != 0 && !r.output_region().empty() &&
             r.output_region().size() <= tandem::mlp::kMaxBlobBytes);
}

void MlpAttachAnswer(const v1::MlpAttachResponse& r) {
  if (!tandem::mlp::CheckAttachResponse(r, 256).ok()) return;
  for (const std::string* h : {&r.input_memory(), &r.output_memory(), &r.flags()}) {
    FUZZ_CHECK(h->size() == tandem::mlp::kIpcHandleBytes);
  }
  FUZZ_CHECK(r.max_rows() == 256);
  FUZZ_CHECK(tandem::mlp::IpcDoorbell::ValidName(r.doorbell()));
  FUZZ_CHECK(r.doorbell().find('/', 1) == std::string::npos);
  FUZZ_CHECK(r.doorbell().find("..") == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* bytes = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (data[0] % 16) {
    case 0: {
      v1::PrefillRequest r;
      if (r.ParseFromArray(bytes, n)) Prefill(r);
      break;
    }
    case 1: {
      v1::ConnectRequest r;
      if (r.ParseFromArray(bytes, n)) Connect(r);
      break;
    }
    case 2: {
      v1::FenceRequest r;
      (void)r.ParseFromArray(bytes, n);
      break;
    }
    case 3: {
      v1::GenerateRequest r;
      if (r.ParseFromArray(bytes, n)) Generate(r);
      break;
    }
    case 4: {
      v1::CancelRequest r;
      (void)r.ParseFromArray(bytes, n);
      break;
    }
    case 5: {
      v1::StatsRequest r;
      (void)r.ParseFromArray(bytes, n);
      break;
    }
    case 6: {  // the decode worker's side of the handshake
      v1::ConnectResponse r;
      if (!r.ParseFromArray(bytes, n)) break;
      if (r.backend() == "nccl" && !r.connect_reply().empty()) {
        (void)tandem::kvtransfer::nccl::DecodeConnectReply(r.connect_reply());
      }
      break;
    }
    case 7: {
      v1::PrefillResponse r;
      if (!r.ParseFromArray(bytes, n)) break;
      if (r.has_first_token_logprobs()) CheckTokenLogprobs(r.first_token_logprobs());
      break;
    }
    case 8: {  // the router's side of a stream
      v1::GenerateResponse r;
      if (!r.ParseFromArray(bytes, n)) break;
      for (const v1::TokenLogprobs& lp : r.logprobs()) CheckTokenLogprobs(lp);
      break;
    }
    case 9: {
      v1::WorkerStats r;
      (void)r.ParseFromArray(bytes, n);
      break;
    }
    case 10: {
      v1::AdmitRequest r;
      if (r.ParseFromArray(bytes, n)) Admit(r);
      break;
    }
    case 11: {  // the decode worker's side: the ticket goes back verbatim in PrefillRequest
      v1::AdmitResponse r;
      (void)r.ParseFromArray(bytes, n);
      break;
    }
    case 12: {
      v1::MlpComputeRequest r;
      if (r.ParseFromArray(bytes, n)) MlpCompute(r);
      break;
    }
    case 13: {
      v1::MlpInfo r;
      if (r.ParseFromArray(bytes, n)) MlpInfo(r);
      break;
    }
    case 14: {
      v1::MlpAttachRequest r;
      if (r.ParseFromArray(bytes, n)) MlpAttach(r);
      v1::MlpHostAttachRequest host;
      if (host.ParseFromArray(bytes, n)) MlpHostAttach(host);
      break;
    }
    case 15: {
      v1::MlpAttachResponse r;
      if (r.ParseFromArray(bytes, n)) MlpAttachAnswer(r);
      v1::MlpHostAttachResponse host;
      if (host.ParseFromArray(bytes, n)) MlpHostAttachAnswer(host);
      break;
    }
  }
  return 0;
}
