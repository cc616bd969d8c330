// Op micro-benchmarks (Google Benchmark; main() comes from benchmark_main): eager CPU ops through
// the public API, so each timing includes dispatch, output allocation and the kernel.
//
//   matmul f32, square n x n @ n x n, n = 128, 512, 1024     GFLOP/s = 2 n^3 / time
//   conv2d f32 forward, 3x3 pad 1, two CNN layer shapes      GFLOP/s = 2 N O C kH kW Ho Wo / time
//   add f32, 1M and 16M elements                            GB/s = 3 * 4 n bytes (two reads, one write)
//   softmax f32 over rows, 4096 x 1024 and 256 x 32768       GB/s = 2 * 4 n bytes (one read, one write)
//
// Rates are per wall-clock second (UseRealTime): the kernels run on every OpenMP thread, so the main
// thread's CPU time would overstate them. Counters are already scaled to 1e9 ("GFLOP/s", "GB/s").
// Run with OMP_NUM_THREADS set to the cores you mean to measure; `make bench` prints a table.
#include <benchmark/benchmark.h>

#include "reel.h"

using namespace reel;

namespace {

Tensor random_f32(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, TensorOptions{DType::f32}, &gen);
}

// A rate counter: `per_iteration` units of work per iteration, reported per second.
benchmark::Counter rate(double per_iteration) {
  return benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MatmulF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = random_f32({n, n}, 1), b = random_f32({n, n}, 2);
  for (auto _ : state) {
    Tensor y = matmul(a, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.counters["GFLOP"] = rate(2.0 * double(n) * double(n) * double(n) / 1e9);
}
BENCHMARK(BM_MatmulF32)->ArgName("n")->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// Args: N, C, O, H (= W); 3x3 kernel, stride 1, padding 1 (so Ho = H, Wo = W).
void BM_Conv2dF32(benchmark::State& state) {
  const int64_t N = state.range(0), C = state.range(1), O = state.range(2), H = state.range(3);
  Tensor x = random_f32({N, C, H, H}, 3), w = random_f32({O, C, 3, 3}, 4), bias = random_f32({O}, 5);
  for (auto _ : state) {
    Tensor y = conv2d(x, w, bias, 1, 1);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.counters["GFLOP"] = rate(2.0 * double(N * O * C * 9) * double(H * H) / 1e9);
}
BENCHMARK(BM_Conv2dF32)
    ->ArgNames({"N", "C", "O", "H"})
    ->Args({32, 32, 64, 32})
    ->Args({32, 64, 128, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AddF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = random_f32({n}, 6), b = random_f32({n}, 7);
  for (auto _ : state) {
    Tensor y = a + b;
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.counters["GB"] = rate(3.0 * 4.0 * double(n) / 1e9);
}
BENCHMARK(BM_AddF32)->ArgName("n")->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Args: rows, cols; softmax over the last dim.
void BM_SoftmaxF32(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor x = random_f32({rows, cols}, 8);
  for (auto _ : state) {
    Tensor y = softmax(x, -1);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.counters["GB"] = rate(2.0 * 4.0 * double(rows * cols) / 1e9);
}
BENCHMARK(BM_SoftmaxF32)
    ->ArgNames({"rows", "cols"})
    ->Args({4096, 1024})
    ->Args({256, 32768})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
