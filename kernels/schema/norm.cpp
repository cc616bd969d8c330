// Schemas of the normalisation ops and dropout. Optional inputs are undefined Tensors; weight, bias and
// gradients share x's dtype (reel does not promote). Statistics (mean, rstd) are kept in the
// accumulation type: f32 for f32/f16/bf16 inputs, f64 for f64 — the norms stay f32 inside, as mixed
// precision needs. rstd = 1 / sqrt(var + eps), var biased (divided by the count).
//
//   layer_norm (x, w?, b?)                 attrs eps, normalized_ndim (k >= 1)
//       rows = prod x.shape[:-k], cols = prod x.shape[-k:]; w, b of shape x.shape[-k:]
//       -> y (x.shape), mean (x.shape[:-k]), rstd (x.shape[:-k])
//   layer_norm_backward (g, x, w?, mean, rstd)        k = x.dim() - mean.dim()
//       -> dx (x.shape), dw (x.shape[-k:]), db (x.shape[-k:]); without w, dw and db are the gradients
//          the affine parameters would get if they existed (w = 1): always computed, cheaply.
//   group_norm (x (N, C, *), w (C)?, b (C)?)       attrs groups (G, divides C), eps
//       -> y (x.shape), mean (N, G), rstd (N, G)
//   group_norm_backward (g, x, w?, mean, rstd)     attr groups  -> dx, dw (C), db (C)
//   batch_norm (x (N, C, *), w (C)?, b (C)?, running_mean (C)?, running_var (C)?)
//       attrs training, momentum, eps   -> y (x.shape), save_mean (C), save_rstd (C)
//       training: batch statistics; running stats (both or neither, any float dtype) are updated in
//       place by the kernel. eval: running stats required; save_* are running_mean, 1/sqrt(rv + eps).
//   batch_norm_backward (g, x, w?, save_mean, save_rstd)   attr training -> dx, dw (C), db (C)
//   group and batch norm, forward and backward, also take an optional attr dtype: the dtype of w, b,
//       g and the outputs. Absent, or x's own: the plain call. f32 with a bf16/f16 x: "a 16-bit x read
//       as its exact f32 widening", the bits of x.to(f32) through the f32 op. Eager autograd never
//       sets it; the compiler does, where a norm read autocast's f32 cast of a 16-bit convolution
//       result (compile/passes/read_norm_input_16bit.cpp), so the step keeps x in 16 bits for the backward.
//   group and batch norm's backward also take attr dx_dtype (bf16 | f16) with f32 outputs otherwise
//       (x's own f32, or a 16-bit x with dtype = f32): dx is written in that dtype, the f32 dx rounded
//       once, the bits of dx.to(dx_dtype). The compiler sets it where dx's one reader was that cast, the
//       16-bit gradient a convolution's backward reads (compile/passes/write_norm_grad_16bit.cpp).
//   group and batch norm's backward take g of their outputs' dtype d, or, with d = f32 and a 16-bit x,
//       of x's dtype: read as its exact f32 widening (a convolution's 16-bit input gradient).
//   group and batch norm with attr relu (fused activation, compile/passes/fuse_norm_relu.cpp):
//       y = relu(norm(x)), relu as the relu op computes it (NaN stays NaN); with attr cast_dtype
//       (bf16 | f16, outputs f32) also a 4th output y16 = y.to(cast_dtype), the 16-bit copy the next
//       convolution reads, of x's shape in any layout (channels-last on the GPU).
//       Their backward with attr relu takes a 6th input y, that relu's output (x's shape, dtype d), and
//       back-propagates relu_backward(g, y) = (y > 0 ? g : 0): the gradient at the norm's output.
//   group and batch norm's backward with attr accumulate (compile/passes/write_results_into_grads.cpp)
//       take two more inputs, last: the gradients dw and db are added to (their outputs' own memory),
//       each sum added as the add op adds it, rounded to d first: a later micro-batch's parameter
//       gradients accumulated by the backward itself.
//   group_norm with attr pool (compile/passes/fuse_norm_pool.cpp): one more output, last, pooled
//       (N, C) = mean(y, dims 2..): the global average pool of y (after the relu), with the mean op's
//       bits. x needs a spatial dim.
//   group_norm_backward with attr grad_scale (a finite number): g stands for g * grad_scale, the
//       product rounded to d as mul_scalar rounds it (before the relu's selection): a pool's
//       backward, whose 1/S the compiler folds in. Batch norm takes neither attr.
//   dropout (x[, state])                   attrs p in [0, 1], seed, offset (state: tensor/rng.h's PhiloxArgs)
//       -> y (x.shape), mask (x.shape, x's dtype, values 0 or 1/(1-p); all 0 when p == 1)
// Fused (the compiler writes them; kernels/ops.def):
//   layer_norm_cast (x, w?, b?[, addend[, state]])   attrs eps, normalized_ndim, dtype (bf16 | f16)
//       [, dropout_p, dropout_seed, dropout_offset, dropout_state]
//       -> y16 = layer_norm(s).to(dtype), mean, rstd[, s], s = x + addend (x alone without addend);
//          with the dropout attrs, s = x + addend * mask, mask as dropout_mask draws it over x's shape
//          (kernels/philox_args.h; state last when dropout_state). x f32; addend f32, or bf16/f16
//          without dropout, read as its exact f32 widening (s = x + addend.to(f32)): a GEMM's 16-bit
//          result, the residual branch (compile/passes/read_layer_norm_16bit.cpp). Without dropout the
//          addend may also have a suffix of x's shape covering the normalised dims, broadcast over the
//          leading ones (a position table added over the batch).
//   layer_norm_backward_add (g, x, w?, mean, rstd, residual?[, sums_in][, state])
//       attrs [dtype[, column_sums[, accumulate]]][, dropout_*]
//       g of x's dtype, or bf16/f16 with an f32 x, read as its exact f32 widening (a GEMM's 16-bit
//       input gradient: compile/passes/read_layer_norm_16bit.cpp)
//       -> out = layer_norm_backward(...).dx + residual (dx alone without a residual: a block's last
//          norm, whose 16-bit copy and column sums still join it), dw, db[, out16 = (out [* mask]).to(dtype)]
//          [, sums = column sums of out16 (+ sums_in with accumulate)]; the dropout mask (over x's
//          shape) applies to the 16-bit copy alone, so it needs dtype.
//   layer_norm_backward_partials (g, x, w?, mean, rstd, residual?[, state])
//       attrs parts (>= 1)[, dtype[, column_sums]][, dropout_*]
//       layer_norm_backward_add (without accumulate) whose sums are left in parts rows: x f32;
//       -> out, part (parts, S, cols) f32[, out16], S = 2 (3 with column_sums): part[p, 0] sums g xhat,
//          part[p, 1] g and part[p, 2] out16 (as f32) over the rows of part p, and the rows are dealt to
//          the parts eight at a time, row r to part (r / 8) % parts: the blocks of the GPU's
//          row-in-registers kernel, warp r % 8 of block (r / 8) % parts (kernels/cuda/layer_norm.cu).
//          cols = numel(w's shape) = x's last dim (normalized_ndim 1).
//   layer_norm_param_sums (part[, sums_in])        attrs [accumulate]
//       -> dw, db[, sums] (cols) f32: part's rows added up, dw[j] = sum over p of part[p, 0, j], db of
//          part[p, 1], sums of part[p, 2] (+ sums_in with accumulate: the output is sums_in itself);
//          the order of the adds is the CUDA finish kernel's: 32 running sums, p = t, t + 32, ... in
//          the t-th, then those 32 in order.
//   dropout_mask ([state])                 attrs shape, dtype, device_*, p, seed, offset
//       -> mask: dropout's mask alone, drawn by the same rule: the mask a dropout of x of this shape
//          and dtype with the same p, seed and offset makes (what a compiled plan draws again
//          where the mask is read, instead of storing it)
#include <cmath>

#include "kernels/philox_args.h"
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

DType stat_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// The dtype of a norm's parameters, incoming gradient and outputs: x's own, or f32 for a 16-bit x
// when attr dtype says f32 (group and batch norm; see the file comment). Anything else names both.
DType param_dtype(OpKind op, const Tensor& x, const Attrs& a) {
  if (!a.has("dtype")) return x.dtype();
  const DType d = a.dtype("dtype");
  const bool widened = d == DType::f32 && (x.dtype() == DType::bf16 || x.dtype() == DType::f16);
  REEL_CHECK(d == x.dtype() || widened, op_name(op), ": dtype ", dtype_name(d), " with x of dtype ",
             dtype_name(x.dtype()), ": x is read in its own dtype, or a bf16/f16 x as f32 (dtype f32)");
  return d;
}

// What a parameter or gradient of dtype d is expected to agree with, for the messages.
std::string expected_for(const Tensor& x, DType d) {
  if (d == x.dtype()) return std::string("x has dtype ") + dtype_name(x.dtype());
  return std::string("expected ") + dtype_name(d) + " for x of dtype " + dtype_name(x.dtype()) + " read as " +
         dtype_name(d) + " (attr dtype)";
}

// An optional per-feature parameter (weight or bias): dtype d (x's unless widened) and exactly `shape`.
void expect_param(OpKind op, const Tensor& p, const Tensor& x, const Shape& shape, const char* what,
                  DType d) {
  if (!p.defined()) return;
  REEL_CHECK(p.dtype() == d, op_name(op), ": ", what, " has dtype ", dtype_name(p.dtype()), " but ",
             expected_for(x, d), " (reel does not promote; cast one with .to(dtype))");
  REEL_CHECK(p.shape() == shape, op_name(op), ": ", what, " has shape ", shape_str(p.shape()), ", expected ",
             shape_str(shape), " for x of shape ", shape_str(x.shape()));
}
void expect_param(OpKind op, const Tensor& p, const Tensor& x, const Shape& shape, const char* what) {
  expect_param(op, p, x, shape, what, x.dtype());
}

// A saved statistic (mean or rstd) passed back to a backward op.
void expect_stat(OpKind op, const Tensor& s, const Tensor& x, const Shape& shape, const char* what) {
  schema::expect_defined(op, s, what);
  REEL_CHECK(s.dtype() == stat_dtype(x.dtype()), op_name(op), ": ", what, " has dtype ", dtype_name(s.dtype()),
             ", expected ", dtype_name(stat_dtype(x.dtype())), " for x of dtype ", dtype_name(x.dtype()));
  REEL_CHECK(s.shape() == shape, op_name(op), ": ", what, " has shape ", shape_str(s.shape()), ", expected ",
             shape_str(shape), " for x of shape ", shape_str(x.shape()));
}

void expect_x(OpKind op, const Tensor& x) {
  schema::expect_defined(op, x, "x");
  schema::expect_float(op, x, "x");
}

// Group and batch norm's backward: g of dtype d, or of a 16-bit x's own dtype when d = f32 (read as
// its f32 widening).
void expect_norm_grad(OpKind op, const Tensor& g, const Tensor& x, DType d) {
  schema::expect_defined(op, g, "gradient");
  const bool wide_g =
      d == DType::f32 && (x.dtype() == DType::bf16 || x.dtype() == DType::f16) && g.dtype() == x.dtype();
  REEL_CHECK(g.shape() == x.shape() && (g.dtype() == d || wide_g), op_name(op), ": gradient ", schema::desc(g),
             " does not match x ", schema::desc(x),
             d == x.dtype() ? "" : " read as f32 (attr dtype f32; the gradient f32 or x's own dtype)");
}

// The fused relu's attrs of a group or batch norm (d: its outputs' dtype): the forward's 16-bit copy
// of y (attr cast_dtype), appended to `out`; the backward's input y (in[5], with attr relu).
void expect_norm_relu_forward(OpKind op, const Tensor& x, const Attrs& a, DType d, std::vector<TensorMeta>& out) {
  if (!a.has("cast_dtype")) return;
  const DType cast = a.dtype("cast_dtype");
  REEL_CHECK((cast == DType::bf16 || cast == DType::f16) && d == DType::f32, op_name(op), ": cast_dtype ",
             dtype_name(cast), " with y of dtype ", dtype_name(d), ": the copy of y is bf16/f16 of an f32 y");
  out.push_back({x.shape(), cast, x.device()});
}
void expect_norm_relu_backward(OpKind op, const std::vector<Tensor>& in, const Tensor& x, const Attrs& a, DType d) {
  const bool relu = a.b("relu", false), accumulate = a.b("accumulate", false);
  const size_t want = 5 + (relu ? 1 : 0) + (accumulate ? 2 : 0);
  REEL_CHECK(
      in.size() == want, op_name(op), " takes g, x, w, mean, rstd", relu ? ", (attr relu) the relu's output y" : "",
      accumulate ? ", (attr accumulate) the gradients dw and db add to" : "", ": ", want, " inputs, got ", in.size());
  if (accumulate) {
    for (size_t k = want - 2; k < want; ++k) {
      schema::expect_defined(op, in[k], k == want - 2 ? "accumulated dw" : "accumulated db");
      REEL_CHECK(in[k].shape() == Shape{x.shape()[1]} && in[k].dtype() == d, op_name(op), ": accumulated ",
                 k == want - 2 ? "dw " : "db ", schema::desc(in[k]), " must be (", x.shape()[1], ") ", dtype_name(d));
    }
  }
  if (!relu) return;
  const Tensor& y = in[5];
  schema::expect_defined(op, y, "relu output y");
  REEL_CHECK(y.shape() == x.shape() && y.dtype() == d, op_name(op), ": relu output y ", schema::desc(y),
             " must have x's shape ", shape_str(x.shape()), " and dtype ", dtype_name(d));
}

// Layer norm's backward: g of x's shape and dtype.
void expect_grad_like_x(OpKind op, const Tensor& g, const Tensor& x) {
  schema::expect_defined(op, g, "gradient");
  REEL_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), op_name(op), ": gradient ", schema::desc(g),
             " does not match x ", schema::desc(x));
}

// x (N, C, *) for group and batch norm.
void expect_channels(OpKind op, const Tensor& x) {
  REEL_CHECK(x.dim() >= 2, op_name(op), ": x must have shape (N, C, *) with at least 2 dims, got ",
             shape_str(x.shape()));
}

std::vector<TensorMeta> infer_layer_norm(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LayerNorm;
  schema::expect_inputs(op, in, 3);
  const Tensor& x = in[0];
  expect_x(op, x);
  int64_t k = a.i("normalized_ndim");
  REEL_CHECK(k >= 1 && k <= x.dim(), "layer_norm: normalized_ndim ", k, " must be in [1, ", x.dim(),
             "] for x of shape ", shape_str(x.shape()));
  REEL_CHECK(a.f("eps") >= 0, "layer_norm: eps must be >= 0, got ", a.f("eps"));
  Shape lead(x.shape().begin(), x.shape().end() - k), normalized(x.shape().end() - k, x.shape().end());
  expect_param(op, in[1], x, normalized, "weight");
  expect_param(op, in[2], x, normalized, "bias");
  DType st = stat_dtype(x.dtype());
  return {schema::meta_like(x), {lead, st, x.device()}, {lead, st, x.device()}};
}

std::vector<TensorMeta> infer_layer_norm_backward(const std::vector<Tensor>& in, const Attrs&) {
  constexpr OpKind op = OpKind::LayerNormBackward;
  schema::expect_inputs(op, in, 5);
  const Tensor& x = in[1];
  expect_x(op, x);
  expect_grad_like_x(op, in[0], x);
  schema::expect_defined(op, in[3], "mean");
  int64_t k = x.dim() - in[3].dim();
  REEL_CHECK(k >= 1, "layer_norm_backward: mean of shape ", shape_str(in[3].shape()),
             " must have fewer dims than x of shape ", shape_str(x.shape()));
  Shape lead(x.shape().begin(), x.shape().end() - k), normalized(x.shape().end() - k, x.shape().end());
  expect_param(op, in[2], x, normalized, "weight");
  expect_stat(op, in[3], x, lead, "mean");
  expect_stat(op, in[4], x, lead, "rstd");
  return {schema::meta_like(x), {normalized, x.dtype(), x.device()}, {normalized, x.dtype(), x.device()}};
}

// A fused op's dropout attrs (kernels/philox_args.h): p in [0, 1], seed and offset, and the state, when
// dropout_state says there is one, as the last input.
void expect_fused_dropout(OpKind op, const std::vector<Tensor>& in, const Attrs& a, Device device) {
  const double p = a.f("dropout_p");
  REEL_CHECK(p >= 0 && p <= 1, op_name(op), ": dropout probability must be in [0, 1], got ", p);
  a.i("dropout_seed");
  a.i("dropout_offset");
  if (a.b("dropout_state", false)) {
    REEL_CHECK(in.back().defined(), op_name(op), ": dropout_state is set but the last input is undefined");
    schema::expect_philox_state(op, in, in.size() - 1, device);
  }
}

// A 16-bit dtype attr (the fused ops' casts for the next GEMM).
DType cast_dtype(OpKind op, const Attrs& a) {
  const DType d = a.dtype("dtype");
  REEL_CHECK(d == DType::bf16 || d == DType::f16, op_name(op), ": dtype ", dtype_name(d),
             " must be bf16 or f16 (the 16-bit copy for a GEMM)");
  return d;
}

std::vector<TensorMeta> infer_layer_norm_cast(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LayerNormCast;
  const bool dropout = has_fused_dropout(a), state = a.b("dropout_state", false);
  REEL_ASSERT(in.size() == 3 || in.size() == 4 || (state && in.size() == 5), "layer_norm_cast takes 3 or 4 inputs",
              state ? " and its Philox state" : "", ", got ", in.size());
  const Tensor& x = in[0];
  schema::expect_defined(op, x, "x");
  schema::expect_dtype(op, x, DType::f32, "x");
  const DType d = cast_dtype(op, a);
  std::vector<TensorMeta> out = infer_layer_norm({x, in[1], in[2]}, a);
  out[0].dtype = d;
  if (in.size() >= 4 && in[3].defined()) {
    const Tensor& addend = in[3];
    const DType ad = addend.dtype();
    int64_t ones = 0;  // leading 1s, which broadcast
    while (ones < addend.dim() && addend.shape()[size_t(ones)] == 1) ++ones;
    const bool suffix = addend.dim() <= x.dim() && is_trailing_suffix(addend.shape(), x.shape()) &&
                        addend.dim() - ones >= a.i("normalized_ndim");
    REEL_CHECK(suffix && (ad == DType::f32 || ad == DType::bf16 || ad == DType::f16), "layer_norm_cast: addend ",
               schema::desc(addend), " must be f32 (or bf16/f16) of x's shape ", shape_str(x.shape()),
               " or of a suffix of it that covers the normalised dims (broadcast over the rest)");
    REEL_CHECK(!dropout || (ad == DType::f32 && addend.shape() == x.shape()), "layer_norm_cast: addend ",
               schema::desc(addend), " with dropout: a dropped addend must be f32 of x's shape ", shape_str(x.shape()));
    out.push_back(schema::meta_like(x));
  }
  REEL_CHECK(!dropout || (in.size() >= 4 && in[3].defined()), "layer_norm_cast: dropout applies to the addend, and there is none");
  if (dropout) expect_fused_dropout(op, in, a, x.device());
  return out;
}

std::vector<TensorMeta> infer_layer_norm_backward_add(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LayerNormBackwardAdd;
  const bool sums = a.b("column_sums", false), accumulate = a.b("accumulate", false);
  const size_t inputs = (accumulate ? 7 : 6) + (a.b("dropout_state", false) ? 1 : 0);
  REEL_ASSERT(in.size() == inputs, "layer_norm_backward_add takes ", inputs, " inputs, got ", in.size());
  const Tensor &g = in[0], &x = in[1], &r = in[5];
  // A 16-bit g with an f32 x is read as its exact widening: checked here, then x stands in for it
  // (shape and dtype) in the plain op's checks.
  const bool wide_g =
      g.defined() && x.defined() && x.dtype() == DType::f32 && (g.dtype() == DType::bf16 || g.dtype() == DType::f16);
  if (wide_g)
    REEL_CHECK(g.shape() == x.shape(), "layer_norm_backward_add: gradient ", schema::desc(g), " does not match x ",
               schema::desc(x));
  std::vector<TensorMeta> out = infer_layer_norm_backward({wide_g ? x : g, in[1], in[2], in[3], in[4]}, a);
  REEL_CHECK(!r.defined() || (r.shape() == x.shape() && r.dtype() == x.dtype()), "layer_norm_backward_add: residual ",
             schema::desc(r), " must match x ", schema::desc(x));
  if (a.has("dtype")) out.push_back({x.shape(), cast_dtype(op, a), x.device()});
  if (sums) {
    REEL_CHECK(a.has("dtype"), "layer_norm_backward_add: column_sums sums the 16-bit copy, which needs a dtype attr");
    const Shape cols{numel_of(out[1].shape)};
    if (accumulate)
      REEL_CHECK(in[6].defined() && in[6].shape() == cols && in[6].dtype() == DType::f32,
                 "layer_norm_backward_add: the sums to add to ", in[6].defined() ? schema::desc(in[6]) : "(undefined)",
                 " must be f32 of shape ", shape_str(cols));
    out.push_back({cols, DType::f32, x.device()});
  }
  REEL_CHECK(!accumulate || sums, "layer_norm_backward_add: accumulate adds column sums, which need column_sums");
  if (has_fused_dropout(a)) {
    REEL_CHECK(a.has("dtype"), "layer_norm_backward_add: dropout applies to the 16-bit copy, which needs a dtype attr");
    expect_fused_dropout(op, in, a, x.device());
  }
  return out;
}

std::vector<TensorMeta> infer_layer_norm_backward_partials(const std::vector<Tensor>& in, const Attrs& a) {
  const int64_t parts = a.i("parts");
  REEL_CHECK(parts >= 1, "layer_norm_backward_partials: parts must be >= 1, got ", parts);
  REEL_CHECK(!a.b("accumulate", false),
             "layer_norm_backward_partials: accumulate belongs to layer_norm_param_sums, which adds the column sums up");
  const size_t inputs = 6 + (a.b("dropout_state", false) ? 1 : 0);
  REEL_CHECK(in.size() == inputs, "layer_norm_backward_partials takes ", inputs,
             " inputs (g, x, w?, mean, rstd, residual?[, dropout state]), got ", in.size());
  REEL_CHECK(in[1].defined() && in[1].dtype() == DType::f32, "layer_norm_backward_partials: x ",
             in[1].defined() ? schema::desc(in[1]) : std::string("(none)"), " must be f32 (its partial sums are f32)");
  // The norm's own checks are layer_norm_backward_add's: its messages, named as this op's.
  std::vector<TensorMeta> full;
  try {
    full = infer_layer_norm_backward_add(in, a);
  } catch (const Error& e) {
    throw Error(detail::cat("layer_norm_backward_partials (as layer_norm_backward_add): ", e.what()));
  }
  REEL_CHECK(full[1].shape.size() == 1, "layer_norm_backward_partials: the normalised shape ",
             shape_str(full[1].shape), " must be one dim (x's last)");
  const int64_t cols = full[1].shape[0], sums = a.b("column_sums", false) ? 3 : 2;
  std::vector<TensorMeta> out{full[0], {{parts, sums, cols}, DType::f32, full[0].device}};
  if (a.has("dtype")) out.push_back(full[3]);
  return out;
}

std::vector<TensorMeta> infer_layer_norm_param_sums(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LayerNormParamSums;
  const bool accumulate = a.b("accumulate", false);
  schema::expect_inputs(op, in, accumulate ? 2 : 1);
  const Tensor& part = in[0];
  REEL_CHECK(part.defined() && part.dim() == 3 && part.dtype() == DType::f32 && part.shape()[0] >= 1 &&
                 (part.shape()[1] == 2 || part.shape()[1] == 3),
             "layer_norm_param_sums: partials ", part.defined() ? schema::desc(part) : std::string("(none)"),
             " must be f32 (parts, 2 or 3, cols) with parts >= 1");
  const int64_t cols = part.shape()[2];
  const bool sums = part.shape()[1] == 3;
  REEL_CHECK(!accumulate || sums, "layer_norm_param_sums: accumulate adds to the column sums, and partials ",
             schema::desc(part), " have none (2 rows a part)");
  if (accumulate)
    REEL_CHECK(in[1].defined() && in[1].shape() == Shape{cols} && in[1].dtype() == DType::f32,
               "layer_norm_param_sums: the sums to add to ", in[1].defined() ? schema::desc(in[1]) : "(undefined)",
               " must be f32 of shape ", shape_str({cols}));
  std::vector<TensorMeta> out(sums ? 3 : 2, TensorMeta{{cols}, DType::f32, part.device()});
  return out;
}

int64_t checked_groups(OpKind op, const Tensor& x, const Attrs& a) {
  int64_t groups = a.i("groups"), C = x.shape()[1];
  REEL_CHECK(groups >= 1, op_name(op), ": groups must be >= 1, got ", groups);
  REEL_CHECK(C % groups == 0, op_name(op), ": channels ", C, " of x ", shape_str(x.shape()),
             " are not divisible by groups ", groups);
  return groups;
}

std::vector<TensorMeta> infer_group_norm(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::GroupNorm;
  schema::expect_inputs(op, in, 3);
  const Tensor& x = in[0];
  expect_x(op, x);
  expect_channels(op, x);
  int64_t G = checked_groups(op, x, a);
  REEL_CHECK(a.f("eps") >= 0, "group_norm: eps must be >= 0, got ", a.f("eps"));
  const DType d = param_dtype(op, x, a);
  expect_param(op, in[1], x, {x.shape()[1]}, "weight", d);
  expect_param(op, in[2], x, {x.shape()[1]}, "bias", d);
  DType st = stat_dtype(x.dtype());
  Shape stats{x.shape()[0], G};
  std::vector<TensorMeta> out{{x.shape(), d, x.device()}, {stats, st, x.device()}, {stats, st, x.device()}};
  expect_norm_relu_forward(op, x, a, d, out);
  if (a.b("pool", false)) {
    REEL_CHECK(x.dim() >= 3, "group_norm: attr pool (the mean over the spatial dims) needs x (N, C, *spatial), got x ",
               schema::desc(x));
    out.push_back({{x.shape()[0], x.shape()[1]}, d, x.device()});
  }
  return out;
}

// Attrs only group norm's kernels take (see the top): refused by batch norm with the op named.
void expect_no_group_norm_only_attrs(OpKind op, const Attrs& a) {
  for (const char* name : {"pool", "grad_scale"})
    REEL_CHECK(!a.has(name), op_name(op), ": attr ", name, " is not supported (group_norm and its backward take it)");
}

// The dtype of a group or batch norm's dx: d (the outputs' dtype), or attr dx_dtype, 16 bits from f32.
DType dx_dtype_of(OpKind op, const Attrs& a, DType d) {
  if (!a.has("dx_dtype")) return d;
  const DType dx = a.dtype("dx_dtype");
  REEL_CHECK((dx == DType::bf16 || dx == DType::f16) && d == DType::f32, op_name(op), ": dx_dtype ", dtype_name(dx),
             " with outputs of dtype ", dtype_name(d), ": dx is written in bf16/f16 only, from an f32 computation");
  return dx;
}

std::vector<TensorMeta> infer_group_norm_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::GroupNormBackward;
  REEL_ASSERT(in.size() >= 2, "group_norm_backward takes at least g and x, got ", in.size(), " inputs");
  const Tensor& x = in[1];
  expect_x(op, x);
  expect_channels(op, x);
  const DType d = param_dtype(op, x, a);
  expect_norm_relu_backward(op, in, x, a, d);
  expect_norm_grad(op, in[0], x, d);
  if (a.has("grad_scale"))
    REEL_CHECK(std::isfinite(a.f("grad_scale")), "group_norm_backward: attr grad_scale must be finite, got ",
               a.f("grad_scale"));
  int64_t G = checked_groups(op, x, a);
  Shape channels{x.shape()[1]};
  expect_param(op, in[2], x, channels, "weight", d);
  expect_stat(op, in[3], x, {x.shape()[0], G}, "mean");
  expect_stat(op, in[4], x, {x.shape()[0], G}, "rstd");
  return {{x.shape(), dx_dtype_of(op, a, d), x.device()}, {channels, d, x.device()}, {channels, d, x.device()}};
}

void expect_running_stat(const Tensor& r, const Tensor& x, const char* what) {
  if (!r.defined()) return;
  REEL_CHECK(is_floating(r.dtype()), "batch_norm: ", what, " must be a float tensor, got ", dtype_name(r.dtype()));
  Shape channels{x.shape()[1]};
  REEL_CHECK(r.shape() == channels, "batch_norm: ", what, " has shape ", shape_str(r.shape()), ", expected ",
             shape_str(channels), " for x of shape ", shape_str(x.shape()));
}

std::vector<TensorMeta> infer_batch_norm(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::BatchNorm;
  schema::expect_inputs(op, in, 5);
  expect_no_group_norm_only_attrs(op, a);
  const Tensor& x = in[0];
  expect_x(op, x);
  expect_channels(op, x);
  Shape channels{x.shape()[1]};
  const DType d = param_dtype(op, x, a);
  expect_param(op, in[1], x, channels, "weight", d);
  expect_param(op, in[2], x, channels, "bias", d);
  const Tensor &rm = in[3], &rv = in[4];
  REEL_CHECK(rm.defined() == rv.defined(), "batch_norm: running_mean and running_var must be given together (got ",
             rm.defined() ? "running_mean" : "running_var", " only)");
  expect_running_stat(rm, x, "running_mean");
  expect_running_stat(rv, x, "running_var");
  REEL_CHECK(a.f("eps") >= 0, "batch_norm: eps must be >= 0, got ", a.f("eps"));
  if (a.b("training")) {
    // Matches PyTorch: one value per channel has no variance to normalise by.
    REEL_CHECK(x.numel() / x.shape()[1] != 1, "batch_norm: expected more than 1 value per channel when training, ",
               "got x of shape ", shape_str(x.shape()));
    double m = a.f("momentum");
    REEL_CHECK(m >= 0 && m <= 1, "batch_norm: momentum must be in [0, 1], got ", m);
  } else {
    REEL_CHECK(rm.defined(), "batch_norm: eval mode (training=false) needs running_mean and running_var, got none");
  }
  DType st = stat_dtype(x.dtype());
  std::vector<TensorMeta> out{{x.shape(), d, x.device()}, {channels, st, x.device()}, {channels, st, x.device()}};
  expect_norm_relu_forward(op, x, a, d, out);
  return out;
}

std::vector<TensorMeta> infer_batch_norm_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::BatchNormBackward;
  REEL_ASSERT(in.size() >= 2, "batch_norm_backward takes at least g and x, got ", in.size(), " inputs");
  expect_no_group_norm_only_attrs(op, a);
  const Tensor& x = in[1];
  expect_x(op, x);
  expect_channels(op, x);
  const DType d = param_dtype(op, x, a);
  expect_norm_relu_backward(op, in, x, a, d);
  expect_norm_grad(op, in[0], x, d);
  Shape channels{x.shape()[1]};
  expect_param(op, in[2], x, channels, "weight", d);
  expect_stat(op, in[3], x, channels, "save_mean");
  expect_stat(op, in[4], x, channels, "save_rstd");
  return {{x.shape(), dx_dtype_of(op, a, d), x.device()}, {channels, d, x.device()}, {channels, d, x.device()}};
}

std::vector<TensorMeta> infer_dropout(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::Dropout;
  REEL_ASSERT(in.size() == 1 || in.size() == 2, "dropout takes x and an optional Philox state, got ", in.size(),
              " inputs");
  expect_x(op, in[0]);
  schema::expect_philox_state(op, in, 1, in[0].device());
  double p = a.f("p");
  REEL_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got ", p);
  a.i("seed");  // both are required: a missing one throws here, naming the attr
  a.i("offset");
  return {schema::meta_like(in[0]), schema::meta_like(in[0])};
}

std::vector<TensorMeta> infer_dropout_mask(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::DropoutMask;
  REEL_ASSERT(in.size() <= 1, "dropout_mask takes only an optional Philox state, got ", in.size(), " inputs");
  const std::vector<int64_t>& dims = a.ints("shape");
  const Shape shape(dims.begin(), dims.end());
  const DType dtype = a.dtype("dtype");
  REEL_CHECK(is_floating(dtype), "dropout_mask: dtype must be a float type, got ", dtype_name(dtype));
  const Device device = schema::attr_device(a);
  schema::expect_philox_state(op, in, 0, device);
  const double p = a.f("p");
  REEL_CHECK(p >= 0 && p <= 1, "dropout_mask: probability p must be in [0, 1], got ", p);
  a.i("seed");
  a.i("offset");
  return {{shape, dtype, device}};
}

}  // namespace

void register_norm_schemas() {
  register_schema(OpKind::LayerNorm, infer_layer_norm);
  register_schema(OpKind::LayerNormBackward, infer_layer_norm_backward);
  register_schema(OpKind::GroupNorm, infer_group_norm);
  register_schema(OpKind::GroupNormBackward, infer_group_norm_backward);
  register_schema(OpKind::BatchNorm, infer_batch_norm);
  register_schema(OpKind::BatchNormBackward, infer_batch_norm_backward);
  register_schema(OpKind::Dropout, infer_dropout);
  register_schema(OpKind::DropoutMask, infer_dropout_mask);
  register_schema(OpKind::LayerNormCast, infer_layer_norm_cast);
  register_schema(OpKind::LayerNormBackwardAdd, infer_layer_norm_backward_add);
  register_schema(OpKind::LayerNormBackwardPartials, infer_layer_norm_backward_partials);
  register_schema(OpKind::LayerNormParamSums, infer_layer_norm_param_sums);
}

}  // namespace reel
