// Layer norm on the GPU at training sizes, against the CPU. Backward: dx, dw, db for short rows (a
// warp each) and long ones (a block each), dw and db by the two-stage column reduction, with and
// without a weight, in f32 and bf16, over row counts from 1 to tens of thousands; and the same bits on
// a second run (the column sums run in a fixed order). f32 rows of 128 k columns (k <= 8) take the
// row-in-registers kernels (dw, db summed in the dx pass), others and misaligned views the generic
// ones; both are checked forward and backward. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

std::vector<Tensor> ln_backward(const Tensor& g, const Tensor& x, const Tensor& w) {
  std::vector<Tensor> fwd = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                     Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
  return dispatch(OpKind::LayerNormBackward, {g, x, w, fwd[1], fwd[2]});
}

}  // namespace

TEST(LayerNormCuda, BackwardAtTrainingSizesMatchesTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Device gpu = Device::cuda(0);
  Generator gen(21);
  struct Case {
    int64_t rows, cols;
  };
  for (Case c : {Case{1, 256}, Case{7, 1000}, Case{2048, 256}, Case{4096, 512}, Case{40000, 64}, Case{33, 1500},
                 Case{300, 1024}, Case{5, 384}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (bool weight : {true, false}) {
        SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " " + dtype_name(dt) +
                     (weight ? ", weight" : ", no weight"));
        Tensor x = (randn({c.rows, c.cols}, {}, &gen) * 2.0 + 0.5).to(dt);
        Tensor g = randn({c.rows, c.cols}, {}, &gen).to(dt);
        Tensor w = weight ? randn({c.cols}, {}, &gen).to(dt) : Tensor();
        std::vector<Tensor> cpu = ln_backward(g, x, w);
        std::vector<Tensor> dev = ln_backward(g.to(gpu), x.to(gpu), weight ? w.to(gpu) : Tensor());
        const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
        const char* names[] = {"dx", "dw", "db"};
        for (int k = 0; k < 3; ++k) EXPECT_LT(testing_util::max_rel_diff(dev[k], cpu[k]), tol) << names[k];
        std::vector<Tensor> again = ln_backward(g.to(gpu), x.to(gpu), weight ? w.to(gpu) : Tensor());
        for (int k = 0; k < 3; ++k)
          EXPECT_EQ(again[k].to_vector<double>(), dev[k].to_vector<double>()) << names[k] << " changed between runs";
      }
    }
  }
}

TEST(LayerNormCuda, RowInRegistersKernelsMatchTheCpuAndTheGenericKernels) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Device gpu = Device::cuda(0);
  Generator gen(22);
  const Attrs attrs = Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1));
  // cols 128 k for k = 1, 3, 4, 5, 8 (the row-in-registers kernels) and 200 (generic).
  for (int64_t cols : {128, 384, 512, 640, 1024, 200}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(std::to_string(cols) + " columns" + (affine ? ", w and b" : ", neither"));
      const int64_t rows = 97;
      Tensor x = randn({rows, cols}, {}, &gen) * 2.0 + 0.5, g = randn({rows, cols}, {}, &gen);
      Tensor w = affine ? randn({cols}, {}, &gen) : Tensor(), b = affine ? randn({cols}, {}, &gen) : Tensor();
      auto on = [&](const Tensor& t) { return t.defined() ? t.to(gpu) : Tensor(); };
      std::vector<Tensor> cpu = dispatch(OpKind::LayerNorm, {x, w, b}, attrs);
      std::vector<Tensor> dev = dispatch(OpKind::LayerNorm, {on(x), on(w), on(b)}, attrs);
      const char* fwd_names[] = {"y", "mean", "rstd"};
      for (int k = 0; k < 3; ++k) EXPECT_LT(testing_util::max_rel_diff(dev[k], cpu[k]), 2e-5) << fwd_names[k];
      // The same values in views one float past 16-byte alignment take the generic kernels.
      auto misaligned = [&](const Tensor& t) {
        std::vector<float> v = t.to_vector<float>();
        v.insert(v.begin(), 0.0f);
        return Tensor::from_vector(v, {t.numel() + 1}).to(gpu).slice(0, 1, t.numel() + 1).view(t.shape());
      };
      Tensor x_off = misaligned(x), g_off = misaligned(g);
      ASSERT_NE(reinterpret_cast<uintptr_t>(x_off.data_ptr()) % 16, 0u);
      std::vector<Tensor> generic = dispatch(OpKind::LayerNorm, {x_off, on(w), on(b)}, attrs);
      for (int k = 0; k < 3; ++k) EXPECT_LT(testing_util::max_rel_diff(generic[k], dev[k]), 1e-5) << fwd_names[k];
      std::vector<Tensor> cpu_b = dispatch(OpKind::LayerNormBackward, {g, x, w, cpu[1], cpu[2]});
      std::vector<Tensor> dev_b = dispatch(OpKind::LayerNormBackward, {on(g), on(x), on(w), dev[1], dev[2]});
      const char* bwd_names[] = {"dx", "dw", "db"};
      for (int k = 0; k < 3; ++k) EXPECT_LT(testing_util::max_rel_diff(dev_b[k], cpu_b[k]), 2e-5) << bwd_names[k];
      std::vector<Tensor> generic_b = dispatch(OpKind::LayerNormBackward, {g_off, x_off, on(w), dev[1], dev[2]});
      for (int k = 0; k < 3; ++k) EXPECT_LT(testing_util::max_rel_diff(generic_b[k], dev_b[k]), 2e-5) << bwd_names[k];
    }
  }
}
