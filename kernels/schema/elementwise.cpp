// Schemas of the elementwise ops. All broadcast NumPy-style and accept any strides; the output is a
// fresh contiguous tensor of the broadcast shape. Inputs of a binary op must share one dtype (reel
// does not promote). Comparisons return 0/1 in the inputs' dtype (reel has no bool dtype).
//
//   unary (x)            neg abs: any dtype;  exp log sqrt rsqrt tanh sigmoid relu gelu gelu_erf silu: float
//   pow_scalar (x)       attr exponent        y = x^exponent
//   add_scalar (x)       attr value           y = x + value
//   mul_scalar (x)       attr value           y = x * value
//   *_backward (g, s)    s is relu's/tanh's/sigmoid's output y, or gelu's/gelu_erf's/silu's input x; returns dx
//   add sub mul div (a, b)      eq ne lt le gt ge (a, b)
//   where (cond, a, b)   cond != 0 ? a : b; cond has a's dtype
//   masked_fill (x, mask) attr value      mask broadcasts to x's shape; x where mask == 0, else value
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

bool float_only(OpKind op) {
  switch (op) {
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::AddScalar:
    case OpKind::MulScalar:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::Where:
    case OpKind::MaskedFill:
      return false;
    default:
      return true;
  }
}

template <OpKind Op>
std::vector<TensorMeta> infer_unary(const std::vector<Tensor>& in, const Attrs&) {
  schema::expect_inputs(Op, in, 1);
  schema::expect_defined(Op, in[0], "input");
  if (float_only(Op)) schema::expect_float(Op, in[0]);
  return {schema::meta_like(in[0])};
}

template <OpKind Op>
std::vector<TensorMeta> infer_binary(const std::vector<Tensor>& in, const Attrs&) {
  schema::expect_inputs(Op, in, 2);
  schema::expect_defined(Op, in[0], "first input");
  schema::expect_defined(Op, in[1], "second input");
  schema::expect_same_dtype(Op, in[0], in[1]);
  if (float_only(Op)) schema::expect_float(Op, in[0]);
  Shape shape = broadcast_shapes(in[0].shape(), in[1].shape(), op_name(Op));
  return {{shape, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_where(const std::vector<Tensor>& in, const Attrs&) {
  schema::expect_inputs(OpKind::Where, in, 3);
  for (const Tensor& t : in) schema::expect_defined(OpKind::Where, t, "input");
  schema::expect_same_dtype(OpKind::Where, in[1], in[2]);
  schema::expect_same_dtype(OpKind::Where, in[0], in[1]);
  Shape shape = broadcast_shapes(broadcast_shapes(in[0].shape(), in[1].shape(), "where"), in[2].shape(), "where");
  return {{shape, in[1].dtype(), in[1].device()}};
}

std::vector<TensorMeta> infer_masked_fill(const std::vector<Tensor>& in, const Attrs&) {
  schema::expect_inputs(OpKind::MaskedFill, in, 2);
  schema::expect_defined(OpKind::MaskedFill, in[0], "input");
  schema::expect_defined(OpKind::MaskedFill, in[1], "mask");
  schema::expect_same_dtype(OpKind::MaskedFill, in[0], in[1]);
  Shape shape = broadcast_shapes(in[0].shape(), in[1].shape(), "masked_fill");
  REEL_CHECK(shape == in[0].shape(), "masked_fill: mask of shape ", shape_str(in[1].shape()),
             " does not broadcast to the input's shape ", shape_str(in[0].shape()));
  return {schema::meta_like(in[0])};
}

}  // namespace

void register_elementwise_schemas() {
  register_schema(OpKind::Neg, infer_unary<OpKind::Neg>);
  register_schema(OpKind::Exp, infer_unary<OpKind::Exp>);
  register_schema(OpKind::Log, infer_unary<OpKind::Log>);
  register_schema(OpKind::Sqrt, infer_unary<OpKind::Sqrt>);
  register_schema(OpKind::Rsqrt, infer_unary<OpKind::Rsqrt>);
  register_schema(OpKind::Abs, infer_unary<OpKind::Abs>);
  register_schema(OpKind::Tanh, infer_unary<OpKind::Tanh>);
  register_schema(OpKind::Sigmoid, infer_unary<OpKind::Sigmoid>);
  register_schema(OpKind::Relu, infer_unary<OpKind::Relu>);
  register_schema(OpKind::Gelu, infer_unary<OpKind::Gelu>);
  register_schema(OpKind::GeluErf, infer_unary<OpKind::GeluErf>);
  register_schema(OpKind::Silu, infer_unary<OpKind::Silu>);
  register_schema(OpKind::PowScalar, infer_unary<OpKind::PowScalar>);
  register_schema(OpKind::AddScalar, infer_unary<OpKind::AddScalar>);
  register_schema(OpKind::MulScalar, infer_unary<OpKind::MulScalar>);
  register_schema(OpKind::ReluBackward, infer_binary<OpKind::ReluBackward>);
  register_schema(OpKind::GeluBackward, infer_binary<OpKind::GeluBackward>);
  register_schema(OpKind::GeluErfBackward, infer_binary<OpKind::GeluErfBackward>);
  register_schema(OpKind::SiluBackward, infer_binary<OpKind::SiluBackward>);
  register_schema(OpKind::TanhBackward, infer_binary<OpKind::TanhBackward>);
  register_schema(OpKind::SigmoidBackward, infer_binary<OpKind::SigmoidBackward>);
  register_schema(OpKind::Add, infer_binary<OpKind::Add>);
  register_schema(OpKind::Sub, infer_binary<OpKind::Sub>);
  register_schema(OpKind::Mul, infer_binary<OpKind::Mul>);
  register_schema(OpKind::Div, infer_binary<OpKind::Div>);
  register_schema(OpKind::Eq, infer_binary<OpKind::Eq>);
  register_schema(OpKind::Ne, infer_binary<OpKind::Ne>);
  register_schema(OpKind::Lt, infer_binary<OpKind::Lt>);
  register_schema(OpKind::Le, infer_binary<OpKind::Le>);
  register_schema(OpKind::Gt, infer_binary<OpKind::Gt>);
  register_schema(OpKind::Ge, infer_binary<OpKind::Ge>);
  register_schema(OpKind::Where, infer_where);
  register_schema(OpKind::MaskedFill, infer_masked_fill);
}

}  // namespace reel
