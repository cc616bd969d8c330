// Layer norm's backward on the GPU at training sizes, against the CPU: dx, dw, db for short rows (a
// warp each) and long ones (a block each), dw and db by the two-stage column reduction, with and
// without a weight, in f32 and bf16, over row counts from 1 to tens of thousands; and the same bits on
// a second run (the column sums run in a fixed order). Skips without a GPU.
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
  for (Case c : {Case{1, 256}, Case{7, 1000}, Case{2048, 256}, Case{4096, 512}, Case{40000, 64}, Case{33, 1500}}) {
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
