// Group and batch norm reading a bf16/f16 x as f32 (attr dtype = f32; kernels/schema/norm.cpp): what
// the compiler writes where autocast cast a convolution's 16-bit result to f32 for the norm
// (compile/passes/read_norm_input_16bit.cpp). The widening is exact, so the mixed call must give the
// bits of x.to(f32) through the f32 op: forward and backward, training (running statistics too) and
// eval, contiguous and channels-last x, inputs large enough for the threaded and the multi-chunk
// paths. On the CPU here; on the GPU against the GPU's own cast-then-f32 (skips without one). The
// schema's answers and errors for the calls that are not this case.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "reel.h"
#include "test_util.h"

using namespace reel;
using testing_util::expect_error;

namespace {

struct Case {
  const char* name;
  Shape x;
  bool batch, training, affine, channels_last;
  int64_t groups = 1;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"batch norm, training, 8x16x12x12", {8, 16, 12, 12}, true, true, true, false},
      {"batch norm, training, channels-last, no affine", {4, 8, 6, 6}, true, true, false, true},
      {"batch norm, eval, channels-last", {4, 8, 6, 6}, true, false, true, true},
      {"batch norm, training, several chunks a channel", {16, 4, 32, 32}, true, true, true, false},
      {"group norm, 8x16x12x12, 4 groups", {8, 16, 12, 12}, false, true, true, false, 4},
      {"group norm, channels-last, no affine, 2 groups", {4, 8, 6, 6}, false, true, false, true, 2},
  };
  return c;
}

struct Call {
  Tensor x, w, b, running_mean, running_var, g;
  Attrs forward, backward;
};

// x in `dtype` (channels-last where the case says), the rest f32, all on `device`.
Call make_call(const Case& c, DType dtype, Device device) {
  Generator gen(77);
  Call k;
  k.x = randn(c.x, {}, &gen) * 1.5 + 0.25;
  const Shape channels{c.x[1]};
  if (c.affine) k.w = randn(channels, {}, &gen) * 0.5 + 1.0, k.b = randn(channels, {}, &gen) * 0.5;
  k.g = randn(c.x, {}, &gen);
  if (c.batch) k.running_mean = randn(channels, {}, &gen) * 0.5, k.running_var = rand(channels, {}, &gen) + 0.5;
  for (Tensor* t : {&k.x, &k.w, &k.b, &k.running_mean, &k.running_var, &k.g})
    if (t->defined()) *t = t->to(device);
  k.x = to_dtype(k.x, dtype, c.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
  k.forward = Attrs().set("eps", 1e-5);
  k.backward = Attrs();
  if (c.batch) {
    k.forward.set("training", c.training).set("momentum", 0.1);
    k.backward.set("training", c.training);
  } else {
    k.forward.set("groups", c.groups);
    k.backward.set("groups", c.groups);
  }
  return k;
}

struct Results {
  std::vector<Tensor> forward, backward, running;  // running: the statistics after the forward
};

// The forward and the backward on x as given (with attr dtype = f32 when x is 16-bit), running
// statistics updated on copies of the call's.
Results run(const Case& c, const Call& k, const Tensor& x) {
  Attrs f = k.forward, b = k.backward;
  if (x.dtype() != DType::f32) f.set("dtype", DType::f32), b.set("dtype", DType::f32);
  Results r;
  if (c.batch) {
    r.running = {clone(k.running_mean), clone(k.running_var)};
    r.forward = dispatch(OpKind::BatchNorm, {x, k.w, k.b, r.running[0], r.running[1]}, f);
    r.backward = dispatch(OpKind::BatchNormBackward, {k.g, x, k.w, r.forward[1], r.forward[2]}, b);
  } else {
    r.forward = dispatch(OpKind::GroupNorm, {x, k.w, k.b}, f);
    r.backward = dispatch(OpKind::GroupNormBackward, {k.g, x, k.w, r.forward[1], r.forward[2]}, b);
  }
  return r;
}

constexpr auto same_bits = testing_util::same_tensor_bits;

// The mixed call against x.to(f32) through the f32 op, on `device`: every output and the running
// statistics, to the bit.
void expect_same_bits_as_casting_first(Device device) {
  const char* forward_names[] = {"y", "mean", "rstd"};
  const char* backward_names[] = {"dx", "dw", "db"};
  for (const Case& c : cases())
    for (DType dtype : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(c.name) + ", x " + dtype_name(dtype) + ", " + device.str());
      const Call k = make_call(c, dtype, device);
      EXPECT_EQ(k.x.is_contiguous(), !c.channels_last);
      // The cast keeps x's layout: the GPU's batch norm reads a channels-last x in tiles, summing in
      // another order than over (N, C, H, W) (kernels/cuda/batch_norm.cu).
      const Tensor x32 = to_dtype(k.x, DType::f32, c.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
      const Results mixed = run(c, k, k.x), cast = run(c, k, x32);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(mixed.forward[i].dtype(), DType::f32);
        EXPECT_TRUE(same_bits(mixed.forward[i], cast.forward[i])) << forward_names[i];
        EXPECT_TRUE(same_bits(mixed.backward[i], cast.backward[i])) << backward_names[i];
      }
      for (size_t i = 0; i < mixed.running.size(); ++i)
        EXPECT_TRUE(same_bits(mixed.running[i], cast.running[i])) << (i ? "running_var" : "running_mean");
    }
}

}  // namespace

TEST(Norm16BitInput, EqualsCastThenF32ToTheBitOnTheCpu) { expect_same_bits_as_casting_first(Device::cpu()); }

TEST(Norm16BitInputCuda, EqualsCastThenF32ToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_same_bits_as_casting_first(Device::cuda(0));
}

// The eager path is unchanged: without the attr a 16-bit x still wants 16-bit weights.
TEST(Norm16BitInput, SchemaStatesF32OutputsAndRefusesOtherMixes) {
  const Tensor x = randn({2, 3, 4}).to(DType::bf16), w = ones({3}), b = zeros({3});
  const Attrs train = Attrs().set("training", true).set("momentum", 0.1).set("eps", 1e-5);
  const Attrs widened = Attrs(train).set("dtype", DType::f32);
  std::vector<TensorMeta> m = infer_outputs(OpKind::BatchNorm, {x, w, b, Tensor(), Tensor()}, widened);
  ASSERT_EQ(m.size(), 3u);
  for (const TensorMeta& t : m) EXPECT_EQ(t.dtype, DType::f32);
  EXPECT_EQ(m[0].shape, x.shape());
  m = infer_outputs(OpKind::GroupNorm, {x, w, b}, Attrs().set("groups", 3).set("eps", 1e-5).set("dtype", DType::f32));
  EXPECT_EQ(m[0].dtype, DType::f32);

  expect_error([&] { dispatch(OpKind::BatchNorm, {x, w, b, Tensor(), Tensor()}, train); },
               {"batch_norm: weight has dtype f32 but x has dtype bf16"});
  const Tensor w16 = w.to(DType::bf16);
  expect_error([&] { dispatch(OpKind::BatchNorm, {x, w16, b, Tensor(), Tensor()}, widened); },
               {"batch_norm: weight has dtype bf16 but expected f32 for x of dtype bf16 read as f32 (attr dtype)"});
  expect_error([&] { dispatch(OpKind::BatchNorm, {x.to(DType::f64), w, b, Tensor(), Tensor()}, widened); },
               {"batch_norm: dtype f32 with x of dtype f64", "a bf16/f16 x as f32"});
  expect_error([&] { dispatch(OpKind::BatchNorm, {x.to(DType::f32), w, b, Tensor(), Tensor()},
                              Attrs(train).set("dtype", DType::bf16)); },
               {"batch_norm: dtype bf16 with x of dtype f32"});
  std::vector<Tensor> f = dispatch(OpKind::BatchNorm, {x, w, b, Tensor(), Tensor()}, widened);
  // g in f32 or in x's own 16-bit dtype (a convolution's gradient, compile/passes/fuse_norm_relu.cpp);
  // not in the other 16-bit dtype.
  expect_error([&] { dispatch(OpKind::BatchNormBackward, {f[0].to(DType::f16), x, w, f[1], f[2]},
                              Attrs().set("training", true).set("dtype", DType::f32)); },
               {"batch_norm_backward: gradient (2, 3, 4) f16 does not match x (2, 3, 4) bf16 read as f32"});
  expect_error([&] { dispatch(OpKind::GroupNormBackward, {f[0], x, w16, f[1].reshape({1, 3}).expand({2, 3}),
                                                          f[2].reshape({1, 3}).expand({2, 3})},
                              Attrs().set("groups", 3).set("dtype", DType::f32)); },
               {"group_norm_backward: weight has dtype bf16 but expected f32"});
}
