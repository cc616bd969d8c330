// Split-K for weight gradients (kernels/cuda/gemm_autotune.h: gemm_split_k). The compiled step's
// weight gradient dW (D, C) = dy^T x reads 16-bit operands and writes (or adds into) an f32 result;
// where the output is too small to fill the GPU, K (the rows) is split and the partial sums are
// reduced in the f32 result in a fixed order. Checked here at the shapes a GPT's step forms, as
// matmul_into receives them (x^T a transposed view, dy row-major): the split path runs where it
// should and not elsewhere, the result is the CPU's up to f32 summation order, adding into the
// result adds once, and the bits are the same on every call and in a CUDA graph's replays.
// Split-K is switched on for each test (kernels/autotune.h: set_split_k) and back to the process's
// mode after it. Every test skips, saying why, where no GPU is visible.
#include <gtest/gtest.h>

#include "kernels/autotune.h"

#include "tensor/cuda.h"
#include "test_util.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_autotune.h"
#include "kernels/cuda/matmul_into.h"
#endif

using namespace reel;

namespace {

#ifdef REEL_CUDA

using testing_util::rel_l2;

class GemmSplitK : public testing::Test {
 protected:
  void SetUp() override {
    was_on_ = split_k_enabled();
    set_split_k(true);
  }
  void TearDown() override { set_split_k(was_on_); }

 private:
  bool was_on_ = false;
};

const Device kGpu = Device::cuda(0);

// A seeded N(0, 1) operand of `shape` in `dt` on the GPU.
Tensor operand(const Shape& shape, DType dt, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {}, &gen).to(dt).to(kGpu);
}

// The weight gradient of a Linear C -> D over R rows: x (R, C) and dy (R, D) in bf16; dW (D, C) =
// dy^T x, or with `into` (an f32 (D, C)) dW added to a copy of it. Returns the result on the GPU.
Tensor weight_gradient(const Tensor& x, const Tensor& dy, const Tensor* into = nullptr) {
  const int64_t D = dy.shape()[1], C = x.shape()[1];
  Tensor out = into ? into->clone() : Tensor::empty({D, C}, DType::f32, kGpu);
  cuda::matmul_into(dy.transpose(0, 1), x, out, /*accumulate=*/into != nullptr);
  return out;
}

// The reference: dy^T x on the CPU in f32 from the same bf16 values (their products are exact in f32).
std::vector<double> cpu_weight_gradient(const Tensor& x, const Tensor& dy) {
  return matmul(dy.cpu().to(DType::f32).transpose(0, 1), x.cpu().to(DType::f32)).to_vector<double>();
}

enum class Split { Yes, No, Either };

struct Linear {
  const char* name;
  int64_t R, C, D;
  // Yes: the output's tiles leave most of the H200's 132 SMs idle whatever tile cuBLASLt picks;
  // No: they fill it; Either: it depends on the tile (the waves cuBLASLt reports decide).
  Split split;
};

// gpt-tiny's and gpt-small's weight gradients (MODELS.md), and one whose output fills the GPU.
const Linear kLinears[] = {
    {"gpt-tiny proj", 2048, 256, 256, Split::Yes},        {"gpt-tiny qkv", 2048, 256, 768, Split::Either},
    {"gpt-tiny fc2", 2048, 1024, 256, Split::Either},     {"gpt-small proj", 4096, 512, 512, Split::Either},
    {"square output", 1024, 2048, 2048, Split::No},
};

TEST_F(GemmSplitK, WeightGradientsMatchTheCpuAndAddOnce) {
  REEL_REQUIRE_GPU();
  for (const Linear& l : kLinears) {
    SCOPED_TRACE(l.name);
    const Tensor x = operand({l.R, l.C}, DType::bf16, 1), dy = operand({l.R, l.D}, DType::bf16, 2);
    const Tensor c0 = operand({l.D, l.C}, DType::f32, 3);
    const int64_t before = cuda::gemm_split_k_runs();
    const Tensor dw = weight_gradient(x, dy), added = weight_gradient(x, dy, &c0);
    const int64_t runs = cuda::gemm_split_k_runs() - before;
    if (l.split != Split::Either) {
      EXPECT_EQ(runs, l.split == Split::Yes ? 2 : 0);
    }
    EXPECT_TRUE(runs == 0 || runs == 2) << "both calls split, or neither: " << runs;
    const std::vector<double> expected = cpu_weight_gradient(x, dy);
    EXPECT_LE(rel_l2(dw.to_vector<double>(), expected), 1e-5);
    std::vector<double> expected_added = expected;
    const std::vector<double> c0_host = c0.to_vector<double>();
    for (size_t i = 0; i < expected_added.size(); ++i) expected_added[i] += c0_host[i];
    // c0 added twice or not at all would be an O(1) error
    EXPECT_LE(rel_l2(added.to_vector<double>(), expected_added), 1e-5);
  }
}

TEST_F(GemmSplitK, SameBitsOnEveryCallAndInAGraph) {
  REEL_REQUIRE_GPU();
  const Linear& l = kLinears[0];
  const Tensor x = operand({l.R, l.C}, DType::bf16, 4), dy = operand({l.R, l.D}, DType::bf16, 5);
  const Tensor c0 = operand({l.D, l.C}, DType::f32, 6);
  const std::vector<double> first = weight_gradient(x, dy, &c0).to_vector<double>();
  for (int call = 0; call < 3; ++call)
    EXPECT_EQ(weight_gradient(x, dy, &c0).to_vector<double>(), first) << "call " << call;
  // Captured (the plan was made on the eager call above; no device work in the capture), then two
  // replays each adding into the same f32 result, as four micro-batches' gradients accumulate.
  Tensor out = c0.clone();
  const int64_t before = cuda::gemm_split_k_runs();
  cuda::Graph graph;
  graph.capture_begin();
  cuda::matmul_into(dy.transpose(0, 1), x, out, /*accumulate=*/true);
  graph.capture_end();
  EXPECT_EQ(cuda::gemm_split_k_runs(), before + 1);
  graph.replay();
  cuda::synchronize();
  EXPECT_EQ(out.to_vector<double>(), first) << "one replay: c0 + dy^T x, the eager call's bits";
  graph.replay();
  Tensor twice = Tensor::empty(c0.shape(), DType::f32, kGpu);
  copy_(twice, c0);
  cuda::matmul_into(dy.transpose(0, 1), x, twice, true);
  cuda::matmul_into(dy.transpose(0, 1), x, twice, true);
  EXPECT_EQ(out.to_vector<double>(), twice.to_vector<double>()) << "two replays: two eager adds";
}

#endif  // REEL_CUDA

}  // namespace
