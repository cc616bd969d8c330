// Max-autotune's GEMM tuning (kernels/cuda/gemm_autotune.h): with autotuning on, the CUDA matmul
// times cuBLASLt's candidates against cuBLAS's default on each problem's first eager call and keeps
// the fastest. Whatever it picks must give the untuned results (f32 within summation-order
// round-off, bf16 within 16-bit round-off) and the CPU's; a problem is timed once; a capture after
// tuning replays the choice, and a capture before it takes the untuned path without timing.
// Every test skips, saying why, where no GPU is visible, and turns autotuning off when it ends.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/autotune.h"
#include "tensor/cuda.h"
#include "test_util.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_autotune.h"
#include "kernels/cuda/matmul_into.h"
#endif

using namespace reel;

namespace {

using testing_util::rel_l2;

const Device kGpu = Device::cuda(0);

// Problems timed so far (0 in a build without CUDA, where every test skips).
int64_t tunings() {
#ifdef REEL_CUDA
  return cuda::gemm_tunings();
#else
  return 0;
#endif
}

// ||a - b|| / ||b|| (NaN anywhere fails).
// Tuned vs untuned: f32 differs by summation order only; bf16 by its output rounding as well.
double tuned_tolerance(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }
// GPU vs CPU (as tests/test_cuda.cpp).
double cpu_tolerance(DType dt) { return dt == DType::f32 ? 2e-5 : 3e-2; }

class GemmAutotune : public testing::Test {
 protected:
  void TearDown() override { set_autotune(false); }
};

// A seeded N(0, 1) operand in `dt` on the GPU: randn(shape), or with `transposed` the transpose of
// randn(shape with its last two dims swapped) — a column-major view, read in place by cuBLAS.
Tensor operand(Shape shape, DType dt, uint64_t seed, bool transposed = false) {
  Generator gen(seed);
  if (transposed) std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  Tensor t = randn(shape, {}, &gen).to(dt).to(kGpu);
  return transposed ? t.transpose(-2, -1) : t;
}

// a @ b on the GPU, autotuning on or off, as host doubles.
std::vector<double> gpu_matmul(const Tensor& a, const Tensor& b, bool tune) {
  set_autotune(tune);
  std::vector<double> y = matmul(a, b).to_vector<double>();
  set_autotune(false);
  return y;
}

// The reference: a @ b on the CPU in f32 from the same (rounded) operand values.
std::vector<double> cpu_matmul(const Tensor& a, const Tensor& b) {
  return matmul(a.cpu().to(DType::f32), b.cpu().to(DType::f32)).to_vector<double>();
}

struct Case {
  const char* name;
  Shape a, b;
  bool ta = false, tb = false;  // operand given as a transposed (column-major) view
};

// Shapes not used elsewhere in this file, so each is tuned here first.
const Case kCases[] = {
    {"plain", {64, 96}, {96, 80}},
    {"odd", {33, 71}, {71, 19}},
    {"batched", {3, 33, 40}, {3, 40, 17}},
    {"folded", {4, 16, 24}, {24, 8}},                 // a shared b: the batch folds into M
    {"broadcast", {2, 1, 8, 12}, {1, 3, 12, 5}},      // two batch dims: a host loop of batched GEMMs
    {"transposed_a", {48, 32}, {32, 56}, true, false},
    {"transposed_b", {40, 36}, {36, 52}, false, true},
    {"transposed_batched", {2, 40, 24}, {2, 24, 16}, true, true},
};

}  // namespace

TEST_F(GemmAutotune, MatchesUntunedAndCpu) {
  REEL_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(c.name) + " in " + dtype_name(dt));
      Tensor a = operand(c.a, dt, 1, c.ta), b = operand(c.b, dt, 2, c.tb);
      const std::vector<double> untuned = gpu_matmul(a, b, false);
      const int64_t before = tunings();
      const std::vector<double> tuned = gpu_matmul(a, b, true);
      EXPECT_GT(tunings(), before) << "the first tuned call of a new shape times its candidates";
      EXPECT_LE(rel_l2(tuned, untuned), tuned_tolerance(dt)) << "tuned vs untuned";
      EXPECT_LE(rel_l2(tuned, cpu_matmul(a, b)), cpu_tolerance(dt)) << "tuned vs CPU";
      // The cached choice (no timing this time) gives the same.
      const std::vector<double> again = gpu_matmul(a, b, true);
      EXPECT_LE(rel_l2(again, untuned), tuned_tolerance(dt)) << "cached choice vs untuned";
    }
  }
}

TEST_F(GemmAutotune, TunesEachProblemOnce) {
  REEL_REQUIRE_GPU();
  Tensor a = operand({37, 53}, DType::f32, 3), b = operand({53, 29}, DType::f32, 4);
  const int64_t start = tunings();
  gpu_matmul(a, b, true);
  EXPECT_EQ(tunings(), start + 1) << "one GEMM problem, timed once";
  // Fresh operands of the same shape: the same problem, so no timing.
  Tensor a2 = operand({37, 53}, DType::f32, 5), b2 = operand({53, 29}, DType::f32, 6);
  const std::vector<double> y = gpu_matmul(a2, b2, true);
  EXPECT_EQ(tunings(), start + 1) << "a second call of the same shape does not tune again";
  EXPECT_LE(rel_l2(y, cpu_matmul(a2, b2)), cpu_tolerance(DType::f32));
  // Autotuning off: the untuned path, nothing timed.
  Tensor a3 = operand({41, 23}, DType::f32, 7), b3 = operand({23, 31}, DType::f32, 8);
  gpu_matmul(a3, b3, false);
  EXPECT_EQ(tunings(), start + 1) << "no timing with autotuning off";
}

#ifdef REEL_CUDA

// out = c0 + a @ b by matmul_into with accumulate, autotuning on or off; out as host doubles.
std::vector<double> accumulate_into(const Tensor& a, const Tensor& b, const Tensor& c0, bool tune) {
  Tensor out = c0.clone();
  set_autotune(tune);
  cuda::matmul_into(a, b, out, /*accumulate=*/true);
  set_autotune(false);
  return out.to_vector<double>();
}

TEST_F(GemmAutotune, AccumulatesIntoF32FromBf16) {
  REEL_REQUIRE_GPU();
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed operands" : "row-major operands");
    const int64_t M = 72, K = 88, N = 40 + (transposed ? 8 : 0);
    Tensor a = operand({M, K}, DType::bf16, 11, transposed), b = operand({K, N}, DType::bf16, 12, transposed);
    Tensor c0 = operand({M, N}, DType::f32, 13);
    const std::vector<double> untuned = accumulate_into(a, b, c0, false);
    const int64_t before = tunings();
    // The tuning call: its candidates write a scratch output, so `out` gets c0 + a @ b exactly once.
    const std::vector<double> tuned = accumulate_into(a, b, c0, true);
    EXPECT_EQ(tunings(), before + 1);
    const std::vector<double> cached = accumulate_into(a, b, c0, true);
    EXPECT_EQ(tunings(), before + 1);
    std::vector<double> expected = cpu_matmul(a, b);
    const std::vector<double> c0_host = c0.to_vector<double>();
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += c0_host[i];
    // bf16 operands multiply exactly in f32, so only the summation order differs; adding c0 twice or
    // not at all would be an O(1) error.
    EXPECT_LE(rel_l2(tuned, untuned), 1e-4) << "tuning call vs untuned";
    EXPECT_LE(rel_l2(cached, untuned), 1e-4) << "cached choice vs untuned";
    EXPECT_LE(rel_l2(tuned, expected), 1e-4) << "tuning call vs CPU";
  }
}

TEST_F(GemmAutotune, CaptureAfterTuningReplaysTheChoice) {
  REEL_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = operand({2, 96, 64}, dt, 21), b = operand({64, 48}, dt, 22);
    Tensor eager = Tensor::empty({2, 96, 48}, dt, kGpu), replayed = Tensor::empty({2, 96, 48}, dt, kGpu);
    set_autotune(true);
    cuda::matmul_into(a, b, eager);  // tunes, eagerly
    const int64_t before = tunings();
    cuda::Graph graph;
    graph.capture_begin();
    cuda::matmul_into(a, b, replayed);  // the cached choice: no timing, no synchronisation
    graph.capture_end();
    graph.replay();
    graph.replay();
    cuda::synchronize();
    set_autotune(false);
    EXPECT_EQ(tunings(), before) << "a capture never times";
    EXPECT_LE(rel_l2(replayed.to_vector<double>(), eager.to_vector<double>()), 1e-6) << "replay vs eager";
    EXPECT_LE(rel_l2(replayed.to_vector<double>(), cpu_matmul(a, b)), cpu_tolerance(dt)) << "replay vs CPU";
  }
}

TEST_F(GemmAutotune, CaptureBeforeTuningTakesTheUntunedPath) {
  REEL_REQUIRE_GPU();
  Tensor a = operand({56, 44}, DType::f32, 31), b = operand({44, 60}, DType::f32, 32);
  Tensor replayed = Tensor::empty({56, 60}, DType::f32, kGpu);
  set_autotune(true);
  const int64_t before = tunings();
  {
    cuda::Graph graph;
    graph.capture_begin();
    cuda::matmul_into(a, b, replayed);  // a new problem inside a capture: untuned, nothing cached
    graph.capture_end();
    graph.replay();
    cuda::synchronize();
  }
  EXPECT_EQ(tunings(), before) << "a capture never times";
  EXPECT_LE(rel_l2(replayed.to_vector<double>(), cpu_matmul(a, b)), cpu_tolerance(DType::f32));
  Tensor eager = Tensor::empty({56, 60}, DType::f32, kGpu);
  cuda::matmul_into(a, b, eager);  // the first eager call tunes it
  set_autotune(false);
  EXPECT_EQ(tunings(), before + 1);
  EXPECT_LE(rel_l2(eager.to_vector<double>(), replayed.to_vector<double>()), tuned_tolerance(DType::f32));
}

#endif  // REEL_CUDA
