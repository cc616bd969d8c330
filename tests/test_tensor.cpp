// Tensor basics: storage sharing, strides and views, contiguous copies, casts, 16-bit conversions,
// the seeded Philox RNG and printing.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

TEST(Tensor, FromVectorAndShape) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Tensor, ViewsShareStorageWithoutCopying) {
  Tensor t = tensor({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tr = t.t();
  EXPECT_TRUE(tr.shares_storage(t));
  EXPECT_EQ(tr.shape(), (Shape{3, 2}));
  EXPECT_EQ(tr.strides(), (Shape{1, 3}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  Tensor r = t.reshape({3, 2});
  EXPECT_TRUE(r.shares_storage(t));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_TRUE(s.shares_storage(t));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{1, 2, 4, 5}));
  Tensor e = tensor({7, 8, 9}, {3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(e.to_vector<double>()[5], 8);

  // Writing through a view is visible in the base.
  fill_(s, -1);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{0, -1, -1, 3, -1, -1}));
}

TEST(Tensor, ContiguousCopiesOnlyWhenNeeded) {
  Tensor t = tensor({0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_TRUE(t.contiguous().is_same(t));
  Tensor c = t.t().contiguous();
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // A reshape that cannot be a view copies; view() refuses instead.
  Tensor flat = t.t().reshape({6});
  EXPECT_FALSE(flat.shares_storage(t));
  EXPECT_EQ(flat.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  expect_error([&] { t.t().view({6}); }, {"view", "(3, 2)", "reshape()"});
}

TEST(Tensor, StepSliceAndSelect) {
  Tensor t = arange(10, {DType::f64});
  EXPECT_EQ(t.slice(0, 1, 9, 3).to_vector<double>(), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(t.slice(0, -3, 100).to_vector<double>(), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(select(t.reshape({2, 5}), 0, -1).to_vector<double>(), (std::vector<double>{5, 6, 7, 8, 9}));
}

TEST(Tensor, CastsBetweenDtypes) {
  Tensor t = tensor({1.5, -2.25, 3e5, 0.1}, {4});
  EXPECT_EQ(t.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 300000, 0}));
  std::vector<double> h = t.to(DType::f16).to_vector<double>();
  EXPECT_EQ(h[0], 1.5);
  EXPECT_EQ(h[1], -2.25);
  EXPECT_TRUE(std::isinf(h[2]));  // 3e5 exceeds f16's 65504
  EXPECT_NEAR(h[3], 0.1, 1e-4);
  std::vector<double> b = t.to(DType::bf16).to_vector<double>();
  EXPECT_NEAR(b[2], 3e5, 3e5 / 128);
  EXPECT_NEAR(b[3], 0.1, 1e-3);
}

TEST(Tensor, HalfConversionRoundsToNearestEven) {
  // Every f16 bit pattern (but NaNs) survives f16 -> f32 -> f16.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = half_bits_to_float(uint16_t(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half_bits(f), bits) << "bits " << bits;
  }
  EXPECT_EQ(float(Half(1.0f + 1.0f / 2048)), 1.0f);               // tie to even (down)
  EXPECT_EQ(float(Half(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie to even (up)
  EXPECT_EQ(float(Half(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(Half(65520.0f))));
  EXPECT_EQ(float(Half(5.96046448e-08f)), 5.96046448e-08f);  // smallest subnormal
  EXPECT_EQ(float(BFloat16(1.0f + 1.0f / 256)), 1.0f);       // tie to even
  EXPECT_TRUE(std::isnan(float(BFloat16(NAN))));
}

TEST(Tensor, SeededRngIsReproducibleAndWellDistributed) {
  Generator g1(42), g2(42);
  Tensor a = randn({100000}, {}, &g1), b = randn({100000}, {}, &g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = randn({100000}, {}, &g1);  // the generator advanced: fresh numbers
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  double mean = 0, var = 0;
  for (float v : a.to_vector<float>()) mean += v;
  mean /= 1e5;
  for (float v : a.to_vector<float>()) var += (v - mean) * (v - mean);
  var /= 1e5;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.02);
  Tensor u = uniform({100000}, -1, 3, {DType::f64}, &g1);
  double lo = 1e9, hi = -1e9, um = 0;
  for (double v : u.to_vector<double>()) lo = std::min(lo, v), hi = std::max(hi, v), um += v;
  EXPECT_GE(lo, -1.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_NEAR(um / 1e5, 1.0, 0.02);
}

TEST(Tensor, PrintsLikePyTorch) {
  EXPECT_EQ(tensor({1, 2.5, -3, 4}, {2, 2}).str(), "tensor([[ 1.0000,  2.5000],\n        [-3.0000,  4.0000]], dtype=f32)");
  EXPECT_EQ(tensor_i64({3, 10}, {2}).str(), "tensor([ 3, 10], dtype=i64)");
  Tensor big = zeros({2000});
  EXPECT_NE(big.str().find("..."), std::string::npos);
  Tensor p = ones({2}).set_requires_grad();
  EXPECT_NE(p.str().find("requires_grad=true"), std::string::npos);
}

TEST(Tensor, DeviceParsing) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  expect_error([] { Device::parse("gpu0"); }, {"device", "gpu0"});
}
