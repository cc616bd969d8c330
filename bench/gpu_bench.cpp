// GPU op micro-benchmarks (Google Benchmark; linked into reel_bench with the CPU suite, whose
// benchmark_main provides main()). Eager ops through the public API on Device::cuda(), timed on the
// GPU: each iteration enqueues kCallsPerIteration calls between two CUDA events recorded on
// reel::cuda::current_stream(), and the elapsed time per call is the iteration's manual time
// (UseManualTime). Back-to-back calls hide each call's host-side dispatch behind the previous
// call's GPU work, so these are device rates.
//
//   matmul bf16 and f32, n x n @ n x n, n = 4096, 8192      TFLOP/s = 2 n^3 / time
//   conv2d f32 and bf16 forward, 3x3 pad 1, no bias:
//     (N=32, 64 -> 128, 32x32) and (N=128, 128 -> 128, 16x16)   TFLOP/s = 2 N O C 9 Ho Wo / time
//   add f32, 64M elements                                   GB/s = 3 * 4 n (two reads, one write)
//   copy f32, 1 GiB device to device (copy_)                GB/s = 2 * 1 GiB (read + write): the ceiling
//   softmax f32 over the rows of (8192, 8192)               GB/s = 2 * 4 n (read + write)
//   layer_norm f32 forward, (16384, 1024), weight and bias  GB/s = 2 * 4 n (read + write)
//   causal attention bf16, forward and backward, at gpt-tiny's and gpt-small's micro-batch
//     (B 16, T 128, H 4, hd 64) and (B 16, T 256, H 8, hd 64)   TFLOP/s over the causal half, as
//     FlashAttention counts it: forward 2 B H T^2 hd, backward 2.5 times that
//     (bench/torch_attention.py times PyTorch's flash kernels on the same shapes)
//   a chain of 100 dependent in-place adds of n f32 elements in one CUDA graph, with programmatic
//   dependent launch off and on (kernels/cuda/launch.cuh)   kernels/us; time per chain
//
// Rates are total work over total GPU time, already scaled ("TFLOP/s" in 1e12, "GB/s" in 1e9).
// Every benchmark first runs its op once untimed (cuDNN algorithm choice, allocator warm-up). Without
// a CUDA device, or in a build without CUDA (no REEL_CUDA), each benchmark skips with "no CUDA
// device"; an op the CUDA backend lacks skips with its error message.
#include <benchmark/benchmark.h>

#include <exception>
#include <functional>

#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"

#ifdef REEL_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/programmatic_launch.h"
#endif

using namespace reel;

namespace {

Tensor random_cuda(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, TensorOptions{dtype, Device::cuda()}, &gen);
}

#ifdef REEL_CUDA
// Throws reel::Error on a failed CUDA runtime call (the benchmark then skips with the message).
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::cat("gpu_bench: ", what, ": ", cudaGetErrorString(status)));
}
#endif

// The timed work of one benchmark: enqueues GPU work on the current stream.
using Work = std::function<void()>;

// Calls of `work` between one pair of events. Each eager call spends some host time (dispatch,
// allocation, library set-up) before its kernels are enqueued; with several calls in a row the GPU
// runs call i while the host enqueues call i + 1, so only the first call's host time is left in
// the measurement (divided by kCallsPerIteration), and the rate is the device's.
constexpr int kCallsPerIteration = 10;

// Builds the work (inputs are made here, inside the error handling), runs it once untimed, then
// times kCallsPerIteration calls per benchmark iteration with CUDA events. The iteration time is
// the time per call; counter = units_per_call / seconds_per_call / scale.
void time_on_gpu(benchmark::State& state, const std::function<Work()>& make_work, const char* counter,
                 double units_per_call, double scale) {
  if (!cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
#ifdef REEL_CUDA
  cudaEvent_t start = nullptr, stop = nullptr;
  try {
    Work work = make_work();
    work();  // warm-up: algorithm choice, workspaces, the caching allocator
    cuda::synchronize();
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream());
    double total_seconds = 0.0;
    for (auto _ : state) {
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      for (int i = 0; i < kCallsPerIteration; ++i) work();
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      const double per_call = double(ms) / 1e3 / kCallsPerIteration;
      state.SetIterationTime(per_call);
      total_seconds += per_call;
    }
    if (total_seconds > 0.0)
      state.counters[counter] = units_per_call * double(state.iterations()) / total_seconds / scale;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
#else
  (void)make_work;
  (void)counter;
  (void)units_per_call;
  (void)scale;
#endif
}

// ---- matmul: n x n @ n x n ----

void BM_CudaMatmul(benchmark::State& state, DType dtype) {
  const int64_t n = state.range(0);
  auto make = [&]() -> Work {
    Tensor a = random_cuda({n, n}, dtype, 1), b = random_cuda({n, n}, dtype, 2);
    return [a, b] { benchmark::DoNotOptimize(matmul(a, b).data_ptr()); };
  };
  time_on_gpu(state, make, "TFLOP/s", 2.0 * double(n) * double(n) * double(n), 1e12);
}
BENCHMARK_CAPTURE(BM_CudaMatmul, bf16, DType::bf16)
    ->ArgName("n")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaMatmul, f32, DType::f32)
    ->ArgName("n")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- conv2d forward: Args N, C, O, H (= W); 3x3 kernel, stride 1, padding 1 (Ho = H, Wo = W) ----

void BM_CudaConv2d(benchmark::State& state, DType dtype) {
  const int64_t N = state.range(0), C = state.range(1), O = state.range(2), H = state.range(3);
  auto make = [&]() -> Work {
    Tensor x = random_cuda({N, C, H, H}, dtype, 3), w = random_cuda({O, C, 3, 3}, dtype, 4);
    return [x, w] { benchmark::DoNotOptimize(conv2d(x, w, Tensor(), 1, 1).data_ptr()); };
  };
  time_on_gpu(state, make, "TFLOP/s", 2.0 * double(N * O * C * 9) * double(H * H), 1e12);
}
BENCHMARK_CAPTURE(BM_CudaConv2d, f32, DType::f32)
    ->ArgNames({"N", "C", "O", "H"})
    ->Args({32, 64, 128, 32})
    ->Args({128, 128, 128, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaConv2d, bf16, DType::bf16)
    ->ArgNames({"N", "C", "O", "H"})
    ->Args({32, 64, 128, 32})
    ->Args({128, 128, 128, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- memory-bound ops ----

void BM_CudaAddF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto make = [&]() -> Work {
    Tensor a = random_cuda({n}, DType::f32, 6), b = random_cuda({n}, DType::f32, 7);
    return [a, b] { benchmark::DoNotOptimize(add(a, b).data_ptr()); };
  };
  time_on_gpu(state, make, "GB/s", 3.0 * 4.0 * double(n), 1e9);
}
BENCHMARK(BM_CudaAddF32)->ArgName("n")->Arg(int64_t(64) << 20)->UseManualTime()->Unit(benchmark::kMicrosecond);

// A device-to-device copy through reel's copy op into an existing tensor: the bandwidth ceiling.
void BM_CudaCopy(benchmark::State& state) {
  const int64_t bytes = state.range(0), n = bytes / 4;
  auto make = [&]() -> Work {
    Tensor src = random_cuda({n}, DType::f32, 8), dst = zeros({n}, TensorOptions{DType::f32, Device::cuda()});
    return [src, dst] { copy_(dst, src); };
  };
  time_on_gpu(state, make, "GB/s", 2.0 * double(bytes), 1e9);
}
BENCHMARK(BM_CudaCopy)->ArgName("bytes")->Arg(int64_t(1) << 30)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Args: rows, cols; softmax over the last dim.
void BM_CudaSoftmaxF32(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  auto make = [&]() -> Work {
    Tensor x = random_cuda({rows, cols}, DType::f32, 9);
    return [x] { benchmark::DoNotOptimize(softmax(x, -1).data_ptr()); };
  };
  time_on_gpu(state, make, "GB/s", 2.0 * 4.0 * double(rows * cols), 1e9);
}
BENCHMARK(BM_CudaSoftmaxF32)
    ->ArgNames({"rows", "cols"})
    ->Args({8192, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Args: rows, cols; normalised over the last dim with a weight and a bias of (cols).
void BM_CudaLayerNormF32(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  auto make = [&]() -> Work {
    Tensor x = random_cuda({rows, cols}, DType::f32, 10);
    Tensor w = random_cuda({cols}, DType::f32, 11), b = random_cuda({cols}, DType::f32, 12);
    return [x, w, b, cols] { benchmark::DoNotOptimize(layer_norm(x, {cols}, w, b).data_ptr()); };
  };
  time_on_gpu(state, make, "GB/s", 2.0 * 4.0 * double(rows * cols), 1e9);
}
BENCHMARK(BM_CudaLayerNormF32)
    ->ArgNames({"rows", "cols"})
    ->Args({16384, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- fused attention: Args B, T, H, hd, backward (0: forward, 1: backward alone), causal ----

// The compiled plan's case: qkv (B, T, 3 H hd) in bf16, bf16 compute; the backward is timed on the
// forward's saved y and lse. causal 1: GPT's decoder; causal 0: ViT's encoder (ViT-Ti: T 65, 3 heads
// of 64, every key visible).
void BM_CudaAttention(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1), H = state.range(2), hd = state.range(3);
  const bool backward = state.range(4) != 0, causal = state.range(5) != 0;
  auto make = [&]() -> Work {
    const Attrs a = Attrs().set("heads", H).set("compute", DType::bf16).set("causal", causal);
    Tensor qkv = random_cuda({B, T, 3 * H * hd}, DType::bf16, 13);
    if (!backward) return [qkv, a] { benchmark::DoNotOptimize(dispatch(OpKind::Attention, {qkv}, a)[0].data_ptr()); };
    std::vector<Tensor> f = dispatch(OpKind::Attention, {qkv}, a);
    Tensor dy = random_cuda({B, T, H * hd}, DType::bf16, 14);
    return [qkv, dy, f, a] {
      benchmark::DoNotOptimize(dispatch(OpKind::AttentionBackward, {dy, qkv, f[0], f[1]}, a)[0].data_ptr());
    };
  };
  const double forward_flop = 2.0 * double(B * H) * double(T * T) * double(hd);
  time_on_gpu(state, make, "TFLOP/s", backward ? 2.5 * forward_flop : forward_flop, 1e12);
}
BENCHMARK(BM_CudaAttention)
    ->ArgNames({"B", "T", "H", "hd", "bwd", "causal"})
    ->Args({16, 128, 4, 64, 0, 1})
    ->Args({16, 128, 4, 64, 1, 1})
    ->Args({16, 256, 8, 64, 0, 1})
    ->Args({16, 256, 8, 64, 1, 1})
    ->Args({128, 65, 3, 64, 0, 0})
    ->Args({128, 65, 3, 64, 1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

// ---- a chain of dependent kernels in one CUDA graph: Args n, programmatic launch (0 or 1) ----

// 100 in-place adds x += y of n floats, each waiting for the one before: with tiny n the time is the
// kernel boundaries' (completion, memory flush, the next launch), which programmatic dependent launch
// overlaps with the kernel before. The graph keeps the launch mode it was captured with.
void BM_CudaKernelChain(benchmark::State& state) {
  constexpr int kChain = 100;
  const int64_t n = state.range(0);
  const bool programmatic = state.range(1) != 0;
  auto make = [&]() -> Work {
#ifdef REEL_CUDA
    Tensor x = zeros({n}, TensorOptions{DType::f32, Device::cuda()});
    Tensor y = random_cuda({n}, DType::f32, 15);
    auto graph = std::make_shared<cuda::Graph>(0);
    {
      cuda::ScopedProgrammaticLaunch mode(programmatic);
      graph->capture_begin();
      for (int k = 0; k < kChain; ++k) add_(x, y);
      graph->capture_end();
    }
    return [graph, x, y] { graph->replay(); };
#else
    (void)n;
    (void)programmatic;
    return [] {};
#endif
  };
  time_on_gpu(state, make, "kernels/us", double(kChain), 1e6);
}
BENCHMARK(BM_CudaKernelChain)
    ->ArgNames({"n", "pdl"})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({524288, 0})
    ->Args({524288, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
