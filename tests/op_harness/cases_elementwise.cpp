// Op-harness cases of the elementwise ops (schemas: kernels/schema/elementwise.cpp). Tables list
// each op with its formula, written again here in double as the plain-loop reference, and the
// domain its inputs are drawn from (log, sqrt, rsqrt, div's denominator: positive). Each op runs on
// a row-major input and on non-contiguous ones; binary ops also broadcast ((3,1) with (1,4), a row
// (5) under (4,5)) and take a stride-0 input. Ops that take any dtype run in i64 too. Comparisons
// draw whole numbers from {-1, 0, 1}, so ties occur, and must agree exactly. The backward helpers
// get what autograd gives them: relu's/tanh's/sigmoid's real outputs, gelu's input.
#include <cmath>

#include "tests/op_harness/inputs.h"
#include "tests/test_util.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;
using Formula1 = double (*)(double x, double param);
using Formula2 = double (*)(double a, double b);

constexpr double kSqrt2OverPi = 0.7978845608028654;

double gelu_of(double x) { return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double gelu_slope(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}

// Exact GELU and SiLU from their definitions (Phi, the normal CDF, through erfc for accuracy).
double gelu_erf_of(double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double gelu_erf_slope(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double silu_of(double x) { return x / (1 + std::exp(-x)); }
double silu_slope(double x) {
  const double s = 1 / (1 + std::exp(-x));
  return s + x * s * (1 - s);
}

// y_i = f(x_i, param), row-major.
std::vector<double> map1(const Tensor& x, double param, Formula1 f) {
  std::vector<double> v = host_values(x);
  for (double& e : v) e = f(e, param);
  return v;
}

// out = f(a, b) over the broadcast shape of the first two inputs (a third, where's b, too).
std::vector<double> map_broadcast(const std::vector<Tensor>& in,
                                  const std::function<double(const std::vector<double>&)>& f) {
  Shape shape = in[0].shape();
  for (const Tensor& t : in) shape = broadcast_shapes(shape, t.shape(), "reference");
  std::vector<std::vector<double>> values;
  for (const Tensor& t : in) values.push_back(host_values(t));
  std::vector<double> out;
  for (int64_t j = 0; j < numel_of(shape); ++j) {
    std::vector<int64_t> idx = testing_util::unravel(j, shape);
    std::vector<double> args;
    for (size_t k = 0; k < in.size(); ++k) args.push_back(values[k][testing_util::broadcast_flat(idx, in[k].shape())]);
    out.push_back(f(args));
  }
  return out;
}

enum class Domain { any, positive };

Tensor draw(const Shape& shape, DType t, uint64_t seed, Domain domain, Layout layout) {
  if (domain == Domain::positive) return uniform_input(shape, t, seed, 0.5, 2.0, layout);
  return randn_input(shape, t, seed, layout, t == DType::i64 ? 4.0 : 1.0);
}

// ---- unary ----

struct Unary {
  OpKind op;
  const char* suffix;  // after the op's name: "" or "_exponent_2_5"
  Domain domain;
  std::vector<DType> dtypes;
  double param;  // exponent or value
  Formula1 formula;
  Tensor (*function)(const Tensor& x, double param);  // the autograd function; null: none
};

const char* param_attr(OpKind op) { return op == OpKind::PowScalar ? "exponent" : "value"; }

OpTestCase unary_case(const Unary& u, const char* shape_name, Shape shape, Layout layout) {
  Attrs attrs;
  if (u.op == OpKind::PowScalar || u.op == OpKind::AddScalar || u.op == OpKind::MulScalar)
    attrs.set(param_attr(u.op), u.param);
  GradcheckFn grad;
  if (u.function) grad = [u](const Inputs& x) { return u.function(x[0], u.param); };
  return {
      .op = u.op,
      .name = std::string(op_name(u.op)) + u.suffix + "_" + shape_name,
      .dtypes = u.dtypes,
      .make = [u, shape, layout, attrs](Device, DType t) { return OpCall{{draw(shape, t, 30, u.domain, layout)}, attrs}; },
      .grad = grad,
      .reference = [u](const OpCall& c) { return Expected{map1(c.inputs[0], u.param, u.formula)}; },
  };
}

std::vector<Unary> unary_table() {
  using D = Domain;
  return {
      {OpKind::Neg, "", D::any, kAllTypes, 0, [](double x, double) { return -x; }, [](const Tensor& x, double) { return neg(x); }},
      {OpKind::Exp, "", D::any, kFloatTypes, 0, [](double x, double) { return std::exp(x); }, [](const Tensor& x, double) { return exp(x); }},
      {OpKind::Log, "", D::positive, kFloatTypes, 0, [](double x, double) { return std::log(x); }, [](const Tensor& x, double) { return log(x); }},
      {OpKind::Sqrt, "", D::positive, kFloatTypes, 0, [](double x, double) { return std::sqrt(x); }, [](const Tensor& x, double) { return sqrt(x); }},
      {OpKind::Rsqrt, "", D::positive, kFloatTypes, 0, [](double x, double) { return 1 / std::sqrt(x); }, [](const Tensor& x, double) { return rsqrt(x); }},
      {OpKind::Abs, "", D::any, kAllTypes, 0, [](double x, double) { return std::abs(x); }, [](const Tensor& x, double) { return abs(x); }},
      {OpKind::Tanh, "", D::any, kFloatTypes, 0, [](double x, double) { return std::tanh(x); }, [](const Tensor& x, double) { return tanh(x); }},
      {OpKind::Sigmoid, "", D::any, kFloatTypes, 0, [](double x, double) { return 1 / (1 + std::exp(-x)); }, [](const Tensor& x, double) { return sigmoid(x); }},
      {OpKind::Relu, "", D::any, kFloatTypes, 0, [](double x, double) { return x > 0 ? x : 0; }, [](const Tensor& x, double) { return relu(x); }},
      {OpKind::Gelu, "", D::any, kFloatTypes, 0, [](double x, double) { return gelu_of(x); }, [](const Tensor& x, double) { return gelu(x); }},
      {OpKind::GeluErf, "", D::any, kFloatTypes, 0, [](double x, double) { return gelu_erf_of(x); }, [](const Tensor& x, double) { return gelu(x, "none"); }},
      {OpKind::Silu, "", D::any, kFloatTypes, 0, [](double x, double) { return silu_of(x); }, [](const Tensor& x, double) { return silu(x); }},
      {OpKind::PowScalar, "_exponent_2_5", D::positive, kFloatTypes, 2.5, [](double x, double p) { return std::pow(x, p); }, [](const Tensor& x, double p) { return pow(x, p); }},
      {OpKind::PowScalar, "_exponent_3", D::any, kFloatTypes, 3.0, [](double x, double p) { return std::pow(x, p); }, [](const Tensor& x, double p) { return pow(x, p); }},
      {OpKind::PowScalar, "_exponent_minus_half", D::positive, kFloatTypes, -0.5, [](double x, double p) { return std::pow(x, p); }, [](const Tensor& x, double p) { return pow(x, p); }},
      {OpKind::AddScalar, "", D::any, kFloatTypes, -1.25, [](double x, double v) { return x + v; }, [](const Tensor& x, double v) { return add(x, v); }},
      {OpKind::AddScalar, "_whole", D::any, {DType::i64}, 3.0, [](double x, double v) { return x + v; }, nullptr},
      {OpKind::MulScalar, "", D::any, kFloatTypes, 0.75, [](double x, double v) { return x * v; }, [](const Tensor& x, double v) { return mul(x, v); }},
      {OpKind::MulScalar, "_whole", D::any, {DType::i64}, -3.0, [](double x, double v) { return x * v; }, nullptr},
  };
}

void add_unary_cases(std::vector<OpTestCase>& cases) {
  for (const Unary& u : unary_table()) {
    cases.push_back(unary_case(u, "4x5", {4, 5}, Layout::contiguous));
    cases.push_back(unary_case(u, "transposed_3x5", {3, 5}, Layout::transposed));
  }
  Unary neg = unary_table()[0];
  neg.function = nullptr;
  cases.push_back(unary_case(neg, "empty_0x3", {0, 3}, Layout::contiguous));
  cases.push_back(unary_case(unary_table()[1], "strided_large_3x300", {3, 300}, Layout::strided));
}

// ---- binary, comparisons and the backward helpers ----

struct Binary {
  OpKind op;
  std::vector<DType> dtypes;
  Domain a_domain, b_domain;
  Formula2 formula;
  Tensor (*function)(const Tensor&, const Tensor&);  // null: not differentiable
  double tol_scale = 1;
};

struct Operands {
  const char* name;
  Shape a, b;
  Layout a_layout, b_layout;
  bool b_expanded = false;  // b is a stride-0 view (1, b[1]) broadcast to b
};

const Operands kOperandShapes[] = {
    {"broadcast_3x1_1x4", {3, 1}, {1, 4}, Layout::contiguous, Layout::contiguous},
    {"row_4x5_5", {4, 5}, {5}, Layout::transposed, Layout::contiguous},
    {"transposed_strided_3x4", {3, 4}, {3, 4}, Layout::transposed, Layout::strided},
    {"expanded_b_3x4", {3, 4}, {3, 4}, Layout::contiguous, Layout::contiguous, true},
};

Tensor operand(const Shape& shape, DType t, uint64_t seed, Domain domain, Layout layout, bool stride0) {
  if (!stride0) return draw(shape, t, seed, domain, layout);
  return expanded(draw({1, shape[1]}, t, seed, domain, layout), shape);
}

OpTestCase binary_case(const Binary& b, const Operands& s) {
  GradcheckFn grad;
  if (b.function) grad = [f = b.function](const Inputs& x) { return f(x[0], x[1]); };
  return {
      .op = b.op,
      .name = std::string(op_name(b.op)) + "_" + s.name,
      .dtypes = b.dtypes,
      .make =
          [b, s](Device, DType t) {
            return OpCall{{operand(s.a, t, 40, b.a_domain, s.a_layout, false),
                           operand(s.b, t, 41, b.b_domain, s.b_layout, s.b_expanded)},
                          {}};
          },
      .grad = grad,
      .tol_scale = b.tol_scale,
      .reference =
          [f = b.formula](const OpCall& c) {
            return Expected{map_broadcast(c.inputs, [f](const std::vector<double>& v) { return f(v[0], v[1]); })};
          },
  };
}

std::vector<Binary> binary_table() {
  using D = Domain;
  return {
      {OpKind::Add, kAllTypes, D::any, D::any, [](double a, double b) { return a + b; }, [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {OpKind::Sub, kAllTypes, D::any, D::any, [](double a, double b) { return a - b; }, [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {OpKind::Mul, kAllTypes, D::any, D::any, [](double a, double b) { return a * b; }, [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {OpKind::Div, kFloatTypes, D::any, D::positive, [](double a, double b) { return a / b; }, [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      // gradient g first, then the saved tensor: the output (relu, tanh, sigmoid) or the input (gelu, silu)
      {OpKind::ReluBackward, kFloatTypes, D::any, D::any, [](double g, double y) { return y > 0 ? g : 0; }, nullptr},
      {OpKind::GeluBackward, kFloatTypes, D::any, D::any, [](double g, double x) { return g * gelu_slope(x); }, nullptr},
      {OpKind::GeluErfBackward, kFloatTypes, D::any, D::any, [](double g, double x) { return g * gelu_erf_slope(x); }, nullptr},
      {OpKind::SiluBackward, kFloatTypes, D::any, D::any, [](double g, double x) { return g * silu_slope(x); }, nullptr},
      {OpKind::TanhBackward, kFloatTypes, D::any, D::any, [](double g, double y) { return g * (1 - y * y); }, nullptr},
      {OpKind::SigmoidBackward, kFloatTypes, D::any, D::any, [](double g, double y) { return g * y * (1 - y); }, nullptr},
  };
}

// relu/tanh/sigmoid backward read the forward's output: b is replaced by op(b) on the CPU.
OpKind forward_of(OpKind backward) {
  switch (backward) {
    case OpKind::ReluBackward: return OpKind::Relu;
    case OpKind::TanhBackward: return OpKind::Tanh;
    case OpKind::SigmoidBackward: return OpKind::Sigmoid;
    default: return backward;
  }
}

void add_binary_cases(std::vector<OpTestCase>& cases) {
  for (const Binary& b : binary_table())
    for (const Operands& s : kOperandShapes) {
      OpTestCase c = binary_case(b, s);
      const OpKind forward = forward_of(b.op);
      if (forward != b.op) {
        auto make = c.make;
        c.make = [make, forward](Device d, DType t) {
          OpCall call = make(d, t);
          call.inputs[1] = dispatch1(forward, {call.inputs[1]});
          return call;
        };
      }
      cases.push_back(std::move(c));
    }
}

void add_comparison_cases(std::vector<OpTestCase>& cases) {
  const std::pair<OpKind, Formula2> table[] = {
      {OpKind::Eq, [](double a, double b) { return double(a == b); }},
      {OpKind::Ne, [](double a, double b) { return double(a != b); }},
      {OpKind::Lt, [](double a, double b) { return double(a < b); }},
      {OpKind::Le, [](double a, double b) { return double(a <= b); }},
      {OpKind::Gt, [](double a, double b) { return double(a > b); }},
      {OpKind::Ge, [](double a, double b) { return double(a >= b); }},
  };
  for (const auto& [op, formula] : table)
    for (const Operands& s : {kOperandShapes[0], kOperandShapes[2]}) {
      OpTestCase c = binary_case(Binary{op, kAllTypes, Domain::any, Domain::any, formula, nullptr, 0}, s);
      c.make = [s](Device, DType t) {
        return OpCall{{integer_input(s.a, t, 50, -1, 1, s.a_layout), integer_input(s.b, t, 51, -1, 1, s.b_layout)}, {}};
      };
      cases.push_back(std::move(c));
    }
}

// ---- where and masked_fill ----

void add_selection_cases(std::vector<OpTestCase>& cases) {
  auto pick = [](const OpCall& c) {
    return Expected{map_broadcast(c.inputs, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; })};
  };
  cases.push_back({.op = OpKind::Where,
                   .name = "where_cond_4x1_a_4x5_b_5",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{integer_input({4, 1}, t, 60, 0, 1), draw({4, 5}, t, 61, Domain::any, Layout::transposed),
                                        draw({5}, t, 62, Domain::any, Layout::contiguous)},
                                       {}};
                       },
                   .grad = [](const Inputs& x) { return where(x[0], x[1], x[2]); },
                   .grad_inputs = {1, 2},
                   .reference = pick});
  cases.push_back({.op = OpKind::Where,
                   .name = "where_strided_cond_3x4",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{integer_input({3, 4}, t, 63, 0, 1, Layout::strided),
                                        draw({3, 4}, t, 64, Domain::any, Layout::contiguous),
                                        expanded(draw({1}, t, 65, Domain::any, Layout::contiguous), {3, 4})},
                                       {}};
                       },
                   .reference = pick});
  struct Masked {
    const char* name;
    Shape mask;
    Layout x_layout;
  };
  for (const Masked& m : {Masked{"masked_fill_4x5_mask_1x5", {1, 5}, Layout::contiguous},
                          Masked{"masked_fill_transposed_4x5_mask_4x5", {4, 5}, Layout::transposed}}) {
    cases.push_back({.op = OpKind::MaskedFill,
                     .name = m.name,
                     .dtypes = kAllTypes,
                     .make =
                         [m](Device, DType t) {
                           return OpCall{{draw({4, 5}, t, 66, Domain::any, m.x_layout), integer_input(m.mask, t, 67, 0, 1)},
                                         Attrs().set("value", -2.5)};
                         },
                     .grad = [](const Inputs& x) { return masked_fill(x[0], x[1], -2.5); },
                     .grad_inputs = {0},
                     .reference = [](const OpCall& c) {
                       const double v = c.inputs[0].dtype() == DType::i64 ? -2.0 : -2.5;
                       return Expected{map_broadcast(c.inputs, [v](const std::vector<double>& e) { return e[1] != 0 ? v : e[0]; })};
                     }});
  }
}

}  // namespace

std::vector<OpTestCase> elementwise_cases() {
  std::vector<OpTestCase> cases;
  add_unary_cases(cases);
  add_binary_cases(cases);
  add_comparison_cases(cases);
  add_selection_cases(cases);
  return cases;
}

}  // namespace reel::harness
