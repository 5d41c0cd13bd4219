// GPU test of CublasLtGemm's captured decode GEMMs behind programmatic edges. For decode shapes of
// the Llama-3-8B and Llama-3.2-1B models that cuBLASLt takes (33+ rows), a CUDA graph of [a writer
// that lets its dependents start at once and writes x only after 30 us, Linear] must compute
// bit-identically what Linear computes eagerly on the same x, over replays each preceded by a stale
// x: a GEMM captured behind a programmatic edge that reads x early (an algorithm the probe let
// through wrongly) fails here. With TANDEM_GEMM_PDL=0 no shape may take a programmatic edge (on
// the H200 the probe passes few decode algorithms: bench/RESULTS.md, eleventh session; the test
// prints which shapes took one). Skipped without a GPU.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/programmatic_edge.h"
#include "runtime/model/cuda/cublas_gemm.h"

namespace tandem::cuda_runner {
namespace {

using testing_util::CudaKernelTest;

struct Shape {
  int m, k, n;
};

class CublasGemmCaptureTest : public CudaKernelTest {
 protected:
  // Programmatic edges out of the graph's root (the writer); cuBLASLt's own edges (it launches
  // its split-K reduce kernel programmatically) do not count.
  static int ProgrammaticEdgesFromRoot(cudaGraph_t graph) {
    size_t roots = 1;
    cudaGraphNode_t root = nullptr;
    EXPECT_EQ(cudaGraphGetRootNodes(graph, &root, &roots), cudaSuccess);
    EXPECT_EQ(roots, 1u);
    size_t n = 0;
    EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), cudaSuccess);
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), cudaSuccess);
    int count = 0;
    for (size_t i = 0; i < n; ++i) {
      count += from[i] == root && data[i].type == cudaGraphDependencyTypeProgrammatic;
    }
    return count;
  }
};

TEST_F(CublasGemmCaptureTest, CapturedDecodeGemmsMatchEagerBehindALateWriter) {
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // the runner's
  DeviceBuffer workspace = Alloc(kWorkspaceBytes);
  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm =
      CublasLtGemm::Create(workspace.data, kWorkspaceBytes);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const auto s = static_cast<cudaStream_t>(stream());
  const std::vector<Shape> shapes = {{64, 4096, 6144},   {64, 4096, 4096}, {64, 4096, 28672},
                                     {64, 14336, 4096},  {48, 4096, 4096}, {256, 4096, 6144},
                                     {256, 14336, 4096}, {64, 2048, 3072}, {64, 2048, 16384},
                                     {64, 8192, 2048}};
  int programmatic_total = 0;
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(testing::Message() << "m=" << sh.m << " k=" << sh.k << " n=" << sh.n);
    const size_t x_count = size_t{1} * sh.m * sh.k, w_count = size_t{1} * sh.n * sh.k;
    const size_t out_count = size_t{1} * sh.m * sh.n;
    DeviceBuffer x = Alloc(x_count * 2), w = Alloc(w_count * 2), out = Alloc(out_count * 2);
    // Small integers: every product and sum is exact in float32, so any algorithm gives the same
    // bits; a difference can only come from reading another x.
    ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), w.data, w_count, 7, 0).ok());
    ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), x.data, x_count, 11, 0).ok());
    // Eager: builds the plan (autotune and probe), then the reference.
    ASSERT_TRUE(
        (*gemm)
            ->Linear(x.data, w.data, nullptr, sh.m, sh.k, sh.n, out.data, GemmOut::kBf16, stream())
            .ok());
    const std::vector<uint16_t> want = Download<uint16_t>(out, out_count);

    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), x.data, x_count, 11, 30).ok());
    const absl::Status linear = (*gemm)->Linear(x.data, w.data, nullptr, sh.m, sh.k, sh.n, out.data,
                                                GemmOut::kBf16, stream());
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_TRUE(linear.ok()) << linear;
    const int programmatic = ProgrammaticEdgesFromRoot(graph);
    programmatic_total += programmatic;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 4; ++replay) {
      ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), x.data, x_count, 100 + replay, 0).ok());
      ASSERT_TRUE(cuda::QueueLateBf16Pattern(stream(), out.data, out_count, 200 + replay, 0).ok());
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      const std::vector<uint16_t> got = Download<uint16_t>(out, out_count);
      size_t wrong = 0;
      for (size_t i = 0; i < out_count; ++i) wrong += got[i] != want[i];
      EXPECT_EQ(wrong, 0u) << "replay " << replay << " (programmatic edges: " << programmatic
                           << ")";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::printf("m=%d k=%d n=%d: %d programmatic edge(s)\n", sh.m, sh.k, sh.n, programmatic);
  }
  const char* pdl = std::getenv("TANDEM_GEMM_PDL");
  if (pdl != nullptr && std::strcmp(pdl, "0") == 0) {
    EXPECT_EQ(programmatic_total, 0);
  }
}

}  // namespace
}  // namespace tandem::cuda_runner
