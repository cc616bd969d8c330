// Op-harness cases of matmul and conv2d with its two backward ops (schemas: kernels/schema/linalg.cpp).
// matmul: plain, transposed operands, broadcast batch dims, a strided batch, a 1x1 result, a long
// inner dim. conv2d: padding with a bias, stride 2 without one, separate [h, w] strides and padding,
// channels-last operands, groups (2 groups, depthwise with channel multiplier 1 and 2, channels-last
// grouped); each geometry also runs both backward ops. The plain-loop references walk every (output,
// kernel tap) pair of a convolution once: y gathers from it, dx and dw scatter into it.
#include "tests/op_harness/inputs.h"
#include "tests/test_util.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;

// ---- matmul ----

// a (..., M, K) @ b (..., K, N) with the batch dims broadcast, row-major over the result.
std::vector<double> matmul_reference(const OpCall& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1], N = b.shape()[b.dim() - 1];
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(batch_a, batch_b, "reference");
  std::vector<double> av = host_values(a), bv = host_values(b), out;
  for (int64_t j = 0; j < numel_of(batch); ++j) {
    std::vector<int64_t> idx = testing_util::unravel(j, batch);
    const int64_t ia = testing_util::broadcast_flat(idx, batch_a), ib = testing_util::broadcast_flat(idx, batch_b);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[(ia * M + m) * K + k] * bv[(ib * K + k) * N + n];
        out.push_back(s);
      }
  }
  return out;
}

void add_matmul_cases(std::vector<OpTestCase>& cases) {
  struct Product {
    const char* name;
    Shape a, b;
    Layout a_layout, b_layout;
    bool gradcheck;
  };
  using L = Layout;
  for (const Product& p : {Product{"matmul_5x7_by_7x3", {5, 7}, {7, 3}, L::contiguous, L::contiguous, true},
                           Product{"matmul_transposed_4x6_by_transposed_6x5", {4, 6}, {6, 5}, L::transposed, L::transposed, true},
                           Product{"matmul_batch_broadcast_2x1x4x3_by_3x3x5", {2, 1, 4, 3}, {3, 3, 5}, L::contiguous,
                                   L::transposed, true},
                           Product{"matmul_strided_batch_3x4x5_by_5x2", {3, 4, 5}, {5, 2}, L::strided, L::contiguous, false},
                           Product{"matmul_row_by_column_1x8_by_8x1", {1, 8}, {8, 1}, L::contiguous, L::contiguous, false},
                           Product{"matmul_long_inner_16x256_by_256x8", {16, 256}, {256, 8}, L::contiguous, L::transposed,
                                   false}}) {
    cases.push_back({
        .op = OpKind::Matmul,
        .name = p.name,
        .dtypes = kFloatTypes,
        .make = [p](Device, DType t) { return OpCall{{randn_input(p.a, t, 90, p.a_layout), randn_input(p.b, t, 91, p.b_layout)}}; },
        .grad = p.gradcheck ? GradcheckFn([](const Inputs& x) { return matmul(x[0], x[1]); }) : GradcheckFn(),
        .reference = [](const OpCall& c) { return Expected{matmul_reference(c)}; },
    });
  }
}

// ---- conv2d ----

struct Geometry {
  const char* name;
  Shape x, w;       // w (O, C/groups, kH, kW)
  int64_t sh, sw, ph, pw;
  bool bias;
  Layout layout;    // of x and w
  bool gradcheck;   // through the public conv2d (square stride and padding)
  int64_t groups = 1;
  Shape y() const { return {x[0], w[0], (x[2] + 2 * ph - w[2]) / sh + 1, (x[3] + 2 * pw - w[3]) / sw + 1}; }
  Attrs attrs() const {
    Attrs a = Attrs().set("stride", std::vector<int64_t>{sh, sw}).set("padding", std::vector<int64_t>{ph, pw});
    return groups == 1 ? a : a.set("groups", groups);
  }
};

const Geometry kGeometries[] = {
    {"3x3_pad1_bias_1x2x5x4", {1, 2, 5, 4}, {3, 2, 3, 3}, 1, 1, 1, 1, true, Layout::contiguous, true},
    {"stride2_no_bias_1x2x7x7", {1, 2, 7, 7}, {3, 2, 3, 3}, 2, 2, 0, 0, false, Layout::contiguous, true},
    {"stride_2_1_pad_1_0_2x2x5x4", {2, 2, 5, 4}, {3, 2, 3, 2}, 2, 1, 1, 0, true, Layout::contiguous, false},
    {"channels_last_2x3x4x4", {2, 3, 4, 4}, {2, 3, 2, 2}, 1, 1, 0, 0, true, Layout::channels_last, false},
    {"groups2_3x3_pad1_bias_2x4x5x4", {2, 4, 5, 4}, {6, 2, 3, 3}, 1, 1, 1, 1, true, Layout::contiguous, true, 2},
    {"depthwise_3x3_stride2_pad1_2x3x7x6", {2, 3, 7, 6}, {3, 1, 3, 3}, 2, 2, 1, 1, false, Layout::contiguous, true, 3},
    {"depthwise_x2_stride_1_2_pad_0_1_bias_1x2x5x5", {1, 2, 5, 5}, {4, 1, 3, 2}, 1, 2, 0, 1, true, Layout::contiguous,
     false, 2},
    {"groups2_channels_last_2x4x4x4", {2, 4, 4, 4}, {4, 2, 2, 2}, 1, 1, 1, 1, true, Layout::channels_last, false, 2},
    {"depthwise_channels_last_2x8x5x5", {2, 8, 5, 5}, {8, 1, 3, 3}, 1, 1, 1, 1, false, Layout::channels_last, false, 8},
};

// Calls tap(n, o, c, oh, ow, h, w, i, j) for every output element and kernel tap inside the input;
// c is the input channel (o's group's block of x), the weight's own channel index is c % (C/groups).
template <typename Tap>
void for_each_tap(const Geometry& g, Tap tap) {
  const Shape y = g.y();
  const int64_t cg = g.x[1] / g.groups, og = g.w[0] / g.groups;
  for (int64_t n = 0; n < y[0]; ++n)
    for (int64_t o = 0; o < y[1]; ++o)
      for (int64_t oh = 0; oh < y[2]; ++oh)
        for (int64_t ow = 0; ow < y[3]; ++ow)
          for (int64_t c = o / og * cg; c < (o / og + 1) * cg; ++c)
            for (int64_t i = 0; i < g.w[2]; ++i)
              for (int64_t j = 0; j < g.w[3]; ++j) {
                const int64_t h = oh * g.sh - g.ph + i, w = ow * g.sw - g.pw + j;
                if (h >= 0 && h < g.x[2] && w >= 0 && w < g.x[3]) tap(n, o, c, oh, ow, h, w, i, j);
              }
}

int64_t at(const Shape& s, int64_t a, int64_t b, int64_t c, int64_t d) { return ((a * s[1] + b) * s[2] + c) * s[3] + d; }

Expected conv_reference(const Geometry& g, const OpCall& call) {
  std::vector<double> x = host_values(call.inputs[0]), w = host_values(call.inputs[1]), y(numel_of(g.y()), 0.0);
  std::vector<double> b = g.bias ? host_values(call.inputs[2]) : std::vector<double>(g.w[0], 0.0);
  const Shape ys = g.y();
  for (int64_t k = 0; k < numel_of(ys); ++k) y[k] = b[(k / (ys[2] * ys[3])) % ys[1]];
  for_each_tap(g, [&](int64_t n, int64_t o, int64_t c, int64_t oh, int64_t ow, int64_t h, int64_t wi, int64_t i, int64_t j) {
    y[at(ys, n, o, oh, ow)] += x[at(g.x, n, c, h, wi)] * w[at(g.w, o, c % g.w[1], i, j)];
  });
  return {y};
}

// dx (backward_input: inputs g, w) or dw (backward_weight: inputs g, x).
Expected conv_backward_reference(const Geometry& g, const OpCall& call, bool weight) {
  std::vector<double> gy = host_values(call.inputs[0]), other = host_values(call.inputs[1]);
  std::vector<double> out(numel_of(weight ? g.w : g.x), 0.0);
  const Shape ys = g.y();
  for_each_tap(g, [&](int64_t n, int64_t o, int64_t c, int64_t oh, int64_t ow, int64_t h, int64_t wi, int64_t i, int64_t j) {
    const double gv = gy[at(ys, n, o, oh, ow)];
    if (weight) out[at(g.w, o, c % g.w[1], i, j)] += gv * other[at(g.x, n, c, h, wi)];
    else out[at(g.x, n, c, h, wi)] += gv * other[at(g.w, o, c % g.w[1], i, j)];
  });
  return {out};
}

void add_conv_cases(std::vector<OpTestCase>& cases) {
  for (const Geometry& g : kGeometries) {
    GradcheckFn grad;
    if (g.gradcheck) grad = [g](const Inputs& x) { return conv2d(x[0], x[1], x[2], g.sh, g.ph, g.groups); };
    cases.push_back({
        .op = OpKind::Conv2d,
        .name = std::string("conv2d_") + g.name,
        .dtypes = kFloatTypes,
        .make =
            [g](Device, DType t) {
              Tensor bias = g.bias ? randn_input({g.w[0]}, t, 92) : Tensor();
              return OpCall{{randn_input(g.x, t, 93, g.layout), randn_input(g.w, t, 94, g.layout, 0.5), bias}, g.attrs()};
            },
        .grad = grad,
        .reference = [g](const OpCall& c) { return conv_reference(g, c); },
    });
    cases.push_back({
        .op = OpKind::Conv2dBackwardInput,
        .name = std::string("conv2d_backward_input_") + g.name,
        .dtypes = kFloatTypes,
        .make =
            [g](Device, DType t) {
              return OpCall{{randn_input(g.y(), t, 95, g.layout), randn_input(g.w, t, 94, g.layout, 0.5)},
                            g.attrs().set("input_shape", g.x)};
            },
        .reference = [g](const OpCall& c) { return conv_backward_reference(g, c, false); },
    });
    cases.push_back({
        .op = OpKind::Conv2dBackwardWeight,
        .name = std::string("conv2d_backward_weight_") + g.name,
        // cuDNN has no f64 weight-gradient algorithm for channels-last operands (the op says so with
        // a reel::Error); autocast makes channels-last tensors only in 16 bits.
        .dtypes = g.layout == Layout::channels_last ? std::vector<DType>{DType::f32, DType::f16, DType::bf16}
                                                    : std::vector<DType>(kFloatTypes),
        .make =
            [g](Device, DType t) {
              return OpCall{{randn_input(g.y(), t, 95, g.layout), randn_input(g.x, t, 93, g.layout)},
                            g.attrs().set("weight_shape", g.w)};
            },
        .reference = [g](const OpCall& c) { return conv_backward_reference(g, c, true); },
    });
  }
}

}  // namespace

std::vector<OpTestCase> linalg_cases() {
  std::vector<OpTestCase> cases;
  add_matmul_cases(cases);
  add_conv_cases(cases);
  return cases;
}

}  // namespace reel::harness
