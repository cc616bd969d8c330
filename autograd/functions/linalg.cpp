// Matmul and conv2d and their gradients.
//
//   Y = A @ B            A (..., M, K), B (..., K, N), batch dims broadcast
//     dA = sum_to(G @ B^T, A.shape)     dB = sum_to(A^T @ G, B.shape)
//   The transposes are views (no copies): the GEMM kernel reads them as column-major matrices. When
//   B is one shared matrix (a linear layer: x (B, T, C) @ W (C, D)), dB = sum_b A_b^T G_b is computed
//   as a single GEMM A2^T @ G2 with the batch folded into the rows (A2 (B*T, C), G2 (B*T, D)), rather
//   than B GEMMs followed by a sum.
//   1-D operands follow NumPy: a (K) is taken as (1, K) and b (K) as (K, 1); the added dim is
//   squeezed from the result. These are views around the >= 2-D op, so autograd sees only them.
//
//   y = conv2d(x, w) + bias     x (N, C, H, W), w (O, C/G, kH, kW), bias (O), G groups
//     dx = conv2d_backward_input(g, w)      (the transposed convolution, col2im of w^T g)
//     dw = conv2d_backward_weight(g, x)     (sum over images of g[n] col[n]^T)
//     dbias = sum(g, dims {0, 2, 3})
//   Groups leave the formulas as they are, block by block (each group is its own convolution), so
//   the backward ops take the forward's groups attr with its other attrs.
//   The public conv2d() takes one stride and one padding for both spatial dims and stores them as
//   [h, w] attrs, which the schema and kernels already honour separately. groups is stored only when
//   it is not 1 (absent means 1), so a plain convolution's node and plan text stay as they were.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

Tensor matmul_nd(const Tensor& a, const Tensor& b);

// dB = sum over the broadcast batch of A^T @ G, shaped like B.
Tensor matmul_grad_b(const Tensor& a, const Tensor& g, const Shape& b_shape) {
  if (numel_of(batch_of(b_shape)) == 1) {
    // B is shared by every batch entry: fold the batch into the rows and do one GEMM.
    // (Explicit row counts rather than -1, which cannot be inferred when K or N is 0.)
    int64_t rows_a = numel_of(Shape(a.shape().begin(), a.shape().end() - 1));
    int64_t rows_g = numel_of(Shape(g.shape().begin(), g.shape().end() - 1));
    if (rows_a == rows_g) {
      Tensor a2 = reshape(a, {rows_a, a.shape().back()});  // (B*M, K), a view when a's strides allow
      Tensor g2 = reshape(g, {rows_g, g.shape().back()});  // (B*M, N)
      return reshape(matmul_nd(transpose(a2, 0, 1), g2), b_shape);
    }
  }
  return sum_to(matmul_nd(transpose(a, -1, -2), g), b_shape);
}

// The op proper: both operands have >= 2 dims.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  Tensor y = dispatch1(OpKind::Matmul, {a, b});
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Shape sa = a.shape(), sb = b.shape();
  // dA needs only B and dB needs only A: save just what will be used.
  Tensor a_s = need_b ? saved(a) : Tensor(), b_s = need_a ? saved(b) : Tensor();
  autograd::record("matmul", {a, b}, {y}, [=](const Grads& g) -> Grads {
    // g: (..., M, N), the broadcast batch
    Tensor da = need_a ? sum_to(matmul_nd(g[0], transpose(b_s, -1, -2)), sa) : Tensor();
    Tensor db = need_b ? matmul_grad_b(a_s, g[0], sb) : Tensor();
    return {da, db};
  });
  return y;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  REEL_CHECK(a.defined() && b.defined(), "matmul: an input is undefined");
  REEL_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes ",
             shape_str(a.shape()), " and ", shape_str(b.shape()));
  if (a.dim() >= 2 && b.dim() >= 2) return matmul_nd(a, b);
  // Check the inner dims here so that the message shows the caller's shapes, not the unsqueezed ones.
  int64_t ka = a.shape().back(), kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  REEL_CHECK(ka == kb, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " cannot be multiplied (inner dims ", ka, " and ", kb, " differ)");
  Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;   // (K) -> (1, K)
  Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;   // (K) -> (K, 1)
  Tensor y = matmul_nd(a2, b2);
  if (b.dim() == 1) y = squeeze(y, -1);
  if (a.dim() == 1) y = squeeze(y, b.dim() == 1 ? -1 : -2);
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t groups) {
  Attrs attrs = Attrs().set("stride", std::vector<int64_t>{stride, stride}).set("padding",
                                                                              std::vector<int64_t>{padding, padding});
  if (groups != 1) attrs.set("groups", groups);  // the schema refuses groups < 1
  // The result and dx in x's layout, dw in the weight's (channels-last in, channels-last out).
  const MemoryFormat x_format = x.suggested_format(), w_format = weight.suggested_format();
  Tensor y = dispatch1(OpKind::Conv2d, {x, weight, bias}, attrs, x_format);  // y: (N, O, Ho, Wo)
  bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.requires_grad();
  Shape x_shape = x.shape(), w_shape = weight.shape();
  // dx needs only w and dw needs only x.
  Tensor x_s = need_w ? saved(x) : Tensor(), w_s = need_x ? saved(weight) : Tensor();
  autograd::record("conv2d", {x, weight, bias}, {y}, [=](const Grads& g) -> Grads {
    Tensor dx, dw, db;
    if (need_x)
      dx = dispatch1(OpKind::Conv2dBackwardInput, {g[0], w_s}, Attrs(attrs).set("input_shape", x_shape), x_format);
    if (need_w)
      dw = dispatch1(OpKind::Conv2dBackwardWeight, {g[0], x_s}, Attrs(attrs).set("weight_shape", w_shape), w_format);
    if (need_b) db = sum(g[0], {0, 2, 3});
    return {dx, dw, db};
  });
  return y;
}

}  // namespace reel
