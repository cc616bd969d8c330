// Op-harness cases of the reductions, softmax family, cross-entropy and global norm (schemas:
// kernels/schema/reduce.cpp). Reductions run over one dim, several dims, all dims (0-dim result),
// with and without keepdim, on row-major, transposed and strided inputs, and over an empty
// selection (mean: NaN). Softmax-like ops run along the last dim (rows) and along a leading dim
// (columns: the panel path). The backward ops are fed what the forward gives: softmax_backward a real
// softmax output, cross_entropy_backward the forward's lse.
// Plain-loop references: every op of the family.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/op_harness/inputs.h"
#include "tests/test_util.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;
using testing_util::unravel;

std::vector<int64_t> wrapped(std::vector<int64_t> dims, int64_t ndim) {
  for (int64_t& d : dims) d = d < 0 ? d + ndim : d;
  return dims;
}

// ---- sum, mean, max ----

// out[j] combines every x whose index, with the reduced dims dropped, is j (row-major).
std::vector<double> reduce_reference(OpKind op, const Tensor& x, const Attrs& a) {
  const Shape& shape = x.shape();
  std::vector<int64_t> dims = wrapped(a.has("dims") ? a.ints("dims") : std::vector<int64_t>{}, x.dim());
  auto reduced = [&](size_t d) { return dims.empty() || std::find(dims.begin(), dims.end(), int64_t(d)) != dims.end(); };
  Shape kept;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!reduced(d)) kept.push_back(shape[d]);
  const double init = op == OpKind::Max ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<double> acc(size_t(numel_of(kept)), init), count(acc.size(), 0.0), v = host_values(x);
  for (int64_t j = 0; j < x.numel(); ++j) {
    std::vector<int64_t> idx = unravel(j, shape);
    int64_t out = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      if (!reduced(d)) out = out * shape[d] + idx[d];
    acc[out] = op == OpKind::Max ? std::max(acc[out], v[j]) : acc[out] + v[j];
    count[out] += 1;
  }
  if (op == OpKind::Mean)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] /= count[i];
  return acc;
}

struct Reduction {
  const char* name;  // after the op's name
  Shape shape;
  Layout layout;
  std::vector<int64_t> dims;  // empty: every dim
  bool keepdim;
};

const Reduction kReductions[] = {
    {"dim1_3x4", {3, 4}, Layout::contiguous, {1}, false},
    {"dim1_keepdim_3x4", {3, 4}, Layout::contiguous, {1}, true},
    {"leading_dim_5x6", {5, 6}, Layout::contiguous, {0}, false},
    {"all_dims_2x3x4", {2, 3, 4}, Layout::contiguous, {}, false},
    {"dims_0_2_keepdim_transposed_2x3x4", {2, 3, 4}, Layout::transposed, {0, -1}, true},
    {"dim_minus1_strided_4x5", {4, 5}, Layout::strided, {-1}, false},
    {"long_row_2x200", {2, 200}, Layout::contiguous, {1}, false},
};

Tensor (*reduce_function(OpKind op))(const Tensor&, const std::vector<int64_t>&, bool) {
  switch (op) {
    case OpKind::Sum: return sum;
    case OpKind::Mean: return mean;
    default: return max;
  }
}

void add_reduction_cases(std::vector<OpTestCase>& cases) {
  for (OpKind op : {OpKind::Sum, OpKind::Mean, OpKind::Max})
    for (const Reduction& r : kReductions) {
      Attrs attrs = Attrs().set("keepdim", r.keepdim);
      if (!r.dims.empty()) attrs.set("dims", r.dims);
      const auto function = reduce_function(op);
      const bool small = numel_of(r.shape) <= 24;
      cases.push_back({
          .op = op,
          .name = std::string(op_name(op)) + "_" + r.name,
          .dtypes = op == OpKind::Mean ? std::vector<DType>(kFloatTypes) : std::vector<DType>(kAllTypes),
          .make =
              [r, attrs](Device, DType t) {
                return OpCall{{randn_input(r.shape, t, 70, r.layout, t == DType::i64 ? 8.0 : 1.0)}, attrs};
              },
          .grad = small ? GradcheckFn([function, r](const Inputs& x) { return function(x[0], r.dims, r.keepdim); })
                        : GradcheckFn(),
          .reference = [op](const OpCall& c) { return Expected{reduce_reference(op, c.inputs[0], c.attrs)}; },
      });
    }
  cases.push_back({.op = OpKind::Mean,
                   .name = "mean_empty_selection_0x3",
                   .dtypes = kFloatTypes,
                   .make = [](Device, DType t) { return OpCall{{randn_input({0, 3}, t, 71)}, Attrs().set("dims", std::vector<int64_t>{0})}; },
                   .reference = [](const OpCall& c) { return Expected{reduce_reference(OpKind::Mean, c.inputs[0], c.attrs)}; }});
}

// ---- softmax, log-softmax and their backward ops ----

// The flat indices of each line of `shape` along `dim`.
std::vector<std::vector<int64_t>> lines_along(const Shape& shape, int64_t dim) {
  int64_t inner = 1;
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t C = shape[dim], outer = numel_of(shape) / std::max<int64_t>(C * inner, 1);
  std::vector<std::vector<int64_t>> lines;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<int64_t> line;
      for (int64_t c = 0; c < C; ++c) line.push_back((o * C + c) * inner + i);
      lines.push_back(line);
    }
  return lines;
}

// softmax (log = false) or log-softmax of x along `dim`, row-major.
std::vector<double> softmax_reference(const Tensor& x, int64_t dim, bool log) {
  std::vector<double> v = host_values(x), y(v.size());
  for (const auto& line : lines_along(x.shape(), dim < 0 ? dim + x.dim() : dim)) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t k : line) m = std::max(m, v[k]);
    for (int64_t k : line) s += std::exp(v[k] - m);
    for (int64_t k : line) y[k] = log ? v[k] - m - std::log(s) : std::exp(v[k] - m) / s;
  }
  return y;
}

// dx = y (g - sum(g y)) for softmax, g - exp(y) sum(g) for log-softmax.
std::vector<double> softmax_backward_reference(const Tensor& g, const Tensor& y, int64_t dim, bool log) {
  std::vector<double> gv = host_values(g), yv = host_values(y), dx(gv.size());
  for (const auto& line : lines_along(y.shape(), dim < 0 ? dim + y.dim() : dim)) {
    double s = 0;
    for (int64_t k : line) s += log ? gv[k] : gv[k] * yv[k];
    for (int64_t k : line) dx[k] = log ? gv[k] - std::exp(yv[k]) * s : yv[k] * (gv[k] - s);
  }
  return dx;
}

struct Along {
  const char* name;
  Shape shape;
  Layout layout;
  int64_t dim;
};

const Along kAlongs[] = {
    {"rows_3x7", {3, 7}, Layout::contiguous, -1},
    {"columns_5x3", {5, 3}, Layout::contiguous, 0},
    {"middle_dim_2x5x3", {2, 5, 3}, Layout::contiguous, 1},
    {"transposed_rows_4x6", {4, 6}, Layout::transposed, 1},
    {"strided_columns_3x4", {3, 4}, Layout::strided, 0},
};

void add_softmax_cases(std::vector<OpTestCase>& cases) {
  for (const bool log : {false, true})
    for (const Along& s : kAlongs) {
      const OpKind op = log ? OpKind::LogSoftmax : OpKind::Softmax;
      const int64_t dim = s.dim;
      cases.push_back({
          .op = op,
          .name = std::string(op_name(op)) + "_" + s.name,
          .dtypes = kFloatTypes,
          .make = [s](Device, DType t) { return OpCall{{randn_input(s.shape, t, 72, s.layout, 3.0)}, Attrs().set("dim", s.dim)}; },
          .grad = [log, dim](const Inputs& x) { return log ? log_softmax(x[0], dim) : softmax(x[0], dim); },
          .reference = [log](const OpCall& c) { return Expected{softmax_reference(c.inputs[0], c.attrs.i("dim"), log)}; },
      });
      const OpKind backward = log ? OpKind::LogSoftmaxBackward : OpKind::SoftmaxBackward;
      cases.push_back({
          .op = backward,
          .name = std::string(op_name(backward)) + "_" + s.name,
          .dtypes = kFloatTypes,
          .make =
              [s, op](Device, DType t) {
                Attrs a = Attrs().set("dim", s.dim);
                Tensor y = dispatch1(op, {randn_input(s.shape, t, 73, s.layout, 3.0)}, a);
                return OpCall{{randn_input(s.shape, t, 74, s.layout), y}, a};
              },
          .reference =
              [log](const OpCall& c) {
                return Expected{softmax_backward_reference(c.inputs[0], c.inputs[1], c.attrs.i("dim"), log)};
              },
      });
    }
}

// ---- cross-entropy ----

struct Entropy {
  const char* name;
  int64_t N, C;
  Layout layout;
  std::vector<int64_t> ignored_rows;  // their target is set to ignore_index
  int64_t ignore_index, reduction;
};

const Entropy kEntropies[] = {
    {"mean_6x5", 6, 5, Layout::contiguous, {}, -100, 0},
    {"sum_transposed_4x7", 4, 7, Layout::transposed, {}, -100, 1},
    {"mean_ignoring_rows_1_3_5x4", 5, 4, Layout::strided, {1, 3}, -100, 0},
    {"sum_ignore_index_2_5x3", 5, 3, Layout::contiguous, {0, 4}, 2, 1},
    {"mean_all_ignored_3x4", 3, 4, Layout::contiguous, {0, 1, 2}, -100, 0},
};

OpCall entropy_call(const Entropy& e, DType t) {
  Tensor logits = randn_input({e.N, e.C}, t, 75, e.layout, 2.0);
  std::vector<double> target = host_values(index_input({e.N}, e.C, 76));
  for (int64_t n : e.ignored_rows) target[size_t(n)] = double(e.ignore_index);
  for (int64_t n = 0; n < e.N; ++n)  // a counted row may not aim at ignore_index itself
    if (target[n] == double(e.ignore_index) && !std::count(e.ignored_rows.begin(), e.ignored_rows.end(), n))
      target[n] = double((e.ignore_index + 1) % e.C);
  Attrs a = Attrs().set("ignore_index", e.ignore_index).set("reduction", e.reduction);
  return OpCall{{logits, values_input(target, {e.N}, DType::i64)}, a};
}

// (loss, lse): lse_n = log sum_c exp(x_nc); loss = sum or mean over counted rows of lse_n - x[n, t_n].
Expected cross_entropy_reference(const OpCall& c) {
  const int64_t N = c.inputs[0].shape()[0], C = c.inputs[0].shape()[1];
  std::vector<double> x = host_values(c.inputs[0]), t = host_values(c.inputs[1]), lse(static_cast<size_t>(N));
  double total = 0, count = 0;
  for (int64_t n = 0; n < N; ++n) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t k = 0; k < C; ++k) m = std::max(m, x[n * C + k]);
    for (int64_t k = 0; k < C; ++k) s += std::exp(x[n * C + k] - m);
    lse[n] = m + std::log(s);
    if (int64_t(t[n]) == c.attrs.i("ignore_index")) continue;
    total += lse[n] - x[n * C + int64_t(t[n])];
    count += 1;
  }
  return {{c.attrs.i("reduction") == 0 ? total / count : total}, lse};
}

// dlogits from inputs (g, logits, target, lse): (softmax - onehot(target)) g / count (mean) or g
// (sum); ignored rows 0. The softmax is recomputed here, not taken from lse.
Expected cross_entropy_backward_reference(const OpCall& c) {
  const int64_t N = c.inputs[1].shape()[0], C = c.inputs[1].shape()[1], ignore = c.attrs.i("ignore_index");
  std::vector<double> x = host_values(c.inputs[1]), t = host_values(c.inputs[2]), dx(x.size(), 0.0);
  const double count = double(std::count_if(t.begin(), t.end(), [&](double v) { return int64_t(v) != ignore; }));
  const double scale = host_values(c.inputs[0])[0] / (c.attrs.i("reduction") == 0 ? count : 1.0);
  for (int64_t n = 0; n < N; ++n) {
    if (int64_t(t[n]) == ignore) continue;
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t k = 0; k < C; ++k) m = std::max(m, x[n * C + k]);
    for (int64_t k = 0; k < C; ++k) s += std::exp(x[n * C + k] - m);
    for (int64_t k = 0; k < C; ++k) dx[n * C + k] = (std::exp(x[n * C + k] - m) / s - (k == int64_t(t[n]))) * scale;
  }
  return {dx};
}

void add_cross_entropy_cases(std::vector<OpTestCase>& cases) {
  for (const Entropy& e : kEntropies) {
    const bool all_ignored = int64_t(e.ignored_rows.size()) == e.N;
    cases.push_back({
        .op = OpKind::CrossEntropy,
        .name = std::string("cross_entropy_") + e.name,
        .dtypes = kFloatTypes,
        .make = [e](Device, DType t) { return entropy_call(e, t); },
        .grad = all_ignored ? GradcheckFn()
                            : GradcheckFn([e](const Inputs& x) {
                                return cross_entropy(x[0], x[1], e.reduction == 0 ? "mean" : "sum", e.ignore_index);
                              }),
        .reference = cross_entropy_reference,
    });
    cases.push_back({
        .op = OpKind::CrossEntropyBackward,
        .name = std::string("cross_entropy_backward_") + e.name,
        .dtypes = kFloatTypes,
        .make =
            [e](Device, DType t) {
              OpCall forward = entropy_call(e, t);
              Tensor lse = dispatch(OpKind::CrossEntropy, forward.inputs, forward.attrs)[1];
              return OpCall{{scalar_input(1.5, t), forward.inputs[0], forward.inputs[1], lse}, forward.attrs};
            },
        .reference = cross_entropy_backward_reference,
    });
  }
}

// ---- global norm ----

// Attr check_finite: found_inf (the last input, updated in place) set when an element is inf or NaN,
// and left as it was otherwise, even where the squares of finite values overflow the f32 sum (the
// norm is then inf). The norm's reference squares each value in the accumulation type, as the kernels
// do, so that the overflow case gives the kernels' inf.
void add_global_norm_check_cases(std::vector<OpTestCase>& cases) {
  struct Check {
    const char* name;
    double planted;  // written into element 3 of the second input (0: none)
    double scale;    // of the randn values
    double found;    // the flag before
    std::initializer_list<DType> dtypes;
  };
  for (const Check& v :
       {Check{"global_norm_check_finite_clean", 0, 1, 0, kFloatTypes},
        Check{"global_norm_check_finite_keeps_a_set_flag", 0, 1, 1, kFloatTypes},
        Check{"global_norm_check_finite_inf", INFINITY, 1, 0, kFloatTypes},
        Check{"global_norm_check_finite_nan", NAN, 1, 0, kFloatTypes},
        Check{"global_norm_check_finite_overflowing_squares", 0, 1e20, 0, {DType::f32, DType::bf16}}}) {
    cases.push_back(
        {.op = OpKind::GlobalNorm,
         .name = v.name,
         .dtypes = v.dtypes,
         .make =
             [v](Device, DType t) {
               std::vector<double> x1 = host_values(randn_input({3000}, t, 83, Layout::contiguous, v.scale));
               if (v.planted != 0 || std::isnan(v.planted)) x1[3] = v.planted;
               Tensor found = scalar_input(v.found, DType::f32);
               return OpCall{
                   {randn_input({4, 5}, t, 82, Layout::contiguous, v.scale), values_input(x1, {3000}, t), found},
                   Attrs().set("check_finite", true),
                   {Tensor::empty({}, t == DType::f64 ? DType::f64 : DType::f32, Device::cpu()), found}};
             },
         .reference =
             [](const OpCall& c) {
               const bool f64 = c.inputs[0].dtype() == DType::f64;
               double s = 0, found = host_values(c.inputs[2])[0];
               for (size_t j = 0; j < 2; ++j)
                 for (double x : host_values(c.inputs[j])) {
                   s += f64 ? x * x : double(float(x) * float(x));
                   if (!std::isfinite(x)) found = 1;
                 }
               return Expected{{f64 ? std::sqrt(s) : double(float(std::sqrt(s)))}, {found}};
             }});
  }
}

void add_global_norm_cases(std::vector<OpTestCase>& cases) {
  auto reference = [](const OpCall& c) {
    double s = 0;
    for (const Tensor& t : c.inputs)
      for (double v : host_values(t)) s += v * v;
    return Expected{{std::sqrt(s)}};
  };
  cases.push_back({.op = OpKind::GlobalNorm,
                   .name = "global_norm_three_layouts",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({3, 4}, t, 77, Layout::transposed), randn_input({5}, t, 78),
                                        randn_input({2, 2, 2}, t, 79, Layout::strided), randn_input({0, 2}, t, 80)}};
                       },
                   .reference = reference});
  cases.push_back({.op = OpKind::GlobalNorm,
                   .name = "global_norm_0d_and_long_1000",
                   .dtypes = kFloatTypes,
                   .make = [](Device, DType t) { return OpCall{{scalar_input(-3.0, t), randn_input({1000}, t, 81)}}; },
                   .reference = reference});
  add_global_norm_check_cases(cases);
}

}  // namespace

std::vector<OpTestCase> reduce_cases() {
  std::vector<OpTestCase> cases;
  add_reduction_cases(cases);
  add_softmax_cases(cases);
  add_cross_entropy_cases(cases);
  add_global_norm_cases(cases);
  return cases;
}

}  // namespace reel::harness
