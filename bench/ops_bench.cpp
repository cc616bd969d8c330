// Op micro-benchmarks (Google Benchmark; main() comes from benchmark_main): eager CPU ops through
// the public API, so each timing includes dispatch, output allocation and the kernel.
//
//   matmul f32, square n x n @ n x n, n = 128, 512, 1024     GFLOP/s = 2 n^3 / time
//   conv2d f32 forward, 3x3 pad 1, two CNN layer shapes      GFLOP/s = 2 N O C kH kW Ho Wo / time
//   conv2d f32 per layer of cnn-small and resnet18-cifar (micro-batch 32), forward, backward input
//     and backward weight, on each CPU path (oneDNN blocked, oneDNN plain, im2col; conv2d_dnnl.h),
//     named conv2d_layer/<model>/<layer>/<direction>/<path>; and conv2d_step/<model>/<path>: every
//     convolution of one micro-batch's training step in turn (forward, backward input but for the
//     first layer's, whose input needs no gradient, backward weight)  GFLOP/s as above
//   add f32, 1M and 16M elements                            GB/s = 3 * 4 n bytes (two reads, one write)
//   softmax f32 over rows, 4096 x 1024 and 256 x 32768       GB/s = 2 * 4 n bytes (one read, one write)
//
// Rates are per wall-clock second (UseRealTime): the kernels run on every OpenMP thread, so the main
// thread's CPU time would overstate them. Counters are already scaled to 1e9 ("GFLOP/s", "GB/s").
// Run with OMP_NUM_THREADS set to the cores you mean to measure; `make bench` prints a table.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kernels/cpu/conv2d_dnnl.h"
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

// ---- conv2d by layer and path ----

struct ConvLayer {
  const char* model;
  const char* name;
  int64_t C, O, H, k, stride, pad;  // square images and kernels; micro-batch kConvBatch
};
constexpr int64_t kConvBatch = 32;

// cnn-small (nn/models.cpp) and resnet18-cifar (nn/resnet.h): each distinct convolution once.
const std::vector<ConvLayer>& conv_layers() {
  static const std::vector<ConvLayer> layers{
      {"cnn-small", "conv1 3->32 32x32", 3, 32, 32, 3, 1, 1},
      {"cnn-small", "conv2 32->64 32x32 s2", 32, 64, 32, 3, 2, 1},
      {"cnn-small", "conv3 64->64 16x16", 64, 64, 16, 3, 1, 1},
      {"cnn-small", "conv4 64->128 16x16 s2", 64, 128, 16, 3, 2, 1},
      {"cnn-small", "conv5 128->128 8x8", 128, 128, 8, 3, 1, 1},
      {"resnet18-cifar", "conv1 3->64 32x32", 3, 64, 32, 3, 1, 1},
      {"resnet18-cifar", "layer1 64->64 32x32", 64, 64, 32, 3, 1, 1},
      {"resnet18-cifar", "layer2 64->128 32x32 s2", 64, 128, 32, 3, 2, 1},
      {"resnet18-cifar", "layer2 128->128 16x16", 128, 128, 16, 3, 1, 1},
      {"resnet18-cifar", "layer2 downsample 1x1 s2", 64, 128, 32, 1, 2, 0},
      {"resnet18-cifar", "layer3 128->256 16x16 s2", 128, 256, 16, 3, 2, 1},
      {"resnet18-cifar", "layer3 256->256 8x8", 256, 256, 8, 3, 1, 1},
      {"resnet18-cifar", "layer3 downsample 1x1 s2", 128, 256, 16, 1, 2, 0},
      {"resnet18-cifar", "layer4 256->512 8x8 s2", 256, 512, 8, 3, 2, 1},
      {"resnet18-cifar", "layer4 512->512 4x4", 512, 512, 4, 3, 1, 1},
      {"resnet18-cifar", "layer4 downsample 1x1 s2", 256, 512, 8, 1, 2, 0},
  };
  return layers;
}

enum class ConvDirection { Forward, BackwardInput, BackwardWeight };

// One layer's operands and the three calls.
struct ConvCase {
  explicit ConvCase(const ConvLayer& l)
      : x(random_f32({kConvBatch, l.C, l.H, l.H}, 9)),
        w(random_f32({l.O, l.C, l.k, l.k}, 10)),
        attrs(Attrs()
                  .set("stride", std::vector<int64_t>{l.stride, l.stride})
                  .set("padding", std::vector<int64_t>{l.pad, l.pad})) {
    const int64_t Ho = (l.H + 2 * l.pad - l.k) / l.stride + 1;
    g = random_f32({kConvBatch, l.O, Ho, Ho}, 11);
    flops = 2.0 * double(kConvBatch * l.O * l.C * l.k * l.k) * double(Ho * Ho);
  }
  Tensor run(ConvDirection d) const {
    switch (d) {
      case ConvDirection::Forward: return dispatch1(OpKind::Conv2d, {x, w, Tensor()}, attrs);
      case ConvDirection::BackwardInput:
        return dispatch1(OpKind::Conv2dBackwardInput, {g, w}, Attrs(attrs).set("input_shape", x.shape()));
      case ConvDirection::BackwardWeight:
        return dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, Attrs(attrs).set("weight_shape", w.shape()));
    }
    return Tensor();
  }
  Tensor x, w, g;
  Attrs attrs;
  double flops = 0;
};

// Sets the CPU convolution path for one benchmark, then puts back the one before.
struct ConvPathScope {
  explicit ConvPathScope(cpu::CpuConvPath p) : saved(cpu::cpu_conv_path()) { cpu::set_cpu_conv_path(p); }
  ~ConvPathScope() { cpu::set_cpu_conv_path(saved); }
  cpu::CpuConvPath saved;
};

void conv_layer_bench(benchmark::State& state, const ConvLayer& layer, ConvDirection d, cpu::CpuConvPath path) {
  ConvPathScope scope(path);
  const ConvCase c(layer);
  c.run(d);  // the primitive is made (and cached) outside the timing
  for (auto _ : state) benchmark::DoNotOptimize(c.run(d).data_ptr());
  state.counters["GFLOP"] = rate(c.flops / 1e9);
}

void conv_step_bench(benchmark::State& state, const std::string& model, cpu::CpuConvPath path) {
  ConvPathScope scope(path);
  std::vector<ConvCase> cases;
  double flops = 0;
  for (const ConvLayer& l : conv_layers())
    if (model == l.model) cases.emplace_back(l);
  auto step = [&] {
    for (size_t i = 0; i < cases.size(); ++i) {
      benchmark::DoNotOptimize(cases[i].run(ConvDirection::Forward).data_ptr());
      if (i > 0) benchmark::DoNotOptimize(cases[i].run(ConvDirection::BackwardInput).data_ptr());
      benchmark::DoNotOptimize(cases[i].run(ConvDirection::BackwardWeight).data_ptr());
    }
  };
  for (size_t i = 0; i < cases.size(); ++i) flops += cases[i].flops * (i > 0 ? 3 : 2);
  step();
  for (auto _ : state) step();
  state.counters["GFLOP"] = rate(flops / 1e9);
}

// Registered before main() runs, as BENCHMARK() registers.
const bool conv_benchmarks_registered = [] {
  const cpu::CpuConvPath paths[] = {cpu::CpuConvPath::Dnnl, cpu::CpuConvPath::DnnlPlain, cpu::CpuConvPath::Im2col};
  for (const char* model : {"cnn-small", "resnet18-cifar"})
    for (cpu::CpuConvPath p : paths)
      benchmark::RegisterBenchmark(
          (std::string("conv2d_step/") + model + "/" + cpu::cpu_conv_path_name(p)).c_str(),
          [model, p](benchmark::State& s) { conv_step_bench(s, model, p); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  const std::pair<ConvDirection, const char*> directions[] = {{ConvDirection::Forward, "forward"},
                                                              {ConvDirection::BackwardInput, "backward_input"},
                                                              {ConvDirection::BackwardWeight, "backward_weight"}};
  for (const ConvLayer& l : conv_layers())
    for (const auto& [d, dname] : directions)
      for (cpu::CpuConvPath p : paths)
        benchmark::RegisterBenchmark((std::string("conv2d_layer/") + l.model + "/" + l.name + "/" + dname + "/" +
                                      cpu::cpu_conv_path_name(p))
                                         .c_str(),
                                     [&l, d = d, p](benchmark::State& s) { conv_layer_bench(s, l, d, p); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  return true;
}();

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
