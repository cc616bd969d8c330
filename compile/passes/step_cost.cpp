// Step cost (see step_cost.h).
#include "compile/passes/step_cost.h"

#include <algorithm>

namespace reel::compile {

namespace {

// Round figures (see step_cost.h): dense rates in FLOP/s by dtype, bandwidth in bytes/s, launch in s.
struct DeviceRates {
  double r16, r32, r64, bandwidth, launch_eager, launch_replayed;
};

DeviceRates rates_for(Device device) {
  if (device.is_cuda()) return {600e12, 50e12, 25e12, 3.5e12, 6e-6, 2e-6};
  return {100e9, 100e9, 50e9, 20e9, 2e-6, 1e-6};
}

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

}  // namespace

double node_flops(const Node& n) {
  if (n.outputs.empty()) return 0;
  auto numel = [](const TensorRef& r) { return double(numel_of(r.shape)); };
  const double out = numel(n.outputs[0]);
  switch (n.op) {
    case OpKind::Matmul: case OpKind::GemmEpilogue: case OpKind::MatmulInto:
      if (!n.inputs.empty() && n.inputs[0] && !n.inputs[0]->shape.empty())
        return 2.0 * out * double(n.inputs[0]->shape.back());
      break;
    case OpKind::Conv2d:
      if (n.inputs.size() > 1 && n.inputs[1] && n.inputs[1]->shape.size() == 4) {
        const Shape& w = n.inputs[1]->shape;  // (C_out, C_in / groups, kh, kw)
        return 2.0 * out * double(w[1] * w[2] * w[3]);
      }
      break;
    case OpKind::Conv2dBackwardInput: case OpKind::Conv2dBackwardWeight:
      // As many multiply-adds as the forward: each of g's elements meets a (C/G, kh, kw) patch.
      if (!n.inputs.empty() && n.inputs[0]) {
        const Shape& w = n.op == OpKind::Conv2dBackwardWeight ? n.outputs[0].shape
                         : n.inputs.size() > 1 && n.inputs[1] ? n.inputs[1]->shape : Shape{};
        if (w.size() == 4) return 2.0 * numel(*n.inputs[0]) * double(w[1] * w[2] * w[3]);
      }
      break;
    case OpKind::Attention: case OpKind::AttentionCast:
    case OpKind::AttentionBackward: case OpKind::AttentionBackwardCast: {
      // qkv (B, T, 3d): the forward's first input, the backward's second.
      const bool backward = n.op == OpKind::AttentionBackward || n.op == OpKind::AttentionBackwardCast;
      const size_t at = backward ? 1 : 0;
      if (n.inputs.size() > at && n.inputs[at] && n.inputs[at]->shape.size() == 3) {
        const Shape& qkv = n.inputs[at]->shape;
        const double forward = 4.0 * double(qkv[0]) * double(qkv[1]) * double(qkv[1]) * double(qkv[2] / 3);
        // The backward computes the scores again and takes four products where the forward takes two.
        return backward ? 2.5 * forward : forward;
      }
      break;
    }
    default: break;
  }
  double all = 0;
  for (const TensorRef& o : n.outputs) all += numel(o);
  return all;
}

double graph_flops(const Graph& g) {
  double total = 0;
  for (const Node& n : g.nodes) total += node_flops(n);
  return total;
}

double estimate_seconds(const Graph& g, Device device, Launch launch) {
  const DeviceRates r = rates_for(device);
  const double start = launch == Launch::Eager ? r.launch_eager : r.launch_replayed;
  double total = 0;
  for (const Node& n : g.nodes) {
    double bytes = 0;
    DType widest = DType::bf16;
    for (const auto& in : n.inputs)
      if (in) {
        bytes += double(in->nbytes());
        if (!is_16bit(in->dtype)) widest = in->dtype;
      }
    for (const TensorRef& o : n.outputs) bytes += double(o.nbytes());
    // A GEMM or convolution reading 16-bit operands runs on the 16-bit tensor cores whatever it writes.
    DType operand = n.inputs.empty() || !n.inputs[0] ? widest : n.inputs[0]->dtype;
    const double rate = is_16bit(operand) ? r.r16 : operand == DType::f64 ? r.r64 : r.r32;
    total += std::max(node_flops(n) / rate, bytes / r.bandwidth) + start;
  }
  return total;
}

}  // namespace reel::compile
