// Channels-last (NHWC) convolutions: the memory-format helpers, conv2d keeping its operands' layout
// through forward and both gradients, casts into a layout with the gradient coming back in the
// source's layout, and autocast's channels-last convolutions on the GPU against the NCHW path and the
// CPU (the same numbers, up to the different summation order cuDNN picks per layout), eager and
// compiled.
#include <gtest/gtest.h>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using testing_util::max_rel_diff;

namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::f64, Device device = Device::cpu()) {
  Generator g(seed);
  return randn(shape, TensorOptions{dtype, device}, &g);
}

// A copy of t stored channels-last (values equal, strides NHWC).
Tensor channels_last_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), MemoryFormat::ChannelsLast);
  dispatch_out(OpKind::Copy, {t}, {c});
  return c;
}

// An identity whose backward keeps the gradient it passes on (a leaf's .grad is always a fresh
// contiguous copy, so the layout an op hands back is seen here).
Tensor gradient_probe(const Tensor& x, Tensor* seen) {
  Tensor y = Tensor::make_view(x, x.shape(), x.strides(), x.offset());
  autograd::record("gradient_probe", {x}, {y}, [seen](const autograd::Grads& g) -> autograd::Grads {
    *seen = g[0];
    return {g[0]};
  });
  return y;
}

// Restores the process-wide switch however a test ends.
struct ChannelsLastSwitch {
  bool before = autocast_channels_last();
  explicit ChannelsLastSwitch(bool on) { set_autocast_channels_last(on); }
  ~ChannelsLastSwitch() { set_autocast_channels_last(before); }
};

}  // namespace

TEST(MemoryFormat, StridesAndQueries) {
  EXPECT_EQ(strides_for({2, 3, 4, 5}, MemoryFormat::Contiguous), (Shape{60, 20, 5, 1}));
  EXPECT_EQ(strides_for({2, 3, 4, 5}, MemoryFormat::ChannelsLast), (Shape{60, 1, 15, 3}));
  Tensor t = Tensor::empty({2, 3, 4, 5}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast);
  EXPECT_TRUE(t.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.suggested_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(t.storage()->nbytes(), size_t(2 * 3 * 4 * 5 * 4));
  // A permuted NHWC buffer is the same layout.
  Tensor p = Tensor::empty({2, 4, 5, 3}).permute({0, 3, 1, 2});
  EXPECT_TRUE(p.is_contiguous(MemoryFormat::ChannelsLast));
  // Size-1 channels or pixels make both layouts one: contiguous wins the suggestion.
  Tensor one = Tensor::empty({2, 1, 4, 5}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast);
  EXPECT_TRUE(one.is_contiguous());
  EXPECT_EQ(one.suggested_format(), MemoryFormat::Contiguous);
  // Not 4-D: never channels-last, and asking for its strides is an error naming the shape.
  EXPECT_FALSE(Tensor::empty({3, 4}).is_contiguous(MemoryFormat::ChannelsLast));
  testing_util::expect_error([] { strides_for({3, 4, 5}, MemoryFormat::ChannelsLast); },
                             {"channels_last", "4-D", "(3, 4, 5)"});
}

TEST(ChannelsLastCast, LayoutValuesAndGradientLayout) {
  Tensor x = random({2, 3, 4, 5}, 1, DType::f32).set_requires_grad();
  Tensor dx, dy;
  Tensor y = to_dtype(gradient_probe(x, &dx), DType::f64, MemoryFormat::ChannelsLast);
  EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(y.to_vector<double>(), x.to_vector<double>());  // element by element in logical order
  // Already in the dtype and the layout: x itself.
  EXPECT_TRUE(to_dtype(y, DType::f64, MemoryFormat::ChannelsLast).is_same(y));
  Tensor yc = to_dtype(gradient_probe(y, &dy), DType::f32);  // back to contiguous f32
  EXPECT_TRUE(yc.is_contiguous());
  // The gradient of each cast comes back in its source's layout: through yc's cast to y
  // channels-last, then through y's cast to x contiguous.
  Tensor w = random({2, 3, 4, 5}, 2, DType::f32);
  sum(mul(yc, w)).backward();
  EXPECT_TRUE(dy.is_contiguous(MemoryFormat::ChannelsLast) && !dy.is_contiguous());
  EXPECT_EQ(dy.dtype(), DType::f64);
  EXPECT_TRUE(dx.is_contiguous());
  EXPECT_EQ(dx.to_vector<double>(), w.to_vector<double>());
  // Not 4-D: the format does not apply, the cast is contiguous.
  EXPECT_TRUE(to_dtype(random({3, 4}, 3, DType::f32), DType::f64, MemoryFormat::ChannelsLast).is_contiguous());
}

// conv2d keeps x's layout for y and dx and the weight's for dw; the values are the contiguous ones.
TEST(ChannelsLastConv2d, KeepsLayoutsAndValuesOnTheCpu) {
  Tensor x = random({2, 4, 7, 6}, 10), w = random({5, 4, 3, 3}, 11), b = random({5}, 12);
  Tensor g = random({2, 5, 4, 3}, 13);
  auto run = [&](bool channels_last, Tensor& y, Tensor& dx, Tensor& dw, Tensor& db) {
    Tensor xi = (channels_last ? channels_last_copy(x) : x.clone()).set_requires_grad();
    Tensor wi = (channels_last ? channels_last_copy(w) : w.clone()).set_requires_grad();
    Tensor bi = b.clone().set_requires_grad();
    y = conv2d(gradient_probe(xi, &dx), gradient_probe(wi, &dw), bi, 2, 1);
    sum(mul(y, g)).backward();
    db = bi.grad();
    EXPECT_LE(max_rel_diff(xi.grad(), dx), 0.0);  // the leaf's copy holds the same values
  };
  Tensor y0, dx0, dw0, db0, y1, dx1, dw1, db1;
  run(false, y0, dx0, dw0, db0);
  run(true, y1, dx1, dw1, db1);
  EXPECT_TRUE(y1.is_contiguous(MemoryFormat::ChannelsLast) && !y1.is_contiguous());
  EXPECT_TRUE(dx1.is_contiguous(MemoryFormat::ChannelsLast) && !dx1.is_contiguous());
  EXPECT_TRUE(dw1.is_contiguous(MemoryFormat::ChannelsLast) && !dw1.is_contiguous());
  EXPECT_TRUE(y0.is_contiguous() && dx0.is_contiguous() && dw0.is_contiguous());
  EXPECT_LE(max_rel_diff(y1, y0), 1e-14);
  EXPECT_LE(max_rel_diff(dx1, dx0), 1e-14);
  EXPECT_LE(max_rel_diff(dw1, dw0), 1e-14);
  EXPECT_LE(max_rel_diff(db1, db0), 1e-14);
}

TEST(ChannelsLastConv2d, AutocastStaysContiguousOnTheCpu) {
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  Tensor x = random({2, 4, 6, 6}, 20, DType::f32), w = random({8, 4, 3, 3}, 21, DType::f32);
  Tensor y = autocast_conv2d(x, w, Tensor(), 1, 1, autocast_policy());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.dtype(), DType::f32);
}

// On the GPU each of the three ops runs NHWC (cuDNN's native tensor-core layout) when its activation
// is channels-last: y, dx and dw equal the NCHW path and the CPU to within the dtype's summation
// round-off, for f32 (exact FMA sums), bf16 and f16, with a bias, stride 2 and a 3-channel input.
TEST(ChannelsLastConv2dCuda, AllThreeOpsMatchNchwAndTheCpu) {
  REEL_REQUIRE_GPU();
  struct Case {
    Shape x, w;
    int64_t stride;
    bool bias;
  };
  // Few input channels and O a multiple of 16 take the stem kernels for the 16-bit NHWC forward and
  // weight gradient: one or many slices per block (40 x 32 x 32 positions: five a block, loaded four
  // at a time, then one), K padded to 16, 32 and 64, O 16 to 64, stride 1 and 2, with and without a
  // bias; O = 8 does not.
  for (const Case& c : {Case{{4, 16, 12, 10}, {32, 16, 3, 3}, 1, true}, Case{{3, 3, 16, 16}, {16, 3, 3, 3}, 1, false},
                        Case{{2, 3, 11, 9}, {16, 3, 3, 3}, 2, true}, Case{{8, 3, 40, 40}, {32, 3, 3, 3}, 1, false},
                        Case{{4, 1, 20, 20}, {48, 1, 3, 3}, 1, false}, Case{{2, 6, 10, 10}, {64, 6, 3, 3}, 1, true},
                        Case{{2, 3, 11, 9}, {8, 3, 3, 3}, 2, true}, Case{{2, 32, 9, 9}, {8, 32, 3, 3}, 2, false},
                        Case{{40, 3, 32, 32}, {32, 3, 3, 3}, 1, false}}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " x " + shape_str(c.x));
      const double tol = dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 4e-3;
      Tensor x = random(c.x, 30, DType::f32).to(dt), w = random(c.w, 31, DType::f32).to(dt);
      Tensor b = c.bias ? random({c.w[0]}, 32, DType::f32).to(dt) : Tensor();
      const int64_t pad = 1;
      // The CPU reference on the same (rounded) values.
      Tensor y_ref = conv2d(x, w, b, c.stride, pad);
      Tensor g = random(y_ref.shape(), 33, DType::f32).to(dt);
      Attrs a = Attrs().set("stride", std::vector<int64_t>{c.stride, c.stride})
                    .set("padding", std::vector<int64_t>{pad, pad});
      Tensor dx_ref = dispatch1(OpKind::Conv2dBackwardInput, {g, w}, Attrs(a).set("input_shape", c.x));
      Tensor dw_ref = dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, Attrs(a).set("weight_shape", c.w));
      const Device gpu = Device::cuda();
      for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
        SCOPED_TRACE(memory_format_name(f));
        auto on_gpu = [&](const Tensor& t) {
          Tensor d = t.to(gpu);
          return f == MemoryFormat::ChannelsLast ? channels_last_copy(d) : d;
        };
        Tensor xg = on_gpu(x), wg = on_gpu(w), gg = on_gpu(g);
        Tensor y = dispatch1(OpKind::Conv2d, {xg, wg, b.defined() ? b.to(gpu) : Tensor()}, a, f);
        Tensor dx = dispatch1(OpKind::Conv2dBackwardInput, {gg, wg}, Attrs(a).set("input_shape", c.x), f);
        Tensor dw = dispatch1(OpKind::Conv2dBackwardWeight, {gg, xg}, Attrs(a).set("weight_shape", c.w), f);
        EXPECT_TRUE(y.is_contiguous(f) && dx.is_contiguous(f) && dw.is_contiguous(f));
        EXPECT_LE(max_rel_diff(y, y_ref), tol);
        EXPECT_LE(max_rel_diff(dx, dx_ref), tol);
        EXPECT_LE(max_rel_diff(dw, dw_ref), tol);
        // The same bits on a second run (the stem path's split sum is added in a fixed order).
        Tensor dw2 = dispatch1(OpKind::Conv2dBackwardWeight, {gg, xg}, Attrs(a).set("weight_shape", c.w), f);
        EXPECT_EQ(dw2.to_vector<double>(), dw.to_vector<double>());
        // Mixed layouts (a contiguous gradient into an NHWC call) are converted, not misread.
        Tensor dx_mixed = dispatch1(OpKind::Conv2dBackwardInput, {g.to(gpu), wg}, Attrs(a).set("input_shape", c.x),
                                    MemoryFormat::ChannelsLast);
        EXPECT_LE(max_rel_diff(dx_mixed, dx_ref), tol);
      }
    }
  }
}

// cnn-small's loss and gradients under bf16 autocast on the GPU: the channels-last path equals the
// NCHW one within bf16 round-off, and its 16-bit convolution operands really are NHWC.
TEST(ChannelsLastConv2dCuda, AutocastCnnMatchesTheNchwPath) {
  REEL_REQUIRE_GPU();
  Generator gx(3);
  Tensor x = randn({8, 3, 32, 32}, {}, &gx).to(Device::cuda());
  Tensor y = tensor_i64({0, 1, 2, 3, 4, 5, 6, 7}, {8}).to(Device::cuda());
  std::vector<Tensor> loss(2);
  std::vector<std::vector<Tensor>> grads(2);
  for (int on = 0; on < 2; ++on) {
    ChannelsLastSwitch sw(on == 1);
    Generator g(1);
    auto model = nn::cnn_small(&g);
    model->to(Device::cuda());
    AutocastGuard amp(PrecisionPolicy::parse("bf16"));
    loss[on] = nn::model_loss(*model, x, y);
    loss[on].backward();
    for (const auto& [name, p] : model->named_parameters()) grads[on].push_back(p.grad());
  }
  EXPECT_NEAR(loss[1].item(), loss[0].item(), 1e-2 * std::fabs(loss[0].item()));
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(grads[1][i].is_contiguous()) << "parameter " << i;  // master gradients stay f32 contiguous
    EXPECT_LE(max_rel_diff(grads[1][i], grads[0][i]), 5e-2) << "parameter " << i;
  }
  // The 16-bit operands autocast hands cuDNN.
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  Tensor x16 = autocast_policy().cast_for_compute(x, MemoryFormat::ChannelsLast);
  EXPECT_TRUE(x16.is_contiguous(MemoryFormat::ChannelsLast) && x16.dtype() == DType::bf16);
}

// Casts into and out of channels-last on the GPU take a tiled transpose; every element lands where the
// CPU's elementwise copy puts it, to the bit, for tile-ragged shapes and every dtype pair autocast uses.
TEST(ChannelsLastCastCuda, TransposingCastsEqualTheCpuToTheBit) {
  REEL_REQUIRE_GPU();
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 40, 6, 6}, Shape{1, 3, 33, 31}, Shape{4, 64, 1, 1}}) {
    for (auto [from, to] : {std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f32},
                            std::pair{DType::f32, DType::f16}, std::pair{DType::f64, DType::f32}}) {
      SCOPED_TRACE(shape_str(shape) + " " + dtype_name(from) + " -> " + dtype_name(to));
      Tensor x = random(shape, 40, from);
      std::vector<double> want = x.to(to).to_vector<double>();
      Tensor xg = x.to(Device::cuda());
      Tensor nhwc = to_dtype(xg, to, MemoryFormat::ChannelsLast);  // NCHW -> NHWC
      EXPECT_TRUE(nhwc.is_contiguous(MemoryFormat::ChannelsLast));
      EXPECT_EQ(nhwc.to_vector<double>(), want);
      Tensor back = to_dtype(channels_last_copy(xg), to);  // NHWC -> NCHW
      EXPECT_TRUE(back.is_contiguous());
      EXPECT_EQ(back.to_vector<double>(), want);
    }
  }
}

// The compiled cnn-small step under bf16 keeps the layouts eager chose: every convolution node of the
// plan reads and writes channels-last 16-bit tensors (so cuDNN gets no NCHW operand to transpose).
TEST(ChannelsLastCompileCuda, PlanConvolutionsAreChannelsLast) {
  REEL_REQUIRE_GPU();
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  nn::Workload w = nn::make_workload("cnn-small", Device::cuda(), 2, 8);
  std::vector<optim::MicroBatch> micro;
  for (const auto& [x, y] : w.micro) micro.push_back({x, y});
  optim::AdamW opt(w.model->parameters(), optim::AdamWOptions(1e-3));
  opt.set_accum_steps(2);
  nn::Module* m = w.model.get();
  auto step = compile::compile_train_step(
      opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); }, {compile::Mode::ReduceOverhead});
  for (int i = 0; i < 3; ++i) step(compile::flatten_micro(micro));
  ASSERT_NE(step.last_plan(), nullptr);
  int convs = 0;
  for (const compile::Node& n : step.last_plan()->graph().nodes) {
    if (n.op != OpKind::Conv2d && n.op != OpKind::Conv2dBackwardInput && n.op != OpKind::Conv2dBackwardWeight) continue;
    ++convs;
    for (const auto& r : n.inputs) {
      if (r) {
        EXPECT_TRUE(has_format(r->shape, r->strides, MemoryFormat::ChannelsLast)) << op_name(n.op);
      }
    }
    EXPECT_TRUE(has_format(n.outputs[0].shape, n.outputs[0].strides, MemoryFormat::ChannelsLast)) << op_name(n.op);
  }
  // 5 forward, 4 input-gradient (the stem's input needs none) and 5 weight-gradient convolutions per
  // micro-batch.
  EXPECT_EQ(convs, 2 * (5 + 4 + 5));
}
