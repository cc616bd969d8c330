// The CUDA backend against the CPU, op by op. Every case of the op catalogue (autograd/cases/) runs
// on both devices from the same seeded inputs (Philox draws the same numbers on each, and the
// non-contiguous layouts are rebuilt on the device): forward outputs and input gradients must agree
// in f32, f16 and bf16 within tolerances set by dtype, and gradcheck must pass in f64 on the GPU.
// Plus the ops that have no gradient, transfers, and errors. Every test skips, saying why, where no
// GPU is visible.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/cases/op_cases.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

namespace {

const Device kGpu = Device::cuda(0);

// ||a - b|| / ||b|| (NaN anywhere fails).
double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (std::isnan(a[i])) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Relative-L2 tolerance by dtype: f32 differs from the CPU only by summation order; 16-bit types
// round every intermediate they store.
double tolerance(DType dt) {
  switch (dt) {
    case DType::f32: return 2e-5;
    case DType::f16: return 5e-3;
    case DType::bf16: return 3e-2;
    default: return 1e-12;
  }
}

std::string param_name(const testing::TestParamInfo<OpCase>& info) {
  std::string s = std::to_string(info.index) + "_";
  for (char ch : info.param.name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

class CudaParity : public testing::TestWithParam<OpCase> {};

void check_parity(const OpCase& c, DType dt) {
  SCOPED_TRACE(std::string(c.name) + " in " + dtype_name(dt));
  // The same cases built on each device give the same layouts; the CPU's values are then copied in,
  // so both backends start from bit-identical inputs.
  std::vector<Tensor> xc = c.make_inputs(Device::cpu(), dt), xg = c.make_inputs(kGpu, dt);
  ASSERT_EQ(xc.size(), xg.size());
  for (size_t i = 0; i < xc.size(); ++i)
    if (xc[i].defined()) {
      ASSERT_EQ(xc[i].strides(), xg[i].strides()) << "input " << i << " layout differs";
      NoGradGuard no_grad;
      copy_(xg[i], xc[i]);
      ASSERT_EQ(xc[i].to_vector<double>(), xg[i].to_vector<double>()) << "input " << i << " values differ";
    }
  Tensor yc = c.fn(xc), yg = c.fn(xg);
  ASSERT_EQ(yc.shape(), yg.shape());
  ASSERT_EQ(yc.dtype(), yg.dtype());
  EXPECT_TRUE(yg.device().is_cuda());
  double tol = tolerance(dt);
  EXPECT_LE(rel_l2(yg.to_vector<double>(), yc.to_vector<double>()), tol) << "forward";
  if (!yc.requires_grad()) return;
  Generator gen(99);
  Tensor gc = randn(yc.shape(), {yc.dtype()}, &gen);
  Tensor gg = gc.to(kGpu);
  yc.backward(gc);
  yg.backward(gg);
  for (size_t i = 0; i < xc.size(); ++i) {
    if (!xc[i].defined() || !xc[i].requires_grad()) continue;
    ASSERT_EQ(xc[i].grad().defined(), xg[i].grad().defined()) << "input " << i;
    if (!xc[i].grad().defined()) continue;
    EXPECT_TRUE(xg[i].grad().device().is_cuda());
    EXPECT_LE(rel_l2(xg[i].grad().to_vector<double>(), xc[i].grad().to_vector<double>()), tol)
        << "gradient of input " << i;
  }
}

}  // namespace

TEST_P(CudaParity, F32) {
  REEL_REQUIRE_GPU();
  check_parity(GetParam(), DType::f32);
}

TEST_P(CudaParity, F16) {
  REEL_REQUIRE_GPU();
  check_parity(GetParam(), DType::f16);
}

TEST_P(CudaParity, BF16) {
  REEL_REQUIRE_GPU();
  check_parity(GetParam(), DType::bf16);
}

TEST_P(CudaParity, GradcheckF64OnGpu) {
  REEL_REQUIRE_GPU();
  const OpCase& c = GetParam();
  std::vector<Tensor> x = c.make_inputs(kGpu, DType::f64);
  GradcheckResult r = gradcheck(c.fn, x, c.opts);
  EXPECT_TRUE(r.ok) << c.name << "\n" << r.str();
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaParity, testing::ValuesIn(all_op_cases()), param_name);

TEST(Cuda, NonDifferentiableOpsMatchCpu) {
  REEL_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g1(5), g2(5);
    Tensor a = randn({33, 17}, {dt}, &g1), ag = randn({33, 17}, {dt, kGpu}, &g2);
    EXPECT_EQ(a.to_vector<double>(), ag.to_vector<double>());  // Philox: bit-identical draws
    Tensor b = uniform({17}, -1, 1, {dt}, &g1), bg = uniform({17}, -1, 1, {dt, kGpu}, &g2);
    EXPECT_EQ(b.to_vector<double>(), bg.to_vector<double>());
    for (auto cmp : {eq, ne, lt, le, gt, ge})
      EXPECT_EQ(cmp(a, b).to_vector<double>(), cmp(ag, bg).to_vector<double>());
    EXPECT_LE(rel_l2({global_norm({ag, bg}).item()}, {global_norm({a, b}).item()}), tolerance(dt));
    EXPECT_EQ(arange(10, {dt}).to_vector<double>(), arange(10, {dt, kGpu}).to_vector<double>());
    EXPECT_EQ(full({3}, 2.5, {dt}).to_vector<double>(), full({3}, 2.5, {dt, kGpu}).to_vector<double>());
  }
  Tensor i = tensor_i64({1, -2, 3}, {3}, kGpu);
  EXPECT_EQ((i + i).to_vector<int64_t>(), (std::vector<int64_t>{2, -4, 6}));
  EXPECT_EQ(sum(i).item(), 2.0);
}

// The elementwise launcher's paths: packed (16-byte vectors), scalar tail, periodic broadcasts over
// leading dims (a bias, a mask), periods that are not whole packs, misaligned views, strided inputs.
// Add and mul are exact in every dtype (computed in the accumulation type, rounded once), so they must
// agree with the CPU to the bit.
TEST(Cuda, ElementwisePathsMatchCpu) {
  REEL_REQUIRE_GPU();
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{4, 6, 8}, {4, 6, 8}},  // same shape, whole packs for every dtype
      {{3, 5, 7}, {3, 5, 7}},  // odd count: packs and a scalar tail
      {{4, 6, 8}, {8}},        // bias over the last dim, period a whole number of packs
      {{2, 3, 6, 6}, {6, 6}},  // (T, T) mask over (B, H, T, T)
      {{3, 5, 7}, {1, 5, 7}},  // leading size-1 dim, period 35 (not a whole pack)
      {{3, 5, 7}, {}},         // a scalar tensor
      {{3, 5, 7}, {5, 1}},     // not periodic: the strided path
  };
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.a) + " + " + shape_str(c.b));
      Generator g(7);
      Tensor a = randn(c.a, {dt}, &g), b = randn(c.b, {dt}, &g);
      Tensor ag = a.to(kGpu), bg = b.to(kGpu);
      EXPECT_EQ((ag + bg).to_vector<double>(), (a + b).to_vector<double>());
      EXPECT_EQ((bg * ag).to_vector<double>(), (b * a).to_vector<double>());
      // Transcendental formulas may round differently on the device: compare within tolerance.
      EXPECT_LE(rel_l2(gelu(ag).to_vector<double>(), gelu(a).to_vector<double>()), tolerance(dt));
    }
    // A view one element in (not 16-byte aligned) and a transposed one.
    Generator g(8);
    Tensor x = randn({9, 8}, {dt}, &g);
    Tensor xg = x.to(kGpu);
    Tensor off = x.reshape({72}).slice(0, 1, 72), offg = xg.reshape({72}).slice(0, 1, 72);
    EXPECT_EQ((offg * 2.0).to_vector<double>(), (off * 2.0).to_vector<double>());
    EXPECT_EQ((xg.t() - xg.t()).to_vector<double>(), (x.t() - x.t()).to_vector<double>());
  }
}

TEST(Cuda, TransfersAndCastsKeepValuesAndLayouts) {
  REEL_REQUIRE_GPU();
  Tensor x = arange(24, {DType::f64}).reshape({2, 3, 4});
  Tensor xt = x.permute({2, 0, 1});  // non-contiguous source
  Tensor g = xt.to(kGpu);
  EXPECT_EQ(g.to_vector<double>(), xt.to_vector<double>());
  EXPECT_EQ(g.to(DType::bf16).cpu().to_vector<double>(), xt.to(DType::bf16).to_vector<double>());
  EXPECT_EQ(g.to(DType::i64).to_vector<int64_t>(), xt.to(DType::i64).to_vector<int64_t>());
  // Copy into a strided device view, and from a strided device view to the host.
  Tensor dst = zeros({4, 6}, {DType::f32, kGpu});
  copy_(dst.slice(1, 0, 6, 2), ones({4, 3}, {DType::f32, kGpu}));
  std::vector<float> d = dst.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int col = 0; col < 6; ++col) EXPECT_EQ(d[r * 6 + col], col % 2 == 0 ? 1.0f : 0.0f);
  Tensor host = zeros({3, 4});
  copy_(host.t(), dst.slice(1, 0, 3).to(DType::f32));
  EXPECT_EQ(host.to_vector<float>()[0], 1.0f);
  // Pinned host memory round trip.
  Tensor p = cuda::pinned_empty({1000});
  EXPECT_TRUE(cuda::is_pinned(p));
  copy_(p, arange(1000));
  EXPECT_EQ(p.to(kGpu).to_vector<float>(), arange(1000).to_vector<float>());
}

// Casts of a transposed view (a Linear's W^T, a batch of them) into a contiguous tensor, and of a
// contiguous tensor into a transposed view, take the tiled transpose: every element where the CPU's
// elementwise copy puts it, to the bit, on tile-ragged shapes, with size-1 dims, for autocast's dtypes.
TEST(Cuda, TransposingCastsEqualTheCpuToTheBit) {
  REEL_REQUIRE_GPU();
  for (const Shape& shape : {Shape{33, 70}, Shape{512, 96}, Shape{1, 40}, Shape{3, 17, 65}, Shape{2, 1, 5, 40}}) {
    for (auto [from, to] : {std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f32},
                            std::pair{DType::f32, DType::f16}, std::pair{DType::f64, DType::f32}}) {
      SCOPED_TRACE(shape_str(shape) + " " + dtype_name(from) + " -> " + dtype_name(to));
      Shape swapped = shape;
      std::swap(swapped[swapped.size() - 2], swapped[swapped.size() - 1]);
      const int64_t d = int64_t(shape.size());
      Tensor x = (arange(numel_of(swapped), {DType::f64}) * 0.37 - 5.0).to(from).reshape(swapped);
      Tensor xt = x.transpose(d - 2, d - 1);  // shape, strides (..., 1, R)
      Tensor xtg = x.to(kGpu).transpose(d - 2, d - 1);
      // Transposed view -> contiguous.
      Tensor got = zeros(shape, {to, kGpu});
      copy_(got, xtg);
      EXPECT_EQ(got.to_vector<double>(), xt.to(to).contiguous().to_vector<double>());
      // Contiguous -> transposed view of a fresh buffer.
      Tensor dst = zeros(swapped, {to, kGpu});
      copy_(dst.transpose(d - 2, d - 1), got);
      EXPECT_EQ(dst.to_vector<double>(), x.to(to).to_vector<double>());
    }
  }
}

TEST(Cuda, MixingDevicesIsAClearError) {
  REEL_REQUIRE_GPU();
  Tensor a = ones({2, 3}), b = ones({2, 3}, {DType::f32, kGpu});
  expect_error([&] { a + b; }, {"add", "different devices", "cpu", "cuda:0"});
  expect_error([&] { matmul(a, ones({3, 2}, {DType::f32, kGpu})); }, {"matmul", "cpu", "cuda:0"});
  expect_error([&] { zeros({2}, {DType::f32, Device::cuda(7)}); }, {"cuda:7"});
}

TEST(Cuda, BackwardMovesGradientsAcrossDevices) {
  REEL_REQUIRE_GPU();
  Tensor w = tensor({1, 2, 3}, {3}, {DType::f32}).set_requires_grad();
  Tensor loss = (w.to(kGpu) * w.to(kGpu)).sum();
  loss.backward();
  EXPECT_TRUE(w.grad().device().is_cpu());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
}
