// GPU test of the programmatic-edge helpers (programmatic_edge.h): the probe tells a consumer that
// waits for its predecessor (griddepcontrol.wait) from one that reads at once, and
// MakeCaptureDependenciesProgrammatic turns exactly the edges from kernel nodes programmatic.
// Skipped without a GPU; the probe's verdicts need compute capability 9.0+ (before it a
// programmatic edge orders like a plain one, so nothing starts early).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/programmatic_edge.h"
#include "runtime/kernels/cuda/programmatic_edge_internal.h"

namespace tandem {
namespace {

using testing_util::CudaKernelTest;

class ProgrammaticEdgeTest : public CudaKernelTest {
 protected:
  bool Hopper() {
    absl::StatusOr<DeviceCapabilities> caps = device_->Capabilities();
    EXPECT_TRUE(caps.ok()) << caps.status();
    return caps.ok() && caps->compute_capability_major >= 9;
  }

  // The probe's verdict on a word copy of `words` words that waits or not.
  absl::StatusOr<bool> ProbeCopy(size_t words, bool wait) {
    DeviceBuffer in = Alloc(words * 4), out = Alloc(words * 4);
    const auto s = static_cast<cudaStream_t>(stream());
    return cuda::ProbeWaitsForPredecessor(
        stream(), in.data, words * 2, out.data, words * 4, [&]() -> absl::Status {
          if (cuda::internal::LaunchWordCopy(static_cast<const uint32_t*>(in.data),
                                             static_cast<uint32_t*>(out.data), words, wait,
                                             s) != cudaSuccess) {
            return absl::InternalError("copy launch failed");
          }
          return absl::OkStatus();
        });
  }
};

TEST_F(ProgrammaticEdgeTest, ProbePassesAConsumerThatWaits) {
  for (size_t words : {size_t{1} << 10, size_t{1} << 20}) {
    absl::StatusOr<bool> waits = ProbeCopy(words, /*wait=*/true);
    ASSERT_TRUE(waits.ok()) << waits.status();
    EXPECT_TRUE(*waits) << words << " words";
  }
}

TEST_F(ProgrammaticEdgeTest, ProbeFlagsAConsumerThatReadsAtOnce) {
  if (!Hopper()) GTEST_SKIP() << "programmatic edges start nothing early before sm_90";
  for (size_t words : {size_t{1} << 10, size_t{1} << 20}) {
    absl::StatusOr<bool> waits = ProbeCopy(words, /*wait=*/false);
    ASSERT_TRUE(waits.ok()) << waits.status();
    EXPECT_FALSE(*waits) << words << " words: a copy that does not wait passed the probe";
  }
}

TEST_F(ProgrammaticEdgeTest, ProbeRejectsBadArguments) {
  DeviceBuffer b = Alloc(64);
  const auto noop = []() { return absl::OkStatus(); };
  EXPECT_EQ(cuda::ProbeWaitsForPredecessor(stream(), nullptr, 8, b.data, 16, noop).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::ProbeWaitsForPredecessor(stream(), b.data, 8, b.data, 6, noop).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::ProbeWaitsForPredecessor(stream(), b.data, 8, b.data, 16, noop, {0, 50})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ProgrammaticEdgeTest, CaptureDependenciesTurnProgrammaticAfterKernelsOnly) {
  // Not capturing: a no-op.
  ASSERT_TRUE(cuda::MakeCaptureDependenciesProgrammatic(stream()).ok());
  const size_t words = 1024;
  DeviceBuffer a = Alloc(words * 4), b = Alloc(words * 4);
  const auto s = static_cast<cudaStream_t>(stream());
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  // kernel -> (programmatic) copy -> memset -> (stays plain) copy
  ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), a.data, words * 2, 1, 1).ok());
  ASSERT_TRUE(cuda::MakeCaptureDependenciesProgrammatic(stream()).ok());
  ASSERT_EQ(cuda::internal::LaunchWordCopy(static_cast<const uint32_t*>(a.data),
                                           static_cast<uint32_t*>(b.data), words, true, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.data, 0, words * 4, s), cudaSuccess);
  ASSERT_TRUE(cuda::MakeCaptureDependenciesProgrammatic(stream()).ok());
  ASSERT_EQ(cuda::internal::LaunchWordCopy(static_cast<const uint32_t*>(a.data),
                                           static_cast<uint32_t*>(b.data), words, true, s),
            cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  // Edges: writer -> copy (programmatic), copy -> memset and memset -> copy (plain).
  size_t n = 0;
  ASSERT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), cudaSuccess);
  ASSERT_EQ(n, 3u);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ASSERT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), cudaSuccess);
  int programmatic = 0;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType from_type, to_type;
    ASSERT_EQ(cudaGraphNodeGetType(from[i], &from_type), cudaSuccess);
    ASSERT_EQ(cudaGraphNodeGetType(to[i], &to_type), cudaSuccess);
    const bool kernels = from_type == cudaGraphNodeTypeKernel && to_type == cudaGraphNodeTypeKernel;
    EXPECT_EQ(data[i].type,
              kernels ? cudaGraphDependencyTypeProgrammatic : cudaGraphDependencyTypeDefault)
        << "edge " << i;
    if (kernels) {
      EXPECT_EQ(data[i].from_port, cudaGraphKernelNodePortProgrammatic);
    }
    programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
  }
  EXPECT_EQ(programmatic, 1);
  // And the graph runs: the copy after the late writer sees its pattern.
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace tandem
