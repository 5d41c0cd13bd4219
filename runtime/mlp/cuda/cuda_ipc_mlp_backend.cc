#include "runtime/mlp/cuda/cuda_ipc_mlp_backend.h"

#include <cuda.h>  // driver types only: cuMemGetAddressRange comes through the runtime's lookup
#include <cuda_runtime_api.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/mlp/cuda/device_call_slots.h"
#include "runtime/mlp/cuda/ipc_flags.h"
#include "runtime/mlp/cuda/ipc_shard_session.h"
#include "runtime/mlp/ipc_doorbell.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/mlp/shard_info_client.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {
namespace {

using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

std::string GrpcMessage(const grpc::Status& s) {
  return absl::StrCat("gRPC ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

// One shard: its Attach call (kept open; a watcher notices its end), its opened buffers and
// events, and its doorbell.
struct IpcShard {
  std::string address;
  MlpShape shape;
  std::unique_ptr<tandem::v1::MlpShard::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<tandem::v1::MlpAttachResponse>> reader;
  std::thread watcher;
  std::atomic<bool> ended{false};  // the Attach call ended
  bool failed = false;             // a call failed: not used again
  void* in = nullptr;
  void* out = nullptr;
  IpcFlag* flags = nullptr;  // [0] ours after each input copy, [1] the shard's after each layer
  std::unique_ptr<IpcDoorbell> bell;
  int index = 0;  // its failure word in the backend's array

  ~IpcShard() {
    // The mappings first, then the session: the shard frees what they map when the call ends.
    for (void* p : {in, out, static_cast<void*>(flags)}) {
      if (p != nullptr) cudaIpcCloseMemHandle(p);
    }
    bell.reset();
    context.TryCancel();
    if (watcher.joinable()) watcher.join();
    if (reader != nullptr) reader->Finish();
  }
};

class CudaIpcMlpBackend final : public MlpBackend {
 public:
  CudaIpcMlpBackend(std::vector<std::unique_ptr<IpcShard>> shards, MlpShape expected, int device,
                    int max_rows, const RemoteMlpOptions& options)
      : shards_(std::move(shards)),
        expected_(expected),
        device_(device),
        max_rows_(max_rows),
        options_(options) {}

  ~CudaIpcMlpBackend() override {
    slots_.reset();  // waits for the output copies still queued from the shards' buffers
    cudaSetDevice(device_);
    shards_.clear();
    if (failed_host_ != nullptr) cudaFreeHost(failed_host_);
  }

  absl::Status Init() {
    RETURN_IF_ERROR(slots_->Init(device_, "cuda_ipc MLP"));
    // One failure word per shard in mapped pinned memory: the GPU's bounded waits write it, the
    // host reads it after the step (CheckDevice).
    void* p = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostAlloc(&p, shards_.size() * sizeof(uint32_t), cudaHostAllocMapped),
                         "cuda_ipc MLP: failure words");
    failed_host_ = static_cast<uint32_t*>(p);
    for (size_t i = 0; i < shards_.size(); ++i) {
      failed_host_[i] = 0;
      shards_[i]->index = static_cast<int>(i);
    }
    void* device = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&device, p, 0),
                         "cuda_ipc MLP: failure words' device address");
    failed_device_ = static_cast<uint32_t*>(device);
    return absl::OkStatus();
  }

  // After the caller synchronized: a call whose answer the GPU gave up waiting for (the shard
  // died or stalled inside the layer), or that the shard computed on rows it gave up waiting for,
  // left garbage in the step; its shard is not used again.
  absl::Status CheckDevice() override {
    std::vector<std::string> failed;
    for (const auto& shard : shards_) {
      volatile uint32_t* word = &failed_host_[shard->index];
      const uint32_t seq = *word;
      if (seq == 0) continue;
      *word = 0;
      shard->failed = true;
      ++stats_.failures;
      failed.push_back(absl::StrCat(shard->address, " (call ", seq, ")"));
    }
    if (failed.empty()) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat(
        "cuda_ipc MLP: no answer on the GPU within ", absl::FormatDuration(options_.call_timeout),
        " from shard ", absl::StrJoin(failed, ", "),
        ": the shard died or stalled inside a layer; the step's outputs are discarded"));
  }

  std::string_view name() const override { return "cuda_ipc"; }
  MlpShape shape() const override { return expected_; }
  int64_t resident_weight_bytes() const override { return 0; }
  MlpBackendStats stats() const override { return stats_; }
  bool asynchronous() const override { return true; }

  absl::StatusOr<Handle> Submit(int, const float*, int, float*, absl::Time) override {
    return absl::UnimplementedError(
        "cuda_ipc MLP: host rows are not taken; the CUDA runner calls EnqueueOnDevice");
  }
  absl::Status Wait(Handle) override {
    return absl::InvalidArgumentError("cuda_ipc MLP: no host calls");
  }

  bool SupportsDevice(int device_ordinal) const override { return device_ordinal == device_; }
  int device_slots() const override { return DeviceCallSlots::kSlots; }
  int device_max_rows() const override { return max_rows_; }

  absl::Status EnqueueOnDevice(int layer, const void* x, int rows, void* out, void* stream,
                               absl::Time deadline) override {
    if (slots_->any_busy()) {
      return absl::FailedPreconditionError(
          "cuda_ipc MLP: EnqueueOnDevice while SubmitOnDevice calls are in flight");
    }
    ASSIGN_OR_RETURN(IpcShard * shard, PickShard(layer, rows));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const size_t row_bytes = static_cast<size_t>(expected_.hidden_size) * 2;
    for (int done = 0; done < rows;) {
      const int n = std::min(max_rows_, rows - done);
      const size_t offset = static_cast<size_t>(done) * row_bytes;
      uint32_t seq = 0;
      absl::Status st =
          Hand(*shard, layer, static_cast<const char*>(x) + offset, 0, n, s, deadline, &seq);
      if (st.ok()) st = Collect(*shard, seq, 0, n, static_cast<char*>(out) + offset, s);
      if (!st.ok()) return Failed(*shard, st);
      done += n;
    }
    stats_.rows += rows;
    return absl::OkStatus();
  }

  absl::StatusOr<Handle> SubmitOnDevice(int layer, const void* x, int rows, int row_offset,
                                        void* out, void* stream, absl::Time deadline) override {
    if (rows < 1 || row_offset < 0 || int64_t{row_offset} + rows > max_rows_) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc MLP: rows [", row_offset, ", +",
                                                     rows, ") outside the ", max_rows_,
                                                     " rows of a session"));
    }
    ASSIGN_OR_RETURN(DeviceCallSlots::Slot * slot,
                     slots_->Find(row_offset, row_offset + rows, /*exclusive_rows=*/true));
    cudaStream_t slot_stream = static_cast<cudaStream_t>(slot->stream);
    ASSIGN_OR_RETURN(IpcShard * shard, PickShard(layer, rows));
    uint32_t seq = 0;
    absl::Status st =
        Hand(*shard, layer, x, row_offset, rows, static_cast<cudaStream_t>(stream), deadline, &seq);
    // The answer lands on the slot's stream: the caller's stream waits for it only at the Join.
    if (st.ok()) st = Collect(*shard, seq, row_offset, rows, out, slot_stream);
    if (st.ok()) {
      st = CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(slot->done), slot_stream),
                      "cudaEventRecord");
    }
    if (!st.ok()) return Failed(*shard, st);
    stats_.rows += rows;
    return slots_->Issue(slot, row_offset, row_offset + rows);
  }

  absl::Status JoinOnDevice(Handle handle, void* stream) override {
    return slots_->Join(handle, stream);
  }

 private:
  absl::StatusOr<IpcShard*> PickShard(int layer, int rows) {
    if (!expected_.Serves(layer) || rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc MLP: layer ", layer, ", ", rows, " rows"));
    }
    ++stats_.calls;
    for (const auto& s : shards_) {
      if (s->shape.Serves(layer) && !s->failed && !s->ended.load()) return s.get();
    }
    ++stats_.failures;
    return absl::UnavailableError(absl::StrCat("cuda_ipc MLP: no live shard serves layer ", layer,
                                               " (a shard stopped or failed)"));
  }

  absl::Status Failed(IpcShard& shard, const absl::Status& st) {
    shard.failed = true;
    ++stats_.failures;
    return absl::Status(st.code(),
                        absl::StrCat("cuda_ipc MLP shard ", shard.address, ": ", st.message()));
  }

  // Queues the rows' copy into the shard's input buffer at `row_offset` on `s` and the signal of
  // the call's sequence number on the input flag behind it, and rings the doorbell; returns
  // (with the call's sequence number) once the shard has queued the layer behind its bounded
  // wait for that signal.
  absl::Status Hand(IpcShard& shard, int layer, const void* x, int row_offset, int n,
                    cudaStream_t s, absl::Time deadline, uint32_t* seq_out) {
    const size_t offset = static_cast<size_t>(row_offset) * expected_.hidden_size * 2;
    const size_t bytes = static_cast<size_t>(n) * expected_.hidden_size * 2;
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(static_cast<char*>(shard.in) + offset, x, bytes,
                                         cudaMemcpyDeviceToDevice, s),
                         "rows into the shard's input buffer");
    RETURN_IF_ERROR(EnqueueIpcSignal(&shard.flags[0], shard.bell->next_seq(), nullptr, s));
    const uint32_t seq = shard.bell->Ring(layer, row_offset, n);
    *seq_out = seq;
    ASSIGN_OR_RETURN(
        const int32_t code,
        shard.bell->WaitDone(seq, std::min(deadline, absl::Now() + options_.call_timeout)));
    if (code == kIpcCallRefused) {
      return absl::InternalError(absl::StrCat("refused layer ", layer, " with ", n, " rows"));
    }
    if (code != kIpcCallOk) {
      return absl::InternalError(absl::StrCat("failed layer ", layer, " (code ", code, ")"));
    }
    return absl::OkStatus();
  }

  // Queues, on `s`, a bounded wait for the shard's signal of call `seq` (ipc_flags.h: never an
  // event of the shard's process, which would never fire if it died) and the copy of the rows at
  // `row_offset` of its output buffer into `out`.
  absl::Status Collect(IpcShard& shard, uint32_t seq, int row_offset, int n, void* out,
                       cudaStream_t s) {
    const size_t offset = static_cast<size_t>(row_offset) * expected_.hidden_size * 2;
    const size_t bytes = static_cast<size_t>(n) * expected_.hidden_size * 2;
    RETURN_IF_ERROR(
        EnqueueIpcWait(&shard.flags[1], seq,
                       static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.call_timeout)),
                       failed_device_ + shard.index, s));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out, static_cast<const char*>(shard.out) + offset, bytes,
                                         cudaMemcpyDeviceToDevice, s),
                         "rows from the shard's output buffer");
    return absl::OkStatus();
  }

  std::vector<std::unique_ptr<IpcShard>> shards_;
  const MlpShape expected_;
  const int device_;
  const int max_rows_;
  const RemoteMlpOptions options_;
  MlpBackendStats stats_;
  std::unique_ptr<DeviceCallSlots> slots_ = std::make_unique<DeviceCallSlots>();
  uint32_t* failed_host_ = nullptr;    // mapped pinned: one word per shard
  uint32_t* failed_device_ = nullptr;  // its device address
};

// Opens one IPC buffer of the shard and checks that its allocation holds `bytes`.
absl::Status OpenBuffer(const std::string& handle_bytes, size_t bytes, MemGetAddressRangeFn range,
                        void** opened) {
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
  void* p = nullptr;
  RETURN_IF_CUDA_ERROR(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess),
                       "cudaIpcOpenMemHandle (the shard must run on this host, in this IPC "
                       "namespace)");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS ||
      reinterpret_cast<CUdeviceptr>(p) != base || size < bytes) {
    cudaIpcCloseMemHandle(p);
    return absl::InvalidArgumentError(absl::StrCat(
        "a buffer the shard sent maps ", size, " bytes, less than the ", bytes, " it must hold"));
  }
  *opened = p;
  return absl::OkStatus();
}

absl::Status AttachShard(IpcShard& shard, const MlpShape& expected, int device, int max_rows,
                         MemGetAddressRangeFn range, const RemoteMlpOptions& options) {
  tandem::v1::MlpAttachRequest request;
  request.set_max_rows(static_cast<uint32_t>(max_rows));
  ASSIGN_OR_RETURN(std::string uuid, GpuUuid(device));
  ASSIGN_OR_RETURN(std::string boot, HostBootId());
  request.set_gpu_uuid(uuid);
  request.set_boot_id(boot);
  shard.reader = shard.stub->Attach(&shard.context, request);
  tandem::v1::MlpAttachResponse response;
  // The first message within the connect timeout; the call itself stays open.
  auto first = std::async(std::launch::async, [&] { return shard.reader->Read(&response); });
  if (first.wait_for(absl::ToChronoMilliseconds(options.connect_timeout)) !=
      std::future_status::ready) {
    shard.context.TryCancel();
  }
  if (!first.get()) {
    const grpc::Status s = shard.reader->Finish();
    shard.reader.reset();
    return absl::Status(
        s.ok() ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(s.error_code()),
        absl::StrCat("Attach: ", s.ok() ? "no answer" : GrpcMessage(s)));
  }
  RETURN_IF_ERROR(CheckAttachResponse(response, max_rows));
  const size_t bytes = static_cast<size_t>(max_rows) * expected.hidden_size * 2;
  RETURN_IF_ERROR(OpenBuffer(response.input_memory(), bytes, range, &shard.in));
  RETURN_IF_ERROR(OpenBuffer(response.output_memory(), bytes, range, &shard.out));
  void* flags = nullptr;
  RETURN_IF_ERROR(OpenBuffer(response.flags(), 2 * sizeof(IpcFlag), range, &flags));
  shard.flags = static_cast<IpcFlag*>(flags);
  ASSIGN_OR_RETURN(IpcDoorbell bell, IpcDoorbell::Open(response.doorbell()));
  shard.bell = std::make_unique<IpcDoorbell>(std::move(bell));
  IpcShard* s = &shard;
  shard.watcher = std::thread([s] {
    tandem::v1::MlpAttachResponse more;
    while (s->reader->Read(&more)) {
    }
    s->ended.store(true);
  });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaIpcMlpBackend(
    const std::vector<std::string>& addresses,
    std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
    const std::string& model_fingerprint, int device_ordinal, int max_rows,
    const RemoteMlpOptions& options) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("cuda_ipc MLP: no shard address (cuda_ipc:HOST:PORT,...)");
  }
  if (max_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc MLP: max_rows ", max_rows));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_ordinal), "cuda_ipc MLP: cudaSetDevice");
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  RETURN_IF_CUDA_ERROR(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                        cudaEnableDefault, &found),
                       "cuda_ipc MLP: looking up cuMemGetAddressRange");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::UnavailableError("cuda_ipc MLP: the driver has no cuMemGetAddressRange");
  }
  const auto range = reinterpret_cast<MemGetAddressRangeFn>(fn);
  std::vector<std::unique_ptr<IpcShard>> shards;
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  for (const std::string& address : addresses) {
    auto shard = std::make_unique<IpcShard>();
    shard->address = address;
    shard->stub = tandem::v1::MlpShard::NewStub(identity->Dial(address));
    ASSIGN_OR_RETURN(tandem::v1::MlpInfo info,
                     FetchShardInfo(*shard->stub, address, expected, model_fingerprint, give_up,
                                    "cuda_ipc MLP", &shard->shape));
    if (info.max_rows() < static_cast<uint32_t>(max_rows)) {
      return absl::FailedPreconditionError(absl::StrCat("cuda_ipc MLP: shard ", address, " takes ",
                                                        info.max_rows(),
                                                        " rows a call, fewer than ", max_rows));
    }
    if (absl::Status s = AttachShard(*shard, expected, device_ordinal, max_rows, range, options);
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("cuda_ipc MLP: shard ", address, ": ", s.message()));
    }
    shards.push_back(std::move(shard));
  }
  std::vector<MlpShape> served;
  for (const auto& s : shards) served.push_back(s->shape);
  if (const std::vector<int> unserved = UnservedLayers(expected, served); !unserved.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda_ipc MLP: no shard serves layer(s) ", absl::StrJoin(unserved, ",")));
  }
  auto backend = std::make_unique<CudaIpcMlpBackend>(std::move(shards), expected, device_ordinal,
                                                     max_rows, options);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<MlpBackend>(std::move(backend));
}

}  // namespace tandem::mlp
