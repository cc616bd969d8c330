// The fused masked-softmax kernels (kernels/cuda/masked_softmax.h) against the ops they replace, run
// on the GPU one by one: equal to the bit, the 16-bit copies equal to casting the f32 results, for
// short rows (a warp each) and long ones (a block each). Skips without a GPU; compiled only with the
// CUDA backend (the kernels' entry points exist only there).
#include <gtest/gtest.h>

#include <limits>

#include "reel.h"
#include "tensor/cuda.h"

#ifdef REEL_CUDA
#include "kernels/cuda/masked_softmax.h"

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

// (T, C) causal mask as attention builds it: 1 where key c comes after query t.
Tensor causal_mask(int64_t T, int64_t C) {
  Tensor t = arange(T, {DType::i64, kGpu}).reshape({T, 1}), c = arange(C, {DType::i64, kGpu}).reshape({1, C});
  return to_dtype(gt(c, t), DType::f32);
}

}  // namespace

TEST(MaskedSoftmaxCuda, ForwardAndBackwardEqualTheUnfusedOpsToTheBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (int64_t C : {64, 200, 1500}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t B = 3, T = C;  // square scores, as in causal attention
    Generator gen(1);
    Tensor x = randn({B, T, C}, {DType::f32, kGpu}, &gen), g = randn({B, T, C}, {DType::f32, kGpu}, &gen);
    Tensor mask = causal_mask(T, C);
    const double inf = std::numeric_limits<double>::infinity();
    Tensor y_ref = softmax(masked_fill(x, mask, -inf), -1);
    Tensor y = Tensor::empty(x.shape(), DType::f32, kGpu), y16 = Tensor::empty(x.shape(), DType::bf16, kGpu);
    cuda::masked_softmax_fwd(x, mask, -inf, y, y16);
    EXPECT_EQ(y.to_vector<double>(), y_ref.to_vector<double>());
    EXPECT_EQ(y16.to_vector<double>(), to_dtype(y_ref, DType::bf16).to_vector<double>());

    Tensor dx_ref = masked_fill(dispatch1(OpKind::SoftmaxBackward, {g, y_ref}, Attrs().set("dim", int64_t(-1))), mask, 0.0);
    Tensor dx = Tensor::empty(x.shape(), DType::f32, kGpu), dx16 = Tensor::empty(x.shape(), DType::f16, kGpu);
    cuda::masked_softmax_bwd(g, y_ref, mask, dx, dx16);
    EXPECT_EQ(dx.to_vector<double>(), dx_ref.to_vector<double>());
    EXPECT_EQ(dx16.to_vector<double>(), to_dtype(dx_ref, DType::f16).to_vector<double>());
    // Only the 16-bit result asked for.
    Tensor only16 = Tensor::empty(x.shape(), DType::bf16, kGpu);
    cuda::masked_softmax_bwd(g, y_ref, mask, Tensor(), only16);
    EXPECT_EQ(only16.to_vector<double>(), to_dtype(dx_ref, DType::bf16).to_vector<double>());
  }
}

TEST(MaskedSoftmaxCuda, RefusesLayoutsItCannotRead) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Tensor x = zeros({2, 4, 4}, {DType::f32, kGpu}), y = zeros({2, 4, 4}, {DType::f32, kGpu});
  Tensor bad_mask = zeros({4, 3}, {DType::f32, kGpu});
  try {
    cuda::masked_softmax_fwd(x, bad_mask, 0.0, y, Tensor());
    ADD_FAILURE() << "expected reel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("masked_softmax"), std::string::npos) << e.what();
  }
}

#endif  // REEL_CUDA
