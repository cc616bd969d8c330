// The CUDA runtime pieces: the caching allocator (reuse in steady state, statistics, graph pools,
// out-of-memory errors), streams, and a forward+backward captured into a CUDA graph by hand and
// replayed. Every test skips, saying why, where no GPU is visible.
#include <gtest/gtest.h>

#ifdef REEL_CUDA
#include <cuda_runtime.h>
#endif

#include "autograd/cases/op_cases.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

namespace {
const Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::f32, kGpu};
}  // namespace

TEST(CudaAllocator, SteadyStateMakesNoNewDeviceAllocations) {
  REEL_REQUIRE_GPU();
  if (!cuda::caching_enabled()) GTEST_SKIP() << "REEL_CUDA_NO_CACHE is set";
  Tensor w = randn({128, 64}, kF32Gpu).set_requires_grad();
  auto step = [&] {
    Tensor x = randn({32, 128}, kF32Gpu);
    Tensor loss = mean(pow(relu(matmul(x, w)), 2.0));
    loss.backward();
  };
  for (int i = 0; i < 3; ++i) step();
  cuda::MemoryStats before = cuda::memory_stats();
  for (int i = 0; i < 20; ++i) step();
  cuda::MemoryStats after = cuda::memory_stats();
  EXPECT_EQ(after.device_allocs, before.device_allocs) << "cudaMalloc called in steady state";
  EXPECT_GT(after.requests, before.requests);
  EXPECT_EQ(after.cache_hits - before.cache_hits, after.requests - before.requests);
}

TEST(CudaAllocator, StatisticsTrackLiveBytesAndPeak) {
  REEL_REQUIRE_GPU();
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  const size_t base = cuda::memory_stats().allocated_bytes;
  cuda::GraphPool fresh;  // an empty pool: every block below is a new one of exactly the rounded size
  cuda::GraphPoolGuard guard(fresh);
  {
    Tensor small = Tensor::empty({1000}, DType::f32, kGpu);  // 4000 B -> one 4096 B block
    EXPECT_EQ(cuda::memory_stats().allocated_bytes, base + 4096);
    Tensor large = Tensor::empty({3 << 20}, DType::f32, kGpu);  // 12 MiB, a multiple of 2 MiB
    EXPECT_EQ(cuda::memory_stats().allocated_bytes, base + 4096 + (12u << 20));
    EXPECT_GE(cuda::memory_stats().reserved_bytes, cuda::memory_stats().allocated_bytes);
  }
  cuda::MemoryStats s = cuda::memory_stats();
  EXPECT_EQ(s.allocated_bytes, base);
  EXPECT_EQ(s.peak_allocated_bytes, base + 4096 + (12u << 20));
  cuda::reset_peak_memory_stats();
  EXPECT_EQ(cuda::memory_stats().peak_allocated_bytes, base);
}

TEST(CudaAllocator, ReusesOnlyBlocksOfTheExactRoundedSize) {
  // A larger cached block would be counted whole for a smaller request; the allocator makes a block of
  // the request's own size instead, so allocated bytes are always the requests' rounded sizes.
  REEL_REQUIRE_GPU();
  if (!cuda::caching_enabled()) GTEST_SKIP() << "REEL_CUDA_NO_CACHE is set";
  cuda::GraphPool fresh;
  cuda::GraphPoolGuard guard(fresh);
  const size_t base = cuda::memory_stats().allocated_bytes;
  void* big_ptr = nullptr;
  {
    Tensor big = Tensor::empty({2048}, DType::f32, kGpu);  // 8 KiB, cached when it dies
    big_ptr = big.data_ptr();
  }
  Tensor small = Tensor::empty({1024}, DType::f32, kGpu);  // 4 KiB: not served by the 8 KiB block
  EXPECT_NE(small.data_ptr(), big_ptr);
  EXPECT_EQ(cuda::memory_stats().allocated_bytes, base + 4096);
  Tensor again = Tensor::empty({2048}, DType::f32, kGpu);  // 8 KiB: the cached block
  EXPECT_EQ(again.data_ptr(), big_ptr);
  EXPECT_EQ(cuda::memory_stats().allocated_bytes, base + 4096 + 8192);
}

TEST(CudaAllocator, GraphPoolsKeepTheirBlocks) {
  REEL_REQUIRE_GPU();
  if (!cuda::caching_enabled()) GTEST_SKIP() << "REEL_CUDA_NO_CACHE is set";
  cuda::GraphPool pool;
  void* in_pool = nullptr;
  {
    cuda::GraphPoolGuard guard(pool);
    in_pool = Tensor::empty({777}, DType::f32, kGpu).data_ptr();  // freed at once, back to the pool
  }
  Tensor outside = Tensor::empty({777}, DType::f32, kGpu);
  EXPECT_NE(outside.data_ptr(), in_pool) << "a graph pool's block leaked to the common cache";
  cuda::GraphPoolGuard guard(pool);
  EXPECT_EQ(Tensor::empty({777}, DType::f32, kGpu).data_ptr(), in_pool);
}

TEST(CudaAllocator, OutOfMemoryIsAClearError) {
  REEL_REQUIRE_GPU();
  expect_error([] { Tensor::empty({int64_t(1) << 42}, DType::f32, kGpu); }, {"out of memory", "cuda:0", "bytes"});
  Tensor fine = ones({4}, kF32Gpu);  // the allocator still works afterwards
  EXPECT_EQ(fine.sum().item(), 4.0);
}

TEST(CudaStreams, OpsRunOnTheCurrentStream) {
  REEL_REQUIRE_GPU();
  cuda::StreamHandle s = cuda::create_stream();
  {
    cuda::StreamGuard guard(s);
    EXPECT_EQ(cuda::current_stream(), s);
    Tensor a = arange(1000, kF32Gpu);
    EXPECT_EQ(sum(a * 2.0).item(), 999.0 * 1000.0);
  }
  EXPECT_NE(cuda::current_stream(), s);
  cuda::destroy_stream(s);
}

// A two-layer MLP's forward and backward, captured into one CUDA graph by hand and replayed on new
// inputs written in place: the replay must give what eager execution gives on those inputs.
TEST(CudaGraph, HandCapturedForwardBackwardReplaysTheEagerResult) {
  REEL_REQUIRE_GPU();
#ifndef REEL_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  Generator gen(1);
  auto param = [&](const Shape& s) { return normal(s, 0, 0.2, kF32Gpu, &gen).set_requires_grad(); };
  Tensor w1 = param({32, 64}), b1 = param({64}), w2 = param({64, 10}), b2 = param({10});
  std::vector<Tensor> params{w1, b1, w2, b2};
  Tensor x = randn({16, 32}, kF32Gpu, &gen);
  Tensor y = cases::int_tensor({16}, 10, kGpu, 3);
  auto step = [&] {
    {
      NoGradGuard no_grad;
      for (Tensor& p : params) zero_(p.grad());
    }
    Tensor h = relu(matmul(x, w1) + b1);
    Tensor loss = cross_entropy(matmul(h, w2) + b2, y);
    loss.backward();
    return loss;
  };
  for (Tensor& p : params) p.set_grad(zeros(p.shape(), kF32Gpu));
  for (int i = 0; i < 3; ++i) step();  // warm-up: handles, workspaces and cached blocks exist now
  cuda::synchronize();

  cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream());
  cuda::GraphPool pool;
  cudaGraph_t graph = nullptr;
  Tensor captured_loss;
  {
    cuda::GraphPoolGuard guard(pool);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    captured_loss = step();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  }
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int trial = 0; trial < 2; ++trial) {
    {
      NoGradGuard no_grad;
      copy_(x, randn({16, 32}, kF32Gpu, &gen));  // new data, same buffer
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    cuda::synchronize();
    double replay_loss = captured_loss.item();
    std::vector<std::vector<float>> replay_grads;
    for (Tensor& p : params) replay_grads.push_back(p.grad().to_vector<float>());

    double eager_loss = step().item();
    EXPECT_NEAR(replay_loss, eager_loss, 1e-6 * std::abs(eager_loss)) << "trial " << trial;
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> eager = params[k].grad().to_vector<float>();
      ASSERT_EQ(eager.size(), replay_grads[k].size());
      for (size_t i = 0; i < eager.size(); ++i)
        ASSERT_NEAR(replay_grads[k][i], eager[i], 1e-5f * (1 + std::fabs(eager[i]))) << "param " << k;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}
