// Op-harness cases of the reduce family's fused ops (kernels/ops.def's "fused:" lines there): a bias
// gradient's column sums, the masked softmax and its backward, cross-entropy with its gradient, and a
// small classifier head (its GEMMs with the cross-entropy).
// As in cases_fused.cpp, each reference is the unfused chain run op by op on the CPU
// (fused_references.h), and on the GPU the same cases compare the fused CUDA kernels against the CPU.
#include <cmath>
#include <string>

#include "tests/op_harness/fused_references.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

// ---- reductions: bias-gradient column sums, and the masked softmax with its backward ----

// A causal (T, T) mask: 1 above the diagonal.
Tensor causal_mask(int64_t T) {
  std::vector<double> m(size_t(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) m[size_t(i * T + j)] = j > i ? 1.0 : 0.0;
  return values_input(m, {T, T}, DType::f32);
}

void add_reduce_cases(std::vector<OpTestCase>& cases) {
  for (bool accumulate : {false, true})
    cases.push_back({.op = OpKind::ColumnSums,
                     .name = std::string("column_sums_") + (accumulate ? "accumulate_" : "") + "3x20x24",
                     .dtypes = {DType::f32, DType::bf16, DType::f16},
                     .make =
                         [accumulate](Device, DType t) {
                           Inputs in{randn_input({3, 20, 24}, t, 241)};
                           if (!accumulate) return OpCall{in, Attrs()};
                           Tensor grad = randn_input({24}, DType::f32, 242);
                           in.push_back(grad);
                           return OpCall{in, Attrs().set("accumulate", true), {grad}};
                         },
                     .reference =
                         [accumulate](const OpCall& c) {
                           Tensor s = run1(OpKind::Sum, {cast(c.inputs[0], DType::f32)}, Attrs().set("dims", std::vector<int64_t>{0, 1}));
                           if (accumulate) s = run1(OpKind::Add, {copy_of(c.inputs[1]), s});
                           return Expected{host_values(s)};
                         }});
  struct Variant {
    const char* name;
    bool keep_f32, copy;
  };
  for (Variant v : {Variant{"", true, false}, Variant{"copy_", true, true}, Variant{"copy_only_", false, true}}) {
    auto attrs = [v](DType t) {
      Attrs a = Attrs().set("keep_f32", v.keep_f32);
      if (v.copy) a.set("dtype", t);
      return a;
    };
    auto results = [v](const Tensor& y, DType t) {
      Expected e;
      if (v.keep_f32) e.push_back(host_values(y));
      if (v.copy) e.push_back(host_values(cast(y, t)));
      return e;
    };
    cases.push_back({.op = OpKind::MaskedSoftmax,
                     .name = std::string("masked_softmax_") + v.name + "2x3x9x9",
                     .dtypes = k16Bit,
                     .make =
                         [attrs](Device, DType t) {
                           return OpCall{{randn_input({2, 3, 9, 9}, DType::f32, 251), causal_mask(9)},
                                         attrs(t).set("value", -INFINITY)};
                         },
                     .reference =
                         [results](const OpCall& c) {
                           Tensor z = run1(OpKind::MaskedFill, {c.inputs[0], c.inputs[1]}, Attrs().set("value", -INFINITY));
                           return results(run1(OpKind::Softmax, {z}, Attrs().set("dim", int64_t(-1))), DType(c.attrs.i("dtype", int64_t(DType::bf16))));
                         }});
    cases.push_back({.op = OpKind::MaskedSoftmaxBackward,
                     .name = std::string("masked_softmax_backward_") + v.name + "2x3x9x9",
                     .dtypes = k16Bit,
                     .make =
                         [attrs](Device, DType t) {
                           Tensor mask = causal_mask(9);
                           Tensor z = run1(OpKind::MaskedFill, {randn_input({2, 3, 9, 9}, DType::f32, 252), mask},
                                           Attrs().set("value", -INFINITY));
                           Tensor y = run1(OpKind::Softmax, {z}, Attrs().set("dim", int64_t(-1)));
                           return OpCall{{randn_input({2, 3, 9, 9}, DType::f32, 253), y, mask}, attrs(t)};
                         },
                     .reference =
                         [results](const OpCall& c) {
                           Tensor d = run1(OpKind::SoftmaxBackward, {c.inputs[0], c.inputs[1]}, Attrs().set("dim", int64_t(-1)));
                           Tensor dx = run1(OpKind::MaskedFill, {d, c.inputs[2]}, Attrs().set("value", 0.0));
                           return results(dx, DType(c.attrs.i("dtype", int64_t(DType::bf16))));
                         }});
  }
}

// ---- cross-entropy with its gradient: the loss, the backward and (16 bits) the gradient's cast ----

// For a 16-bit case dtype the logits are f32 and the gradient comes in that dtype (autocast's
// classifier); for f32/f64 both are that dtype. Rows listed in `ignored` aim at ignore_index -100.
void add_cross_entropy_with_grad_cases(std::vector<OpTestCase>& cases) {
  struct Variant {
    const char* name;
    int64_t N, C, reduction;
    std::vector<int64_t> ignored;
    Layout layout = Layout::contiguous;
  };
  for (const Variant& v : {Variant{"mean_6x5", 6, 5, 0, {}},
                           Variant{"sum_ignoring_rows_1_4_transposed_5x7", 5, 7, 1, {1, 4}, Layout::transposed},
                           Variant{"mean_all_ignored_3x4", 3, 4, 0, {0, 1, 2}},
                           Variant{"mean_ignoring_row_0_strided_40x33", 40, 33, 0, {0}, Layout::strided},
                           Variant{"mean_wide_rows_3x1500", 3, 1500, 0, {}}}) {  // CUDA: a block per row
    cases.push_back(
        {.op = OpKind::CrossEntropyWithGrad,
         .name = std::string("cross_entropy_with_grad_") + v.name,
         .dtypes = kFloatTypes,
         .make =
             [v](Device, DType t) {
               const bool half = t == DType::bf16 || t == DType::f16;
               const DType x = half ? DType::f32 : t;
               std::vector<double> target = host_values(index_input({v.N}, v.C, 232));
               for (int64_t n : v.ignored) target[size_t(n)] = -100;
               Attrs a = Attrs().set("reduction", v.reduction);
               if (half) a.set("dtype", t);
               return OpCall{{randn_input({v.N, v.C}, x, 231, v.layout, 2.0), values_input(target, {v.N}, DType::i64),
                              scalar_input(0.75, x)},
                             a};
             },
         .reference =
             [](const OpCall& c) {
               const Attrs a = Attrs().set("reduction", c.attrs.i("reduction"));
               std::vector<Tensor> f = dispatch(OpKind::CrossEntropy, {c.inputs[0], c.inputs[1]}, a);
               Tensor d = run1(OpKind::CrossEntropyBackward, {c.inputs[2], c.inputs[0], c.inputs[1], f[1]}, a);
               return values_of({f[0], c.attrs.has("dtype") ? cast(d, c.attrs.dtype("dtype")) : d});
             }});
  }
}

// A small classifier head: logits = x @ w + bias in f32, the loss and its gradient in x's dtype, and
// dx = dlogits @ w^T. The reference is plain loops in double over the inputs' values (the gradient
// not rounded to 16 bits before dx: within the dtype's tolerance).
Expected linear_cross_entropy_reference(const OpCall& c) {
  const std::vector<double> x = host_values(c.inputs[0]), w = host_values(c.inputs[1]), b = host_values(c.inputs[2]),
                            t = host_values(c.inputs[3]);
  const double g = host_values(c.inputs[4])[0];
  const int64_t N = c.inputs[0].size(0), C = c.inputs[0].size(1), K = c.inputs[1].size(1);
  const bool mean = c.attrs.i("reduction", 0) == 0;
  int64_t count = 0;
  for (double v : t) count += v != -100;
  const double scale = mean ? g / double(count) : g;
  double total = 0;
  std::vector<double> d(size_t(N * K), 0.0), dx(size_t(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> l(static_cast<size_t>(K));
    double m = -INFINITY;
    for (int64_t k = 0; k < K; ++k) {
      l[size_t(k)] = b[size_t(k)];
      for (int64_t j = 0; j < C; ++j) l[size_t(k)] += x[size_t(n * C + j)] * w[size_t(j * K + k)];
      m = std::max(m, l[size_t(k)]);
    }
    double s = 0;
    for (double v : l) s += std::exp(v - m);
    const double lse = m + std::log(s);
    const int64_t tn = int64_t(t[size_t(n)]);
    if (tn == -100) continue;
    total += lse - l[size_t(tn)];
    for (int64_t k = 0; k < K; ++k)
      d[size_t(n * K + k)] = (std::exp(l[size_t(k)] - lse) - (k == tn ? 1.0 : 0.0)) * scale;
    for (int64_t j = 0; j < C; ++j)
      for (int64_t k = 0; k < K; ++k) dx[size_t(n * C + j)] += d[size_t(n * K + k)] * w[size_t(j * K + k)];
  }
  Expected out = {{mean ? total / double(count) : total}, d, dx};
  if (c.attrs.has("dtype")) out.push_back(x);  // the cast of x, rounded by the comparison's dtype
  return out;
}

void add_linear_cross_entropy_cases(std::vector<OpTestCase>& cases) {
  struct Variant {
    const char* name;
    int64_t N, C, K, reduction;
    std::vector<int64_t> ignored;
    bool cast = false;  // an f32 x, cast to the case's 16-bit dtype by the op (attr dtype)
    Layout w_layout = Layout::contiguous;  // transposed: a Linear's W^T as a view of its (K, C) weight
  };
  // cnn-small's head; rows ignored under a sum; one class; more rows than the CUDA grid's blocks
  // (each block then takes several rows); cnn-small's head under autocast, the cast folded in; and
  // as in f32, where w is the weight's transposed view.
  for (const Variant& v :
       {Variant{"mean_32x128_to_10", 32, 128, 10, 0, {}}, Variant{"sum_ignoring_rows_0_3_5x7_to_3", 5, 7, 3, 1, {0, 3}},
        Variant{"mean_4x33_to_1", 4, 33, 1, 0, {}}, Variant{"mean_ignoring_row_7_700x24_to_12", 700, 24, 12, 0, {7}},
        Variant{"mean_f32_x_cast_32x128_to_10", 32, 128, 10, 0, {}, true},
        Variant{"mean_transposed_w_32x128_to_10", 32, 128, 10, 0, {}, false, Layout::transposed}}) {
    const std::vector<DType> dtypes =
        v.cast ? std::vector<DType>{DType::f16, DType::bf16} : std::vector<DType>{DType::f32, DType::f16, DType::bf16};
    cases.push_back({.op = OpKind::LinearCrossEntropyWithGrad,
                     .name = std::string("linear_cross_entropy_with_grad_") + v.name,
                     .dtypes = dtypes,
                     .make =
                         [v](Device, DType t) {
                           std::vector<double> target = host_values(index_input({v.N}, v.K, 241));
                           for (int64_t n : v.ignored) target[size_t(n)] = -100;
                           Attrs a = Attrs().set("reduction", v.reduction);
                           if (v.cast) a.set("dtype", t);
                           return OpCall{{randn_input({v.N, v.C}, v.cast ? DType::f32 : t, 242),
                                          randn_input({v.C, v.K}, t, 243, v.w_layout, 0.2),
                                          randn_input({v.K}, DType::f32, 244), values_input(target, {v.N}, DType::i64),
                                          scalar_input(0.75, DType::f32)},
                                         a};
                         },
                     .reference = linear_cross_entropy_reference});
  }
}

}  // namespace

std::vector<OpTestCase> fused_reduce_cases() {
  std::vector<OpTestCase> cases;
  add_reduce_cases(cases);
  add_cross_entropy_with_grad_cases(cases);
  add_linear_cross_entropy_cases(cases);
  return cases;
}

}  // namespace reel::harness
