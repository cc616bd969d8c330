// GEMM micro-benchmarks (Google Benchmark; main() from benchmark_main) at the shapes of gpt-tiny's
// and gpt-small's training step (MODELS.md: micro-batch 16, gpt-tiny T 128 d 256, gpt-small T 256
// d 512, vocab 256), so the CPU GEMM backends (kernels/cpu/sgemm.h) are compared side by side in one
// process, each shape's two runs adjacent.
//
//   matmul_gpt/<model>/<gemm>/<M>x<K>x<N>/<backend>   reel's eager matmul (dispatch, output, kernel)
//   gemm_library/<model>/<gemm>/<M>x<K>x<N>/<call>    oneDNN alone on raw buffers: dnnl_sgemm against
//                                                     the dnnl::matmul primitive (created once, outside
//                                                     the timing), the choice sgemm.cpp explains; also
//                                                     on two matrix-vector shapes (vector/row, column)
//
// Each Linear (y = x W^T, x (R, C), W (D, C), R = B T rows) makes three GEMMs per step:
//   fwd  y  (R, D) = x (R, C) @ W^T      b column-major (W^T is a transposed view)
//   dx   dx (R, C) = dy (R, D) @ W       both row-major
//   dW   dW (D, C) = dy^T @ x            a column-major (dy^T is a transposed view)
// for qkv (C d -> D 3d), proj (d -> d), fc (d -> 4d), fc2 (4d -> d) and the head (d -> vocab 256).
// GFLOP/s = 2 M K N / wall time. Run with OMP_NUM_THREADS set to the cores to measure, e.g.
//   OMP_NUM_THREADS=2 build/reel_bench --benchmark_filter='matmul_gpt/gpt-tiny' --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <dnnl.h>

#include <dnnl.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/sgemm.h"
#include "reel.h"

using namespace reel;

namespace {

struct GemmShape {
  const char* model;
  std::string gemm;  // e.g. "fc.fwd"
  int64_t M, K, N;
  bool a_t, b_t;  // operand read through a transposed view (column-major)
};

// The three GEMMs of one Linear of `model`: C -> D over R rows.
void add_linear(std::vector<GemmShape>& out, const char* model, const std::string& name, int64_t R, int64_t C,
                int64_t D) {
  out.push_back({model, name + ".fwd", R, C, D, false, true});
  out.push_back({model, name + ".dx", R, D, C, false, false});
  out.push_back({model, name + ".dW", D, R, C, true, false});
}

const std::vector<GemmShape>& gpt_shapes() {
  static const std::vector<GemmShape> shapes = [] {
    std::vector<GemmShape> s;
    struct Gpt {
      const char* name;
      int64_t T, d;
    };
    for (Gpt g : {Gpt{"gpt-tiny", 128, 256}, Gpt{"gpt-small", 256, 512}}) {
      const int64_t R = 16 * g.T;
      add_linear(s, g.name, "qkv", R, g.d, 3 * g.d);
      add_linear(s, g.name, "proj", R, g.d, g.d);
      add_linear(s, g.name, "fc", R, g.d, 4 * g.d);
      add_linear(s, g.name, "fc2", R, 4 * g.d, g.d);
      add_linear(s, g.name, "head", R, g.d, 256);
    }
    return s;
  }();
  return shapes;
}

Tensor random_f32(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, TensorOptions{DType::f32}, &gen);
}

// (rows, cols), stored as is or as the transposed view of a (cols, rows) tensor.
Tensor operand(int64_t rows, int64_t cols, bool transposed, uint64_t seed) {
  return transposed ? random_f32({cols, rows}, seed).t() : random_f32({rows, cols}, seed);
}

std::string shape_name(const GemmShape& s) {
  return std::string(s.model) + "/" + s.gemm + "/" + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" +
         std::to_string(s.N);
}

benchmark::Counter gflops(const GemmShape& s) {
  return benchmark::Counter(2.0 * double(s.M) * double(s.K) * double(s.N) / 1e9,
                            benchmark::Counter::kIsIterationInvariantRate);
}

void matmul_gpt(benchmark::State& state, GemmShape s, cpu::CpuGemm backend) {
  const Tensor a = operand(s.M, s.K, s.a_t, 1), b = operand(s.K, s.N, s.b_t, 2);
  const cpu::CpuGemm saved = cpu::cpu_gemm();
  cpu::set_cpu_gemm(backend);
  for (auto _ : state) {
    Tensor y = matmul(a, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  cpu::set_cpu_gemm(saved);
  state.counters["GFLOP"] = gflops(s);
}

// oneDNN's two GEMM entry points on the same raw f32 buffers (row-major, leading dimensions as
// stored: a transposed operand is a column-major matrix).
void gemm_library(benchmark::State& state, GemmShape s, bool primitive) {
  std::vector<float> a(size_t(s.M * s.K)), b(size_t(s.K * s.N)), c(size_t(s.M * s.N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 13) / 13.0f - 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 11) / 11.0f - 0.5f;
  const int64_t lda = s.a_t ? s.M : s.K, ldb = s.b_t ? s.K : s.N;
  if (!primitive) {
    for (auto _ : state)
      dnnl_sgemm(s.a_t ? 'T' : 'N', s.b_t ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                 c.data(), s.N);
  } else {
    using dims = dnnl::memory::dims;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const dnnl::memory::desc ad({s.M, s.K}, dnnl::memory::data_type::f32, s.a_t ? dims{1, lda} : dims{lda, 1});
    const dnnl::memory::desc bd({s.K, s.N}, dnnl::memory::data_type::f32, s.b_t ? dims{1, ldb} : dims{ldb, 1});
    const dnnl::memory::desc cd({s.M, s.N}, dnnl::memory::data_type::f32, dims{s.N, 1});
    const dnnl::matmul gemm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), engine));
    dnnl::memory am(ad, engine, a.data()), bm(bd, engine, b.data()), cm(cd, engine, c.data());
    for (auto _ : state) {
      gemm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    }
  }
  benchmark::DoNotOptimize(c.data());
  state.counters["GFLOP"] = gflops(s);
}

// Registered at load time, each shape's variants one after the other.
const bool registered = [] {
  for (const GemmShape& s : gpt_shapes())
    for (cpu::CpuGemm backend : {cpu::CpuGemm::dnnl, cpu::CpuGemm::eigen})
      benchmark::RegisterBenchmark(("matmul_gpt/" + shape_name(s) + "/" + cpu::cpu_gemm_name(backend)).c_str(),
                                   matmul_gpt, s, backend)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  // The library comparison also on matrix-vector products (a batch of one row, or one column).
  std::vector<GemmShape> library_shapes = gpt_shapes();
  library_shapes.push_back({"vector", "row", 1, 512, 512, false, false});
  library_shapes.push_back({"vector", "column", 512, 512, 1, false, false});
  for (const GemmShape& s : library_shapes)
    for (bool primitive : {false, true})
      benchmark::RegisterBenchmark(
          ("gemm_library/" + shape_name(s) + (primitive ? "/matmul_primitive" : "/sgemm")).c_str(), gemm_library, s,
          primitive)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  return true;
}();

}  // namespace
