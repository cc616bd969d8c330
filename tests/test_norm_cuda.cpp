// Layer norm on the GPU at training sizes, against the CPU. Backward: dx, dw, db for short rows (a
// warp each) and long ones (a block each), dw and db by the two-stage column reduction, with and
// without a weight, in f32 and bf16, over row counts from 1 to tens of thousands; and the same bits on
// a second run (the column sums run in a fixed order). f32 rows of 128 k columns (k <= 8) take the
// row-in-registers kernels (dw, db summed in the dx pass), others and misaligned views the generic
// ones; both are checked forward and backward. Skips without a GPU. At the end: the fused norms'
// 16-bit operands and group norm's channels-last operands against their f32 / contiguous forms, to
// the bit (on the CPU too).
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

// The fused layer norms' 16-bit operands (compile/passes/read_layer_norm_16bit.cpp): a bf16/f16 addend
// (forward) or g (backward) read as its exact widening gives the bits of the same call on the f32
// widening, on the row-in-registers kernels (cols 128 k: widened as they load) and the generic ones
// (cols 200: an f32 copy first). On the CPU as on the GPU.
namespace {

void expect_16bit_operands_equal_their_widening(Device device) {
  Generator gen(31);
  const Attrs norm = Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1));
  for (int64_t cols : {256, 512, 200}) {
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::to_string(cols) + " columns, " + dtype_name(t) + ", " + device.str());
      const int64_t rows = 67;
      Tensor x = (randn({rows, cols}, {}, &gen) * 2.0 + 0.5).to(device), w = randn({cols}, {}, &gen).to(device);
      Tensor b = randn({cols}, {}, &gen).to(device), r = randn({rows, cols}, {}, &gen).to(device);
      Tensor h16 = to_dtype(randn({rows, cols}, {}, &gen).to(device), t), h32 = to_dtype(h16, DType::f32);
      const Attrs cast = Attrs(norm).set("dtype", t);
      std::vector<Tensor> a = dispatch(OpKind::LayerNormCast, {x, w, b, h16}, cast);
      std::vector<Tensor> e = dispatch(OpKind::LayerNormCast, {x, w, b, h32}, cast);
      for (size_t k = 0; k < a.size(); ++k)
        EXPECT_EQ(a[k].to_vector<double>(), e[k].to_vector<double>()) << "forward " << k;
      const Tensor s = e[3];
      for (bool residual : {true, false}) {
        const Attrs add = Attrs().set("dtype", t).set("column_sums", true);
        std::vector<Tensor> ab =
            dispatch(OpKind::LayerNormBackwardAdd, {h16, s, w, e[1], e[2], residual ? r : Tensor()}, add);
        std::vector<Tensor> eb =
            dispatch(OpKind::LayerNormBackwardAdd, {h32, s, w, e[1], e[2], residual ? r : Tensor()}, add);
        for (size_t k = 0; k < ab.size(); ++k)
          EXPECT_EQ(ab[k].to_vector<double>(), eb[k].to_vector<double>())
              << "backward " << k << (residual ? "" : ", no residual");
      }
    }
  }
}

// Group norm on channels-last operands (a convolution's NHWC result and gradient) and into a
// channels-last 16-bit dx: the bits of the same call on (N, C, S)-contiguous copies, dx rounded once.
void expect_group_norm_layouts_give_the_same_bits(Device device) {
  Generator gen(37);
  for (const auto& [shape, groups] : std::vector<std::pair<Shape, int64_t>>{{{4, 128, 8, 8}, 8}, {{3, 12, 5, 7}, 3}}) {
    SCOPED_TRACE(shape_str(shape) + ", " + device.str());
    const int64_t C = shape[1];
    Tensor x16 = to_dtype(randn(shape, {}, &gen).to(device), DType::bf16, MemoryFormat::ChannelsLast);
    Tensor g_cl = to_dtype(randn(shape, {}, &gen).to(device), DType::f32, MemoryFormat::ChannelsLast);
    Tensor w = randn({C}, {}, &gen).to(device), b = randn({C}, {}, &gen).to(device);
    ASSERT_FALSE(x16.is_contiguous());
    const Tensor x16_c = x16.contiguous(), g_c = g_cl.contiguous();
    const Attrs f = Attrs().set("groups", groups).set("eps", 1e-5).set("dtype", DType::f32);
    std::vector<Tensor> y_cl = dispatch(OpKind::GroupNorm, {x16, w, b}, f),
                        y_c = dispatch(OpKind::GroupNorm, {x16_c, w, b}, f);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(y_cl[k].to_vector<double>(), y_c[k].to_vector<double>()) << "forward " << k;
    const Attrs bw = Attrs().set("groups", groups).set("dtype", DType::f32);
    std::vector<Tensor> d_cl = dispatch(OpKind::GroupNormBackward, {g_cl, x16, w, y_c[1], y_c[2]}, bw);
    std::vector<Tensor> d_c = dispatch(OpKind::GroupNormBackward, {g_c, x16_c, w, y_c[1], y_c[2]}, bw);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(d_cl[k].to_vector<double>(), d_c[k].to_vector<double>()) << "backward " << k;
    // dx16 handed over channels-last, as the compiled step does: the contiguous f32 dx rounded once.
    std::vector<Tensor> d16{Tensor::empty(shape, DType::bf16, device, MemoryFormat::ChannelsLast),
                            Tensor::empty({C}, DType::f32, device), Tensor::empty({C}, DType::f32, device)};
    dispatch_out(OpKind::GroupNormBackward, {g_cl, x16, w, y_c[1], y_c[2]}, d16,
                 Attrs(bw).set("dx_dtype", DType::bf16));
    EXPECT_EQ(d16[0].to_vector<double>(), to_dtype(d_c[0], DType::bf16).to_vector<double>()) << "dx16";
    for (size_t k = 1; k < 3; ++k) EXPECT_EQ(d16[k].to_vector<double>(), d_c[k].to_vector<double>()) << "dw, db";
  }
}

}  // namespace

// Group norm's dw and db: the (N, C) per-sample partials summed over N by the backward's last block
// where they are few (2 N C <= 65536) and by the separate stage-2 kernel where they are many; the
// CPU's values either way, and the same bits on a second run.
TEST(GroupNormCuda, ParamGradientsFromTheLastBlockOrStageTwoMatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Generator gen(41);
  for (const Shape& shape : {Shape{32, 128, 8, 8}, Shape{5, 24, 3, 3}, Shape{72, 512, 2, 2}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t C = shape[1];
    Tensor x = randn(shape, {}, &gen), g = randn(shape, {}, &gen), w = randn({C}, {}, &gen), b = randn({C}, {}, &gen);
    const Attrs f = Attrs().set("groups", int64_t(8)).set("eps", 1e-5);
    std::vector<Tensor> y = dispatch(OpKind::GroupNorm, {x, w, b}, f);
    std::vector<Tensor> ref = dispatch(OpKind::GroupNormBackward, {g, x, w, y[1], y[2]}, Attrs().set("groups", int64_t(8)));
    const Device gpu = Device::cuda(0);
    auto on_gpu = [&]() {
      return dispatch(OpKind::GroupNormBackward, {g.to(gpu), x.to(gpu), w.to(gpu), y[1].to(gpu), y[2].to(gpu)},
                      Attrs().set("groups", int64_t(8)));
    };
    const std::vector<Tensor> d = on_gpu(), again = on_gpu();
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_LT(testing_util::max_rel_diff(d[k], ref[k]), 1e-4) << "output " << k;
      EXPECT_EQ(d[k].to_vector<double>(), again[k].to_vector<double>()) << "output " << k << " run to run";
    }
  }
}

TEST(LayerNorm16bitOperands, EqualTheirWideningToTheBitOnTheCpu) {
  expect_16bit_operands_equal_their_widening(Device::cpu());
}
TEST(LayerNorm16bitOperandsCuda, EqualTheirWideningToTheBitOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_16bit_operands_equal_their_widening(Device::cuda(0));
}
TEST(GroupNormLayouts, ChannelsLastGivesTheContiguousBitsOnTheCpu) {
  expect_group_norm_layouts_give_the_same_bits(Device::cpu());
}
TEST(GroupNormLayoutsCuda, ChannelsLastGivesTheContiguousBitsOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_group_norm_layouts_give_the_same_bits(Device::cuda(0));
}
