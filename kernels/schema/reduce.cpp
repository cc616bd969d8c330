// Schemas of the reductions, softmax, cross-entropy and global norm. Every output is a fresh
// contiguous tensor; inputs may have any strides.
//
//   sum (x)            attrs dims (list; empty or absent = all dims), keepdim (0/1, default 0)
//                      any dtype (i64 sums in i64); output has x's dtype
//   mean (x)           same attrs; float only; the mean of an empty selection is NaN
//   max (x)            same attrs; any dtype; the selection must not be empty
//                      Reduced dims are dropped (keepdim 0) or kept with size 1 (keepdim 1); reducing
//                      every dim without keepdim gives a 0-dim tensor.
//   softmax (x)        attr dim     y = exp(x - max) / sum exp(x - max) along dim
//   log_softmax (x)    attr dim     y = x - max - log(sum exp(x - max)) along dim
//   softmax_backward (g, y)      attr dim   dx = y * (g - sum(g * y, dim))
//   log_softmax_backward (g, y)  attr dim   dx = g - exp(y) * sum(g, dim)
//   cross_entropy (logits (N, C), target (N) i64)
//                      attrs ignore_index (default -100), reduction (0 = mean, 1 = sum; default 0)
//                      -> loss: 0-dim, logits' dtype
//                         lse (N): log-sum-exp of each row, in the accumulation dtype (f32 for
//                                  f32/f16/bf16 logits, f64 for f64), saved for the backward
//                      loss_n = lse_n - logits[n, target_n]; rows whose target is ignore_index count
//                      for nothing. mean divides by the number of counted rows, so a batch whose
//                      targets are all ignored gives NaN (0/0), like PyTorch. Targets outside [0, C)
//                      that are not ignore_index are refused by the kernel (the values live on the
//                      device, so the schema cannot see them).
//   cross_entropy_backward (g (0-dim), logits, target, lse)   same attrs
//                      -> dlogits = (softmax(logits) - onehot(target)) * g / count  (mean)
//                                   (softmax(logits) - onehot(target)) * g          (sum)
//                         rows whose target is ignore_index get 0.
//   global_norm (x0, ..., xk)   -> 0-dim sqrt(sum over every element of every x_i of x^2)
//                      inputs: at least one, any shapes, one float dtype; output f32 (f64 for f64)
//                      attr check_finite: (x0, ..., xk, found_inf) -> (norm, found_inf), found_inf
//                      (0-dim f32, in place) set to 1 if an element of an x_i is inf or NaN, else
//                      unchanged: unscale_check's flag, from the pass over the x_i that the norm
//                      makes anyway (compile/passes/fuse_clip_into_optimizer.cpp)
//
// Fused (the compiler writes them; kernels/ops.def):
//   column_sums (x (..., N)[, c (N)])   attr accumulate (0/1)
//                      -> out (N) f32: the sums of x over every dim but the last, accumulated in
//                         f32 (x f32, f16 or bf16: a bias gradient from the 16-bit gradient); with
//                         accumulate, out = c + sums, c being out itself (a gradient over micro-batches)
//   masked_softmax (x (..., T, C), mask (T, C))   attrs value, keep_f32 (default 1), dtype (optional)
//                      y = softmax(masked_fill(x, mask, value), -1)   x, mask f32; the mask broadcast
//                      over x's leading dims -> [y (x.shape) f32 if keep_f32][, y.to(dtype) if dtype]
//   masked_softmax_backward (g, y, mask (T, C))   attrs keep_f32, dtype (optional)
//                      dx = masked_fill(softmax_backward(g, y, -1), mask, 0)  -> [dx][, dx.to(dtype)]
//   cross_entropy_with_grad (logits (N, C), target (N) i64, g (one element))
//                      attrs ignore_index, reduction (as cross_entropy), dtype (optional: the
//                      gradient's dtype, the logits' own or 16 bits for f32 logits)
//                      -> loss: 0-dim, logits' dtype    = cross_entropy(logits, target)[0]
//                         dlogits (N, C), dtype        = cross_entropy_backward(g, logits, target,
//                                                        lse).to(dtype)
//                      The classifier's loss and gradient from one read of the logits: the lse
//                      stays in the kernel, the f32 gradient is not stored when a 16-bit one is
//                      asked for. g must be ready when the loss is computed (a step's seed).
//   linear_cross_entropy_with_grad (x (N, C), w (C, K), bias (K) f32, target (N) i64, g (one f32))
//                      attrs ignore_index, reduction (as cross_entropy), dtype (optional). The
//                      operands' dtype T is x's (f32, bf16 or f16), or with dtype (16 bits) x is f32
//                      and xt = x.to(dtype) is what the GEMMs read; w is in T:
//                         logits (N, K) f32 = gemm_epilogue(xt, w, bias) in f32 (never stored)
//                      -> loss: 0-dim f32, dlogits (N, K) T = cross_entropy_with_grad(logits, target, g)
//                                                            with the gradient in T
//                         dx (N, C) T           = matmul(dlogits, w^T)
//                         [xt (N, C) T]         with dtype: the cast, which the weight gradient reads
//                      A classifier head whose GEMMs are too small to fill a GPU (ten classes over a
//                      pooled feature vector): the forward GEMM, the loss and its gradient, and the
//                      input's gradient in one kernel.
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

// The dtype reductions accumulate in (tensor/dtype.h's AccType) as a DType.
DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

std::vector<int64_t> attr_dims(const Attrs& a) { return a.has("dims") ? a.ints("dims") : std::vector<int64_t>{}; }

// Wraps and sorts the reduced dims, with a message that shows the input's shape.
std::vector<int64_t> checked_dims(OpKind op, const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = std::max<int64_t>(x.dim(), 1);
  for (int64_t d : dims)
    REEL_CHECK(d >= -n && d < n, op_name(op), ": dim ", d, " is out of range for an input of shape ",
               shape_str(x.shape()), " (expected ", -n, " to ", n - 1, ")");
  if (x.dim() == 0) return {};  // a 0-dim tensor has nothing to reduce; dim 0 / -1 are accepted as in PyTorch
  return wrap_dims(dims, x.dim(), op_name(op));
}

template <OpKind Op>
std::vector<TensorMeta> infer_reduce(const std::vector<Tensor>& in, const Attrs& a) {
  schema::expect_inputs(Op, in, 1);
  const Tensor& x = in[0];
  schema::expect_defined(Op, x, "input");
  if (Op == OpKind::Mean) schema::expect_float(Op, x);
  std::vector<int64_t> dims = checked_dims(Op, x, attr_dims(a));
  bool keepdim = a.b("keepdim", false);
  Shape shape;
  int64_t reduced = 1;
  for (int64_t d = 0, k = 0; d < x.dim(); ++d) {
    bool is_reduced = k < int64_t(dims.size()) && dims[k] == d;
    if (is_reduced) {
      ++k;
      reduced *= x.shape()[d];
      if (keepdim) shape.push_back(1);
    } else {
      shape.push_back(x.shape()[d]);
    }
  }
  if (Op == OpKind::Max)
    REEL_CHECK(reduced > 0, "max: cannot take the maximum of an empty selection (input shape ", shape_str(x.shape()),
               ", dims ", shape_str(attr_dims(a)), ")");
  return {{shape, x.dtype(), x.device()}};
}

template <OpKind Op>
std::vector<TensorMeta> infer_softmax(const std::vector<Tensor>& in, const Attrs& a) {
  schema::expect_inputs(Op, in, 1);
  schema::expect_defined(Op, in[0], "input");
  schema::expect_float(Op, in[0]);
  checked_dims(Op, in[0], {a.i("dim")});
  return {schema::meta_like(in[0])};
}

template <OpKind Op>
std::vector<TensorMeta> infer_softmax_backward(const std::vector<Tensor>& in, const Attrs& a) {
  schema::expect_inputs(Op, in, 2);
  schema::expect_defined(Op, in[0], "gradient");
  schema::expect_defined(Op, in[1], "output");
  schema::expect_float(Op, in[0], "gradient");
  schema::expect_same_dtype(Op, in[0], in[1]);
  REEL_CHECK(in[0].shape() == in[1].shape(), op_name(Op), ": gradient of shape ", shape_str(in[0].shape()),
             " does not match the forward output's shape ", shape_str(in[1].shape()));
  checked_dims(Op, in[1], {a.i("dim")});
  return {schema::meta_like(in[1])};
}

// target (N) i64 for logits (N, C), and the reduction attr.
void check_targets(OpKind op, const Shape& logits, const Tensor& target, const Attrs& a) {
  REEL_CHECK(target.dtype() == DType::i64, op_name(op), ": target must be i64 class indices, got ",
             schema::desc(target));
  REEL_CHECK(target.shape() == Shape{logits[0]}, op_name(op), ": target of shape ", shape_str(target.shape()),
             " does not match logits of shape ", shape_str(logits), " (expected (", logits[0], ",))");
  int64_t reduction = a.i("reduction", 0);
  REEL_CHECK(reduction == 0 || reduction == 1, op_name(op), ": reduction ", reduction, " is not 0 (mean) or 1 (sum)");
}

// Checks logits (N, C) float and target (N) i64 plus the attrs shared by cross_entropy and its backward.
void check_cross_entropy_args(OpKind op, const Tensor& logits, const Tensor& target, const Attrs& a) {
  schema::expect_defined(op, logits, "logits");
  schema::expect_defined(op, target, "target");
  schema::expect_float(op, logits, "logits");
  REEL_CHECK(logits.dim() == 2, op_name(op), ": logits must have 2 dims (N, C), got shape ",
             shape_str(logits.shape()));
  REEL_CHECK(logits.shape()[1] > 0, op_name(op), ": logits of shape ", shape_str(logits.shape()), " have no classes");
  check_targets(op, logits.shape(), target, a);
}

std::vector<TensorMeta> infer_cross_entropy(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::CrossEntropy;
  schema::expect_inputs(op, in, 2);
  check_cross_entropy_args(op, in[0], in[1], a);
  const Tensor& logits = in[0];
  return {{{}, logits.dtype(), logits.device()}, {{logits.shape()[0]}, acc_dtype(logits.dtype()), logits.device()}};
}

std::vector<TensorMeta> infer_cross_entropy_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::CrossEntropyBackward;
  schema::expect_inputs(op, in, 4);
  const Tensor &g = in[0], &logits = in[1], &lse = in[3];
  check_cross_entropy_args(op, logits, in[2], a);
  schema::expect_defined(op, g, "gradient");
  schema::expect_defined(op, lse, "lse");
  REEL_CHECK(g.numel() == 1 && g.dtype() == logits.dtype(), op_name(op), ": gradient must be a one-element ",
             dtype_name(logits.dtype()), " tensor, got ", schema::desc(g));
  REEL_CHECK(lse.shape() == Shape{logits.shape()[0]} && lse.dtype() == acc_dtype(logits.dtype()), op_name(op),
             ": lse must be (", logits.shape()[0], ",) ", dtype_name(acc_dtype(logits.dtype())), ", got ",
             schema::desc(lse));
  return {schema::meta_like(logits)};
}

std::vector<TensorMeta> infer_cross_entropy_with_grad(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::CrossEntropyWithGrad;
  schema::expect_inputs(op, in, 3);
  const Tensor &logits = in[0], &g = in[2];
  check_cross_entropy_args(op, logits, in[1], a);
  schema::expect_defined(op, g, "gradient");
  REEL_CHECK(g.numel() == 1 && g.dtype() == logits.dtype(), op_name(op), ": gradient must be a one-element ",
             dtype_name(logits.dtype()), " tensor, got ", schema::desc(g));
  const DType d = a.has("dtype") ? a.dtype("dtype") : logits.dtype();
  REEL_CHECK(d == logits.dtype() || (logits.dtype() == DType::f32 && (d == DType::bf16 || d == DType::f16)),
             op_name(op), ": the gradient's dtype ", dtype_name(d), " must be the logits' (", schema::desc(logits),
             ") or, for f32 logits, bf16 or f16");
  return {{{}, logits.dtype(), logits.device()}, {logits.shape(), d, logits.device()}};
}

std::vector<TensorMeta> infer_linear_cross_entropy_with_grad(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LinearCrossEntropyWithGrad;
  schema::expect_inputs(op, in, 5);
  const char* names[] = {"x", "w", "bias", "target", "gradient"};
  for (size_t i = 0; i < 5; ++i) schema::expect_defined(op, in[i], names[i]);
  const Tensor &x = in[0], &w = in[1], &bias = in[2], &g = in[4];
  schema::expect_ndim(op, x, 2, "x");
  schema::expect_ndim(op, w, 2, "w");
  const bool cast = a.has("dtype");
  const DType t = cast ? a.dtype("dtype") : x.dtype();
  REEL_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, op_name(op), ": x ", schema::desc(x),
             " must be f32, bf16 or f16");
  REEL_CHECK(!cast || (x.dtype() == DType::f32 && (t == DType::bf16 || t == DType::f16)), op_name(op), ": x ",
             schema::desc(x), " cast to ", dtype_name(t), ": only f32 x is cast, to bf16 or f16");
  REEL_CHECK(w.dtype() == t && w.size(0) == x.size(1), op_name(op), ": w ", schema::desc(w), " must be (", x.size(1),
             ", K) ", dtype_name(t), " for x ", schema::desc(x));
  const int64_t N = x.size(0), K = w.size(1);
  REEL_CHECK(bias.shape() == Shape{K} && bias.dtype() == DType::f32, op_name(op), ": bias ", schema::desc(bias),
             " must be (", K, ") f32");
  REEL_CHECK(K > 0, op_name(op), ": w ", schema::desc(w), " has no classes");
  check_targets(op, {N, K}, in[3], a);
  REEL_CHECK(g.numel() == 1 && g.dtype() == DType::f32, op_name(op),
             ": gradient must be a one-element f32 tensor, got ", schema::desc(g));
  std::vector<TensorMeta> out = {{{}, DType::f32, x.device()}, {{N, K}, t, x.device()}, {x.shape(), t, x.device()}};
  if (cast) out.push_back({x.shape(), t, x.device()});
  return out;
}

std::vector<TensorMeta> infer_global_norm(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::GlobalNorm;
  const bool check = a.b("check_finite", false);
  const size_t k = in.size() - (check && !in.empty() ? 1 : 0);  // the inputs normed
  REEL_CHECK(k >= 1, "global_norm: needs at least one input", check ? " besides found_inf" : "");
  for (size_t i = 0; i < k; ++i) {
    REEL_CHECK(in[i].defined(), "global_norm: input ", i, " is undefined");
    REEL_CHECK(in[i].dtype() == in[0].dtype(), "global_norm: input ", i, " is ", schema::desc(in[i]),
               " but input 0 is ", schema::desc(in[0]), " (all inputs must share one dtype)");
  }
  schema::expect_float(op, in[0]);
  std::vector<TensorMeta> out{{{}, acc_dtype(in[0].dtype()), in[0].device()}};
  if (check) {
    const Tensor& flag = in[k];
    schema::expect_defined(op, flag, "found_inf");
    schema::expect_flag(op, flag, "found_inf");
    out.push_back(schema::meta_like(flag));
  }
  return out;
}

}  // namespace

std::vector<TensorMeta> infer_column_sums(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::ColumnSums;
  const bool accumulate = a.b("accumulate", false);
  schema::expect_inputs(op, in, accumulate ? 2 : 1);
  schema::expect_defined(op, in[0], "x");
  const Tensor& x = in[0];
  REEL_CHECK(x.dim() >= 1 && (x.dtype() == DType::f32 || x.dtype() == DType::f16 || x.dtype() == DType::bf16),
             "column_sums: x ", schema::desc(x), " must be f32, f16 or bf16 with at least one dim");
  const Shape cols{x.shape().back()};
  if (accumulate)
    REEL_CHECK(in[1].defined() && in[1].shape() == cols && in[1].dtype() == DType::f32, "column_sums: the sums to add to ",
               in[1].defined() ? schema::desc(in[1]) : "(undefined)", " must be f32 of shape ", shape_str(cols));
  return {{cols, DType::f32, x.device()}};
}

// The results of a fused softmax: the f32 one when kept, the 16-bit copy when asked for.
std::vector<TensorMeta> softmax_results(OpKind op, const Tensor& like, const Attrs& a) {
  std::vector<TensorMeta> out;
  if (a.b("keep_f32", true)) out.push_back(schema::meta_like(like));
  if (a.has("dtype")) {
    const DType d = a.dtype("dtype");
    REEL_CHECK(d == DType::bf16 || d == DType::f16, op_name(op), ": dtype ", dtype_name(d), " must be bf16 or f16");
    out.push_back({like.shape(), d, like.device()});
  }
  REEL_CHECK(!out.empty(), op_name(op), ": keep_f32 is off and no 16-bit dtype is asked for: nothing to write");
  return out;
}

// x (..., T, C) and its (T, C) mask, both f32.
void expect_rows_and_mask(OpKind op, const Tensor& x, const Tensor& mask, const char* what) {
  schema::expect_defined(op, x, what);
  schema::expect_defined(op, mask, "mask");
  schema::expect_dtype(op, x, DType::f32, what);
  schema::expect_dtype(op, mask, DType::f32, "mask");
  REEL_CHECK(x.dim() >= 2 && mask.dim() == 2 && mask.size(0) == x.size(x.dim() - 2) && mask.size(1) == x.size(x.dim() - 1),
             op_name(op), ": mask ", schema::desc(mask), " must be (T, C) for ", what, " ", schema::desc(x),
             " of shape (..., T, C)");
}

std::vector<TensorMeta> infer_masked_softmax(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::MaskedSoftmax;
  schema::expect_inputs(op, in, 2);
  expect_rows_and_mask(op, in[0], in[1], "x");
  (void)a.f("value");
  return softmax_results(op, in[0], a);
}

std::vector<TensorMeta> infer_masked_softmax_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::MaskedSoftmaxBackward;
  schema::expect_inputs(op, in, 3);
  expect_rows_and_mask(op, in[1], in[2], "y");
  schema::expect_defined(op, in[0], "gradient");
  REEL_CHECK(in[0].shape() == in[1].shape() && in[0].dtype() == in[1].dtype(), "masked_softmax_backward: gradient ",
             schema::desc(in[0]), " does not match y ", schema::desc(in[1]));
  return softmax_results(op, in[1], a);
}

void register_reduce_schemas() {
  register_schema(OpKind::Sum, infer_reduce<OpKind::Sum>);
  register_schema(OpKind::Mean, infer_reduce<OpKind::Mean>);
  register_schema(OpKind::Max, infer_reduce<OpKind::Max>);
  register_schema(OpKind::Softmax, infer_softmax<OpKind::Softmax>);
  register_schema(OpKind::LogSoftmax, infer_softmax<OpKind::LogSoftmax>);
  register_schema(OpKind::SoftmaxBackward, infer_softmax_backward<OpKind::SoftmaxBackward>);
  register_schema(OpKind::LogSoftmaxBackward, infer_softmax_backward<OpKind::LogSoftmaxBackward>);
  register_schema(OpKind::CrossEntropy, infer_cross_entropy);
  register_schema(OpKind::CrossEntropyBackward, infer_cross_entropy_backward);
  register_schema(OpKind::CrossEntropyWithGrad, infer_cross_entropy_with_grad);
  register_schema(OpKind::LinearCrossEntropyWithGrad, infer_linear_cross_entropy_with_grad);
  register_schema(OpKind::GlobalNorm, infer_global_norm);
  register_schema(OpKind::ColumnSums, infer_column_sums);
  register_schema(OpKind::MaskedSoftmax, infer_masked_softmax);
  register_schema(OpKind::MaskedSoftmaxBackward, infer_masked_softmax_backward);
}

}  // namespace reel
