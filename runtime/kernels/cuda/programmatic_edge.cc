#include "runtime/kernels/cuda/programmatic_edge.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/programmatic_edge_internal.h"

namespace tandem::cuda {
namespace {

// Device scratch freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

// Graph and executable freed on scope exit.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~CapturedGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

// Captures the late writer, a programmatic edge and `launch` into `out`. False (with CUDA's
// last error cleared and no capture left open) when any step of the capture fails.
bool CaptureProbe(cudaStream_t s, uint16_t* input, size_t count, uint32_t pattern, int delay_us,
                  absl::FunctionRef<absl::Status()> launch, CapturedGraph* out) {
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  bool ok = internal::LaunchBf16PatternWriter(input, count, pattern, delay_us,
                                              /*trigger_first=*/true, s) == cudaSuccess;
  ok = ok && MakeCaptureDependenciesProgrammatic(s).ok();
  ok = ok && launch().ok();
  cudaGraph_t graph = nullptr;
  const bool ended = cudaStreamEndCapture(s, &graph) == cudaSuccess;
  out->graph = graph;
  ok = ok && ended && graph != nullptr && cudaGraphInstantiate(&out->exec, graph, 0) == cudaSuccess;
  if (!ok) cudaGetLastError();
  return ok;
}

}  // namespace

absl::Status MakeCaptureDependenciesProgrammatic(void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t count = 0;
  RETURN_IF_CUDA_ERROR(
      cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, &edges, &count),
      "cudaStreamGetCaptureInfo");
  if (status != cudaStreamCaptureStatusActive || count == 0) return absl::OkStatus();
  std::vector<cudaGraphNode_t> nodes(deps, deps + count);
  std::vector<cudaGraphEdgeData> programmatic(count);
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type;
    RETURN_IF_CUDA_ERROR(cudaGraphNodeGetType(nodes[i], &type), "cudaGraphNodeGetType");
    if (type != cudaGraphNodeTypeKernel) return absl::OkStatus();
    if (edges != nullptr && edges[i].type == cudaGraphDependencyTypeProgrammatic) continue;
    programmatic[i] = cudaGraphEdgeData{};
    programmatic[i].type = cudaGraphDependencyTypeProgrammatic;
    programmatic[i].from_port = cudaGraphKernelNodePortProgrammatic;
  }
  for (size_t i = 0; i < count; ++i) {
    if (edges != nullptr && edges[i].type == cudaGraphDependencyTypeProgrammatic) {
      programmatic[i] = edges[i];
    }
  }
  RETURN_IF_CUDA_ERROR(cudaStreamUpdateCaptureDependencies(s, nodes.data(), programmatic.data(),
                                                           count, cudaStreamSetCaptureDependencies),
                       "cudaStreamUpdateCaptureDependencies");
  return absl::OkStatus();
}

absl::Status QueueLateBf16Pattern(void* stream, void* data, size_t count, uint32_t pattern,
                                  int delay_us) {
  if (data == nullptr || count == 0 || delay_us < 0) {
    return absl::InvalidArgumentError("QueueLateBf16Pattern: null data, no values or delay < 0");
  }
  RETURN_IF_CUDA_ERROR(
      internal::LaunchBf16PatternWriter(static_cast<uint16_t*>(data), count, pattern, delay_us,
                                        true, static_cast<cudaStream_t>(stream)),
      "late pattern writer");
  return absl::OkStatus();
}

absl::StatusOr<bool> ProbeWaitsForPredecessor(void* stream, void* input, size_t input_count,
                                              void* output, size_t output_bytes,
                                              absl::FunctionRef<absl::Status()> launch,
                                              const ProbeOptions& options) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (input == nullptr || output == nullptr || input_count == 0 || output_bytes == 0 ||
      output_bytes % 4 != 0 || options.trials < 1 || options.delay_us < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ProbeWaitsForPredecessor: bad arguments (input_count ", input_count, ", output_bytes ",
        output_bytes, ", trials ", options.trials, ", delay_us ", options.delay_us, ")"));
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RETURN_IF_CUDA_ERROR(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::InvalidArgumentError("ProbeWaitsForPredecessor: the stream is being captured");
  }
  auto* in = static_cast<uint16_t*>(input);
  const size_t words = output_bytes / 4;
  DeviceBuffer early, mismatches;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&early.ptr, output_bytes), "cudaMalloc(probe output)");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&mismatches.ptr, sizeof(unsigned int)),
                       "cudaMalloc(probe counter)");
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(mismatches.ptr, 0, sizeof(unsigned int), s),
                       "cudaMemsetAsync(probe counter)");
  constexpr uint32_t kFresh = 0x5eed;
  CapturedGraph graph;
  if (!CaptureProbe(s, in, input_count, kFresh, options.delay_us, launch, &graph)) return false;
  for (int t = 0; t < options.trials; ++t) {
    // A stale input, the probed graph (the fresh one lands late), its output kept aside.
    RETURN_IF_CUDA_ERROR(
        internal::LaunchBf16PatternWriter(in, input_count, kFresh + 1 + t, 0, false, s),
        "stale pattern writer");
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph.exec, s), "cudaGraphLaunch(probe)");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(early.ptr, output, output_bytes, cudaMemcpyDeviceToDevice, s),
        "cudaMemcpyAsync(probe output)");
    // The reference: `launch` again, queued plainly after the fresh input is complete.
    RETURN_IF_ERROR(launch());
    RETURN_IF_CUDA_ERROR(
        internal::LaunchCountWordMismatches(static_cast<const uint32_t*>(early.ptr),
                                            static_cast<const uint32_t*>(output), words,
                                            static_cast<unsigned int*>(mismatches.ptr), s),
        "probe compare");
  }
  unsigned int host_mismatches = 0;
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(&host_mismatches, mismatches.ptr, sizeof(host_mismatches),
                                       cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync(probe counter)");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "cudaStreamSynchronize(probe)");
  return host_mismatches == 0;
}

}  // namespace tandem::cuda
