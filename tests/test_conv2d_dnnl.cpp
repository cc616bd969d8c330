// oneDNN's CPU convolutions (kernels/cpu/conv2d_dnnl.cpp) against the im2col reference
// (kernels/cpu/conv2d.cpp), both run in this process through the path switch (conv2d_dnnl.h):
// forward and both backward ops on many geometries (groups 1, 2, 4, depthwise and depthwise x2;
// strides 1 and 2, also unequal; padding 0 to 3; kernels 1, 2, 3, 5, 7 and non-square; odd and
// non-square images; batch 1 and several; with and without bias), in f32 and bf16, on the blocked
// (dnnl) and the plain (dnnl-plain) path. Then: channels-last and strided operands give the bits of
// contiguous ones; a grouped convolution equals its groups run one by one; the primitive cache
// makes one entry per geometry and reuses it; several host threads convolve at once; f64 and calls
// inside an OpenMP region stay on im2col; REEL_CPU_CONV's values; and cnn-small's eager CPU training
// (one micro-batch's loss and gradients, then three AdamW steps' losses) under oneDNN against im2col.
//
// Tolerance. Both paths compute in f32 from the same widened operands and differ only in the order
// of their sums, so an element's difference is bounded through the sum of the magnitudes of its
// terms, mag: the same convolution of |x|, |w| (or |g|), |b|, computed by the reference in f64. For K
// terms the rounding error of a sum is at most about K eps mag and typically sqrt(K) eps mag (eps =
// 2^-24 = 6e-8); K here is at most 2048 (weight-gradient sums over 8*16*16 and 2*32*32 positions), so
// the typical error is under 3e-6 mag. Hence
//   f32   |dnnl - im2col| <= 1e-5 mag                       (measured: at most 3.4e-7 mag)
//   bf16  |dnnl - im2col| <= 2^-7 |im2col| + 1e-5 mag       the two f32 sums, a few eps apart, may
//                                                           round to neighbouring bf16 values, and
//                                                           one bf16 step (8 significant bits) is at
//                                                           most 2^-7 of the value (measured: up to
//                                                           0.82 of this bound: such a step)
//   f16   as bf16 with 2^-10 (11 significant bits).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/conv2d_dnnl.h"
#include "nn/nn.h"
#include "nn/workloads.h"
#include "optim/optim.h"
#include "reel.h"
#include "tests/test_util.h"

using namespace reel;
using cpu::CpuConvPath;
using testing_util::expect_error;

namespace {

// Sets the CPU convolution path for a scope, then puts back the one before.
class PathScope {
 public:
  explicit PathScope(CpuConvPath path) : saved_(cpu::cpu_conv_path()) { cpu::set_cpu_conv_path(path); }
  ~PathScope() { cpu::set_cpu_conv_path(saved_); }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  CpuConvPath saved_;
};

// Stride and padding as [h, w] pairs, as the ops take them.
struct Geo {
  int64_t N, C, H, W, O, kH, kW, sh, sw, ph, pw, G;
  bool bias;
  const char* what;
  Shape x() const { return {N, C, H, W}; }
  Shape w() const { return {O, C / G, kH, kW}; }
  Shape y() const { return {N, O, (H + 2 * ph - kH) / sh + 1, (W + 2 * pw - kW) / sw + 1}; }
  Attrs attrs() const {
    return Attrs()
        .set("stride", std::vector<int64_t>{sh, sw})
        .set("padding", std::vector<int64_t>{ph, pw})
        .set("groups", G);
  }
};

void PrintTo(const Geo& g, std::ostream* os) {
  *os << g.what << ": x " << shape_str(g.x()) << ", w " << shape_str(g.w()) << ", stride [" << g.sh << ", " << g.sw
      << "], padding [" << g.ph << ", " << g.pw << "], groups " << g.G << (g.bias ? ", bias" : "");
}

const std::vector<Geo>& geometries() {
  static const std::vector<Geo> all{
      {1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, true, "plain 3x3"},
      {2, 5, 7, 9, 6, 3, 3, 2, 2, 1, 1, 1, false, "odd sizes, stride 2"},
      {3, 4, 11, 6, 8, 5, 5, 1, 1, 2, 2, 1, true, "5x5, padding 2"},
      {2, 3, 15, 13, 16, 7, 7, 2, 2, 3, 3, 1, true, "7x7 stem, stride 2"},
      {2, 8, 9, 11, 8, 7, 7, 1, 1, 0, 0, 1, false, "7x7 without padding"},
      {4, 16, 9, 9, 32, 1, 1, 1, 1, 0, 0, 1, false, "1x1"},
      {2, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0, 1, true, "1x1 stride 2 (a downsample)"},
      {2, 8, 10, 7, 12, 3, 1, 1, 1, 1, 0, 1, true, "3x1 kernel, padding [1, 0]"},
      {1, 6, 9, 12, 6, 1, 3, 2, 1, 0, 1, 1, false, "1x3 kernel, stride [2, 1]"},
      {2, 4, 6, 6, 4, 2, 2, 2, 2, 0, 0, 1, true, "2x2 stride 2"},
      {3, 10, 5, 5, 7, 3, 3, 1, 1, 2, 2, 1, true, "padding 2, odd channels"},
      {1, 2, 3, 3, 2, 3, 3, 1, 1, 0, 0, 1, true, "1x1 output"},
      {2, 3, 32, 32, 32, 3, 3, 1, 1, 1, 1, 1, false, "3-channel input (cnn-small's first layer)"},
      {1, 1, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1, true, "1-channel input (the Fashion-MNIST CNN's first)"},
      {8, 32, 16, 16, 64, 3, 3, 1, 1, 1, 1, 1, true, "large enough to run on every thread"},
      {2, 6, 8, 8, 4, 3, 3, 1, 1, 1, 1, 2, true, "2 groups"},
      {3, 8, 9, 7, 8, 3, 3, 2, 2, 0, 0, 2, false, "2 groups, stride 2, no padding"},
      {2, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 4, false, "4 groups of 4"},
      {2, 12, 8, 8, 12, 3, 3, 1, 1, 1, 1, 12, true, "depthwise"},
      {2, 8, 10, 10, 16, 3, 3, 2, 2, 1, 1, 8, false, "depthwise x2, stride 2"},
      {1, 4, 7, 7, 4, 5, 5, 1, 1, 2, 2, 4, true, "depthwise 5x5"},
  };
  return all;
}

// y, dx and dw of geometry g on the current path, from the same operands.
struct Results {
  Tensor y, dx, dw;
};

Results run_all(const Geo& g, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy) {
  return {dispatch1(OpKind::Conv2d, {x, w, b}, g.attrs()),
          dispatch1(OpKind::Conv2dBackwardInput, {gy, w}, g.attrs().set("input_shape", g.x())),
          dispatch1(OpKind::Conv2dBackwardWeight, {gy, x}, g.attrs().set("weight_shape", g.w()))};
}

// The sums of |terms| of every element of the three results (f64, on the reference).
Results magnitudes(const Geo& g, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy) {
  auto abs64 = [](const Tensor& t) { return t.defined() ? abs(t.to(DType::f64)) : Tensor(); };
  return run_all(g, abs64(x), abs64(w), abs64(b), abs64(gy));
}

// Largest |got - want| / (rel |want| + 1e-5 mag), over the elements: <= 1 passes.
double worst_ratio(const Tensor& got, const Tensor& want, const Tensor& mag, double rel) {
  const std::vector<double> a = got.to_vector<double>(), r = want.to_vector<double>(), m = mag.to_vector<double>();
  EXPECT_EQ(a.size(), r.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < r.size(); ++i) {
    const double diff = std::fabs(a[i] - r[i]);
    if (diff == 0) continue;
    worst = std::max(worst, diff / (rel * std::fabs(r[i]) + 1e-5 * m[i] + 1e-30));
  }
  return worst;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << what;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// every geometry, both dtypes, both oneDNN paths, against im2col

class Conv2dDnnl : public testing::TestWithParam<std::tuple<DType, CpuConvPath, Geo>> {};

TEST_P(Conv2dDnnl, MatchesIm2colWithinTheSumsRoundOff) {
  const auto [dt, path, g] = GetParam();
  Tensor x = testing_util::random(g.x(), 1, DType::f32).to(dt), w = testing_util::random(g.w(), 2, DType::f32).to(dt);
  Tensor b = g.bias ? testing_util::random({g.O}, 3, DType::f32).to(dt) : Tensor();
  Tensor gy = testing_util::random(g.y(), 4, DType::f32).to(dt);
  Results ref, got;
  {
    PathScope scope(CpuConvPath::Im2col);
    ref = run_all(g, x, w, b, gy);
  }
  const Results mag = magnitudes(g, x, w, b, gy);
  {
    PathScope scope(path);
    ASSERT_TRUE(cpu::conv2d_uses_dnnl(dt));
    got = run_all(g, x, w, b, gy);
  }
  EXPECT_EQ(got.y.dtype(), dt);
  EXPECT_EQ(got.dx.dtype(), dt);
  EXPECT_EQ(got.dw.dtype(), dt);
  const double rel = dt == DType::f32 ? 0.0 : 1.0 / 128;
  EXPECT_LE(worst_ratio(got.y, ref.y, mag.y, rel), 1.0) << "forward";
  EXPECT_LE(worst_ratio(got.dx, ref.dx, mag.dx, rel), 1.0) << "backward input";
  EXPECT_LE(worst_ratio(got.dw, ref.dw, mag.dw, rel), 1.0) << "backward weight";
}

INSTANTIATE_TEST_SUITE_P(Linalg, Conv2dDnnl,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(CpuConvPath::Dnnl, CpuConvPath::DnnlPlain),
                                          testing::ValuesIn(geometries())));

// f16 is widened the same way; one geometry with groups and bias is enough to see the rounding back.
TEST(Conv2dDnnlHalf, MatchesIm2colWithinOneRounding) {
  const Geo g{2, 6, 9, 8, 6, 3, 3, 1, 2, 1, 0, 3, true, "f16"};
  Tensor x = testing_util::random(g.x(), 5, DType::f32).to(DType::f16);
  Tensor w = testing_util::random(g.w(), 6, DType::f32).to(DType::f16);
  Tensor b = testing_util::random({g.O}, 7, DType::f32).to(DType::f16);
  Tensor gy = testing_util::random(g.y(), 8, DType::f32).to(DType::f16);
  Results ref, got;
  {
    PathScope scope(CpuConvPath::Im2col);
    ref = run_all(g, x, w, b, gy);
  }
  {
    PathScope scope(CpuConvPath::Dnnl);
    got = run_all(g, x, w, b, gy);
  }
  const Results mag = magnitudes(g, x, w, b, gy);
  const double rel = 1.0 / 1024;  // f16 keeps 11 significant bits
  EXPECT_LE(worst_ratio(got.y, ref.y, mag.y, rel), 1.0);
  EXPECT_LE(worst_ratio(got.dx, ref.dx, mag.dx, rel), 1.0);
  EXPECT_LE(worst_ratio(got.dw, ref.dw, mag.dw, rel), 1.0);
}

// ---------------------------------------------------------------------------------------------
// layouts, groups, cache, threads

// NHWC operands are handed to oneDNN as NHWC and reordered; strided ones are copied contiguous first.
// Either way the primitive reads the values a contiguous call gives it: the same bits.
TEST(Conv2dDnnlLayouts, ChannelsLastAndStridedOperandsGiveTheContiguousBits) {
  const Geo g{2, 16, 7, 6, 24, 3, 3, 2, 1, 1, 1, 1, true, "layouts"};
  Tensor x = testing_util::random(g.x(), 10, DType::f32), w = testing_util::random(g.w(), 11, DType::f32);
  Tensor b = testing_util::random({g.O}, 12, DType::f32), gy = testing_util::random(g.y(), 13, DType::f32);
  auto channels_last = [](const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), MemoryFormat::ChannelsLast);
    dispatch_out(OpKind::Copy, {t}, {c});
    return c;
  };
  // Strided: every other column of a twice-as-wide tensor.
  auto strided = [](const Tensor& t) {
    Shape wide = t.shape();
    wide[3] *= 2;
    Tensor s = zeros(wide, {t.dtype()}).slice(3, 0, wide[3], 2);
    dispatch_out(OpKind::Copy, {t}, {s});
    return s;
  };
  for (CpuConvPath path : {CpuConvPath::Dnnl, CpuConvPath::DnnlPlain}) {
    SCOPED_TRACE(cpu::cpu_conv_path_name(path));
    PathScope scope(path);
    const Results want = run_all(g, x, w, b, gy);
    const Tensor xl = channels_last(x), wl = channels_last(w), gl = channels_last(gy);
    ASSERT_TRUE(xl.is_contiguous(MemoryFormat::ChannelsLast) && !xl.is_contiguous());
    const Results nhwc = run_all(g, xl, wl, b, gl);
    expect_same_bits(nhwc.y, want.y, "y, NHWC");
    expect_same_bits(nhwc.dx, want.dx, "dx, NHWC");
    expect_same_bits(nhwc.dw, want.dw, "dw, NHWC");
    const Tensor xs = strided(x), gs = strided(gy);
    ASSERT_FALSE(xs.is_contiguous() || xs.is_contiguous(MemoryFormat::ChannelsLast));
    const Results str = run_all(g, xs, w, b, gs);
    expect_same_bits(str.y, want.y, "y, strided");
    expect_same_bits(str.dx, want.dx, "dx, strided");
    expect_same_bits(str.dw, want.dw, "dw, strided");
  }
}

// A grouped convolution runs its groups one by one as plain convolutions of their channels, so it
// equals, to the bit, those plain convolutions called on each group's slice (as the reference does).
TEST(Conv2dDnnlGroups, EachGroupIsAPlainConvolution) {
  for (const Geo& g : {Geo{2, 6, 6, 5, 4, 3, 3, 1, 1, 1, 1, 2, true, "2 groups"},
                       Geo{3, 4, 5, 5, 8, 3, 3, 2, 2, 1, 1, 4, true, "depthwise x2"},
                       Geo{2, 64, 12, 12, 64, 3, 3, 1, 1, 1, 1, 2, false, "2 groups of 32, threaded"}}) {
    SCOPED_TRACE(g.what);
    PathScope scope(CpuConvPath::Dnnl);
    Tensor x = testing_util::random(g.x(), 14, DType::f32), w = testing_util::random(g.w(), 15, DType::f32);
    Tensor b = g.bias ? testing_util::random({g.O}, 16, DType::f32) : Tensor();
    Tensor gy = testing_util::random(g.y(), 17, DType::f32);
    const Results all = run_all(g, x, w, b, gy);
    const int64_t Cg = g.C / g.G, Og = g.O / g.G;
    for (int64_t q = 0; q < g.G; ++q) {
      Geo one = g;
      one.C = Cg, one.O = Og, one.G = 1;
      const Results part = run_all(one, x.slice(1, q * Cg, (q + 1) * Cg).contiguous(),
                                   w.slice(0, q * Og, (q + 1) * Og).contiguous(),
                                   g.bias ? b.slice(0, q * Og, (q + 1) * Og).contiguous() : Tensor(),
                                   gy.slice(1, q * Og, (q + 1) * Og).contiguous());
      expect_same_bits(all.y.slice(1, q * Og, (q + 1) * Og), part.y, "y");
      expect_same_bits(all.dx.slice(1, q * Cg, (q + 1) * Cg), part.dx, "dx");
      expect_same_bits(all.dw.slice(0, q * Og, (q + 1) * Og), part.dw, "dw");
    }
  }
}

// One primitive per (direction, geometry, layout, path, threads), made on the first call and reused.
TEST(Conv2dDnnlCache, OneEntryPerGeometryReused) {
  PathScope scope(CpuConvPath::Dnnl);
  const Geo g{1, 5, 13, 11, 7, 3, 3, 1, 1, 1, 1, 1, false, "a geometry no other test uses"};
  Tensor x = testing_util::random(g.x(), 18, DType::f32), w = testing_util::random(g.w(), 19, DType::f32);
  const size_t before = cpu::conv2d_dnnl_cached_primitives();
  const Tensor y0 = dispatch1(OpKind::Conv2d, {x, w, Tensor()}, g.attrs());
  EXPECT_EQ(cpu::conv2d_dnnl_cached_primitives(), before + 1);
  const Tensor y1 = dispatch1(OpKind::Conv2d, {x, w, Tensor()}, g.attrs());
  EXPECT_EQ(cpu::conv2d_dnnl_cached_primitives(), before + 1);
  expect_same_bits(y0, y1, "the cached primitive again");
  // Another geometry (one more output channel) is another entry; so is the other path.
  dispatch1(OpKind::Conv2d, {x, testing_util::random({8, 5, 3, 3}, 20, DType::f32), Tensor()}, g.attrs());
  EXPECT_EQ(cpu::conv2d_dnnl_cached_primitives(), before + 2);
  PathScope plain(CpuConvPath::DnnlPlain);
  dispatch1(OpKind::Conv2d, {x, w, Tensor()}, g.attrs());
  EXPECT_EQ(cpu::conv2d_dnnl_cached_primitives(), before + 3);
}

// Host threads share the cached primitives, each with its own scratchpad, buffers and stream.
TEST(Conv2dDnnlThreads, ConcurrentCallsGiveTheSerialBits) {
  PathScope scope(CpuConvPath::Dnnl);
  const std::vector<Geo> geos{{4, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, true, "a"},
                              {2, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1, 8, false, "b"}};
  std::vector<Tensor> xs, ws, bs, gs;
  std::vector<Results> serial;
  for (size_t i = 0; i < geos.size(); ++i) {
    const Geo& g = geos[i];
    xs.push_back(testing_util::random(g.x(), 30 + i, DType::f32));
    ws.push_back(testing_util::random(g.w(), 40 + i, DType::f32));
    bs.push_back(g.bias ? testing_util::random({g.O}, 50 + i, DType::f32) : Tensor());
    gs.push_back(testing_util::random(g.y(), 60 + i, DType::f32));
    serial.push_back(run_all(g, xs[i], ws[i], bs[i], gs[i]));
  }
  std::vector<std::vector<Results>> seen(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 6; ++rep) {
        const size_t i = (t + size_t(rep)) % geos.size();
        seen[t].push_back(run_all(geos[i], xs[i], ws[i], bs[i], gs[i]));
      }
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < seen.size(); ++t)
    for (size_t rep = 0; rep < seen[t].size(); ++rep) {
      const size_t i = (t + rep) % geos.size();
      SCOPED_TRACE("thread " + std::to_string(t) + ", call " + std::to_string(rep));
      expect_same_bits(seen[t][rep].y, serial[i].y, "y");
      expect_same_bits(seen[t][rep].dx, serial[i].dx, "dx");
      expect_same_bits(seen[t][rep].dw, serial[i].dw, "dw");
    }
}

// ---------------------------------------------------------------------------------------------
// what stays on im2col, and the switch

TEST(Conv2dDnnlSwitch, F64AndCallsInsideAParallelRegionStayOnIm2col) {
  const Geo g{2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 2, true, "f64"};
  Tensor x = testing_util::random(g.x(), 21), w = testing_util::random(g.w(), 22);
  Tensor b = testing_util::random({g.O}, 23), gy = testing_util::random(g.y(), 24);
  Results ref, got;
  {
    PathScope scope(CpuConvPath::Im2col);
    EXPECT_FALSE(cpu::conv2d_uses_dnnl(DType::f32));
    ref = run_all(g, x, w, b, gy);
  }
  PathScope scope(CpuConvPath::Dnnl);
  EXPECT_FALSE(cpu::conv2d_uses_dnnl(DType::f64));
  EXPECT_TRUE(cpu::conv2d_uses_dnnl(DType::f32));
  EXPECT_TRUE(cpu::conv2d_uses_dnnl(DType::bf16));
  got = run_all(g, x, w, b, gy);
  expect_same_bits(got.y, ref.y, "y");
  expect_same_bits(got.dx, ref.dx, "dx");
  expect_same_bits(got.dw, ref.dw, "dw");
#ifdef _OPENMP
  int inside = -1;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    inside = cpu::conv2d_uses_dnnl(DType::f32) ? 1 : 0;
  }
  EXPECT_EQ(inside, 0);
#endif
}

TEST(Conv2dDnnlSwitch, PathNames) {
  for (CpuConvPath p : {CpuConvPath::Dnnl, CpuConvPath::DnnlPlain, CpuConvPath::Im2col})
    EXPECT_EQ(cpu::parse_cpu_conv_path(cpu::cpu_conv_path_name(p)), p);
  EXPECT_STREQ(cpu::cpu_conv_path_name(CpuConvPath::DnnlPlain), "dnnl-plain");
  expect_error([] { cpu::parse_cpu_conv_path("mkl"); },
               {"REEL_CPU_CONV", "\"mkl\"", "dnnl", "dnnl-plain", "im2col"});
}

// An empty batch: the reference writes the (empty or zero) results, as before.
TEST(Conv2dDnnlSwitch, EmptyBatch) {
  PathScope scope(CpuConvPath::Dnnl);
  const Geo g{0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, true, "empty"};
  Tensor x = zeros(g.x(), {DType::f32}), w = testing_util::random(g.w(), 25, DType::f32);
  Tensor gy = zeros(g.y(), {DType::f32});
  const Results r = run_all(g, x, w, testing_util::random({g.O}, 26, DType::f32), gy);
  EXPECT_EQ(r.y.shape(), g.y());
  EXPECT_EQ(r.dx.shape(), g.x());
  for (double v : r.dw.to_vector<double>()) EXPECT_EQ(v, 0.0);
}

// ---------------------------------------------------------------------------------------------
// cnn-small's eager training step on the CPU

// One forward and backward of a micro-batch of 8 images: the loss and every parameter's gradient;
// then three AdamW steps of two such micro-batches: the losses. BatchNorm and GroupNorm divide by
// batch statistics, which carries the convolutions' differences (about 1e-7 relative) on with some
// gain, so the model is compared looser than one convolution: the loss to 1e-5 relative, gradients
// to 1e-4 of each one's largest magnitude (measured: at most 3e-6; the losses agree to 1e-8). Parameters after AdamW steps
// are not compared: AdamW's first steps move every weight by about lr whatever its gradient's size,
// so a gradient that is round-off in both runs moves its weight by +-lr either way.
TEST(Conv2dDnnlModels, CnnSmallStepMatchesIm2col) {
  struct Run {
    double loss = 0;
    std::vector<Tensor> grads;
    std::vector<double> step_losses;
  };
  auto run = [](CpuConvPath path) {
    PathScope scope(path);
    Run r;
    nn::Workload wl = nn::make_workload("cnn-small", Device::cpu(), 2, 8, 7);
    nn::Module* m = wl.model.get();
    Tensor loss = nn::model_loss(*m, wl.micro[0].first, wl.micro[0].second);
    loss.backward();
    r.loss = loss.item();
    for (const Tensor& p : m->parameters()) r.grads.push_back(p.grad().clone());
    for (const Tensor& p : m->parameters()) p.set_grad(Tensor());
    optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-3));
    opt.set_accum_steps(int64_t(wl.micro.size()));
    std::vector<optim::MicroBatch> micro;
    for (const auto& [inputs, targets] : wl.micro) micro.push_back({inputs, targets});
    auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
    for (int s = 0; s < 3; ++s) {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      r.step_losses.push_back(mean_loss.item());
    }
    return r;
  };
  const Run ref = run(CpuConvPath::Im2col), got = run(CpuConvPath::Dnnl);
  EXPECT_NEAR(got.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    EXPECT_LE(testing_util::max_rel_diff(got.grads[i], ref.grads[i]), 1e-4) << "parameter " << i;
  }
  ASSERT_EQ(got.step_losses.size(), ref.step_losses.size());
  for (size_t s = 0; s < ref.step_losses.size(); ++s) {
    EXPECT_NEAR(got.step_losses[s], ref.step_losses[s], 1e-5 * std::fabs(ref.step_losses[s])) << "step " << s;
  }
  EXPECT_NE(ref.step_losses.front(), ref.step_losses.back());  // the steps did train
}
