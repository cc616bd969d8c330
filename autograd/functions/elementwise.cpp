// Elementwise ops and their gradients. Broadcast inputs get their gradient summed back to their own
// shape (sum_to). Saved tensors are detached (autograd::saved) so nodes never own their outputs.
//
//   y = a + b      da = g                  db = g
//   y = a * b      da = g b                db = g a
//   y = a / b      da = g / b              db = -g y / b
//   y = exp(x)     dx = g y                y = log(x)    dx = g / x
//   y = sqrt(x)    dx = g / (2 y)          y = rsqrt(x)  dx = -g y^3 / 2
//   y = x^p        dx = g p x^(p-1)        y = |x|       dx = g sign(x)
//   tanh, sigmoid, relu, gelu: fused *_backward ops (kernels/elementwise_math.h has the formulas)
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

Tensor scalar_like(const Tensor& t, double v) { return full({}, v, TensorOptions{t.dtype(), t.device()}); }

Tensor unary(OpKind op, const Tensor& x, const Attrs& a = {}) { return dispatch1(op, {x}, a); }

// What a binary op's gradient formula reads besides g: a bitmask of the operands and the output.
enum Reads : unsigned { kNothing = 0, kA = 1, kB = 2, kY = 4 };

// A binary op whose backward needs only the two gradient shapes' sum_to and the formulas below. Only
// what a needed gradient's formula reads is saved (da_reads when a requires grad, db_reads when b
// does), as PyTorch saves: an add saves nothing, so eager frees its inputs and output as soon as the
// forward no longer holds them, instead of at the backward.
template <typename DA, typename DB>
Tensor binary(OpKind op, const char* name, const Tensor& a, const Tensor& b, unsigned da_reads, DA da,
              unsigned db_reads, DB db) {
  Tensor y = dispatch1(op, {a, b});
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Shape sa = a.shape(), sb = b.shape();
  const unsigned reads = (need_a ? da_reads : 0) | (need_b ? db_reads : 0);
  Tensor a_s = reads & kA ? saved(a) : Tensor(), b_s = reads & kB ? saved(b) : Tensor();
  Tensor y_s = reads & kY ? saved(y) : Tensor();
  autograd::record(name, {a, b}, {y}, [=](const Grads& g) -> Grads {
    return {need_a ? sum_to(da(g[0], a_s, b_s, y_s), sa) : Tensor(),
            need_b ? sum_to(db(g[0], a_s, b_s, y_s), sb) : Tensor()};
  });
  return y;
}

// y = op(x) with dx = backward_op(g, s), where s is x or y as the formula needs.
Tensor unary_fused(OpKind op, OpKind backward_op, const char* name, const Tensor& x, bool save_output) {
  Tensor y = unary(op, x);
  Tensor s = saved(save_output ? y : x);
  autograd::record(name, {x}, {y}, [s, backward_op](const Grads& g) -> Grads {
    return {dispatch1(backward_op, {g[0], s})};
  });
  return y;
}

}  // namespace

Tensor neg(const Tensor& x) {
  Tensor y = unary(OpKind::Neg, x);
  autograd::record("neg", {x}, {y}, [](const Grads& g) -> Grads { return {neg(g[0])}; });
  return y;
}

Tensor exp(const Tensor& x) {
  Tensor y = unary(OpKind::Exp, x);
  Tensor ys = saved(y);
  autograd::record("exp", {x}, {y}, [ys](const Grads& g) -> Grads { return {g[0] * ys}; });
  return y;
}

Tensor log(const Tensor& x) {
  Tensor y = unary(OpKind::Log, x);
  Tensor xs = saved(x);
  autograd::record("log", {x}, {y}, [xs](const Grads& g) -> Grads { return {g[0] / xs}; });
  return y;
}

Tensor sqrt(const Tensor& x) {
  Tensor y = unary(OpKind::Sqrt, x);
  Tensor ys = saved(y);
  autograd::record("sqrt", {x}, {y}, [ys](const Grads& g) -> Grads { return {g[0] / (ys * 2.0)}; });
  return y;
}

Tensor rsqrt(const Tensor& x) {
  Tensor y = unary(OpKind::Rsqrt, x);
  Tensor ys = saved(y);
  autograd::record("rsqrt", {x}, {y}, [ys](const Grads& g) -> Grads { return {g[0] * pow(ys, 3.0) * -0.5}; });
  return y;
}

Tensor abs(const Tensor& x) {
  Tensor y = unary(OpKind::Abs, x);
  Tensor xs = saved(x);
  autograd::record("abs", {x}, {y}, [xs](const Grads& g) -> Grads {
    Tensor zero = scalar_like(xs, 0.0);
    return {g[0] * (gt(xs, zero) - lt(xs, zero))};
  });
  return y;
}

Tensor tanh(const Tensor& x) { return unary_fused(OpKind::Tanh, OpKind::TanhBackward, "tanh", x, true); }
Tensor sigmoid(const Tensor& x) { return unary_fused(OpKind::Sigmoid, OpKind::SigmoidBackward, "sigmoid", x, true); }
Tensor relu(const Tensor& x) { return unary_fused(OpKind::Relu, OpKind::ReluBackward, "relu", x, true); }
Tensor gelu(const Tensor& x) { return unary_fused(OpKind::Gelu, OpKind::GeluBackward, "gelu", x, false); }
Tensor gelu(const Tensor& x, const std::string& approximate) {
  REEL_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
             approximate, "\"");
  if (approximate == "tanh") return gelu(x);
  return unary_fused(OpKind::GeluErf, OpKind::GeluErfBackward, "gelu_erf", x, false);
}
Tensor silu(const Tensor& x) { return unary_fused(OpKind::Silu, OpKind::SiluBackward, "silu", x, false); }

Tensor pow(const Tensor& x, double p) {
  Tensor y = unary(OpKind::PowScalar, x, Attrs().set("exponent", p));
  Tensor xs = saved(x);
  autograd::record("pow", {x}, {y}, [xs, p](const Grads& g) -> Grads { return {g[0] * pow(xs, p - 1.0) * p}; });
  return y;
}

Tensor add(const Tensor& a, double b) {
  Tensor y = unary(OpKind::AddScalar, a, Attrs().set("value", b));
  autograd::record("add_scalar", {a}, {y}, [](const Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor mul(const Tensor& a, double b) {
  Tensor y = unary(OpKind::MulScalar, a, Attrs().set("value", b));
  autograd::record("mul_scalar", {a}, {y}, [b](const Grads& g) -> Grads { return {g[0] * b}; });
  return y;
}

Tensor add(const Tensor& a, const Tensor& b) {
  auto pass = [](const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; };
  return binary(OpKind::Add, "add", a, b, kNothing, pass, kNothing, pass);
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(
      OpKind::Sub, "sub", a, b, kNothing, [](const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return g; },
      kNothing, [](const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return neg(g); });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(
      OpKind::Mul, "mul", a, b, kB, [](const Tensor& g, const Tensor&, const Tensor& bs, const Tensor&) { return g * bs; },
      kA, [](const Tensor& g, const Tensor& as, const Tensor&, const Tensor&) { return g * as; });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return binary(
      OpKind::Div, "div", a, b, kB, [](const Tensor& g, const Tensor&, const Tensor& bs, const Tensor&) { return g / bs; },
      kB | kY, [](const Tensor& g, const Tensor&, const Tensor& bs, const Tensor& ys) { return neg(g * ys / bs); });
}

Tensor eq(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Eq, {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Ne, {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Lt, {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Le, {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Gt, {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return dispatch1(OpKind::Ge, {a, b}); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  REEL_CHECK(cond.defined() && a.defined() && b.defined(), "where: an input is undefined");
  Tensor c = to_dtype(cond.detach(), a.dtype());
  Tensor y = dispatch1(OpKind::Where, {c, a, b});
  Shape sa = a.shape(), sb = b.shape();
  autograd::record("where", {a, b}, {y}, [c, sa, sb](const Grads& g) -> Grads {
    Tensor zero = scalar_like(g[0], 0.0);
    return {sum_to(dispatch1(OpKind::Where, {c, g[0], zero}), sa),
            sum_to(dispatch1(OpKind::Where, {c, zero, g[0]}), sb)};
  });
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  REEL_CHECK(x.defined() && mask.defined(), "masked_fill: an input is undefined");
  Tensor m = to_dtype(mask.detach(), x.dtype());
  Tensor y = dispatch1(OpKind::MaskedFill, {x, m}, Attrs().set("value", value));
  autograd::record("masked_fill", {x}, {y}, [m](const Grads& g) -> Grads {
    return {dispatch1(OpKind::MaskedFill, {g[0], m}, Attrs().set("value", 0.0))};
  });
  return y;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }

}  // namespace reel
