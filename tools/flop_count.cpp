// FLOPs of the product ops (see flop_count.h).
#include "tools/flop_count.h"

namespace reel::tools {

namespace {

// 2 numel(out) K: every output element a K-long dot product.
double gemm_flops(const Tensor& a, const Tensor& out) { return 2.0 * double(out.numel()) * double(a.shape().back()); }

// 2 numel(y) (C/g kH kW) for a weight (O, C/g, kH, kW).
double conv_flops(const Shape& weight, int64_t y_numel) {
  return 2.0 * double(y_numel) * double(weight[1] * weight[2] * weight[3]);
}

// The forward's 4 B H hd per visible pair = 4 B d pairs-per-sequence; qkv (B, T, 3d).
double attention_flops(const Tensor& qkv, const Attrs& attrs) {
  const double B = double(qkv.size(0)), T = double(qkv.size(1)), d = double(qkv.size(2) / 3);
  const double pairs = attrs.b("causal", true) ? T * (T + 1) / 2 : T * T;
  return 4.0 * B * d * pairs;
}

}  // namespace

double op_flops(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
  switch (op) {
    case OpKind::Matmul:
    case OpKind::MatmulInto:
    case OpKind::GemmEpilogue:
      return gemm_flops(in[0], out[0]);
    case OpKind::Conv2d:
      return conv_flops(in[1].shape(), out[0].numel());
    case OpKind::Conv2dBackwardInput:  // in: dy, weight
      return conv_flops(in[1].shape(), in[0].numel());
    case OpKind::Conv2dBackwardWeight:  // in: dy, x; attrs: the weight's shape
      return conv_flops(attrs.ints("weight_shape"), in[0].numel());
    case OpKind::Attention:
      return attention_flops(in[0], attrs);
    case OpKind::AttentionBackward:  // in: dy, qkv, y, lse
      return 2.0 * attention_flops(in[1], attrs);
    default:
      return 0.0;
  }
}

}  // namespace reel::tools
