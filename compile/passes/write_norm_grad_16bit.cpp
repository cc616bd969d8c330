// Batch- and group-norm backward writing the 16-bit gradient its convolution reads. Under autocast
// the convolution before such a norm takes its incoming gradient in 16 bits, so the backward is
//   dx, dw, db = batch_norm_backward(g, x, w, mean, rstd)      (dx f32; group_norm_backward alike)
//   dx16 = copy(dx) to bf16/f16 (channels-last on the GPU)     ... conv2d_backward_input(dx16, ...)
// and dx, 4 bytes an element, is written once and read once, by the cast. The norm can round dx
// itself (attr dx_dtype, kernels/schema/norm.cpp) and write it straight into dx16's buffer in
// dx16's layout: one kernel and one f32 buffer fewer per norm and micro-batch. Rounding the same f32
// value once gives the same bits, on the CPU (the f32 kernel, then the copy kernel) and on the GPU
// (the dx kernel rounds what it would have stored).
// Applies where dx is an Internal buffer that only the cast reads (all of it, once), the cast writes
// a 16-bit dense buffer (contiguous or channels-last) of dx's shape written nowhere else, the norm's
// other outputs are f32, and the device takes the rewritten call (call_supported); otherwise
// REEL_LOG=fusion says why. Runs after norm_16bit_input, before elementwise fusion.
#include <string>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "norm_grad_16bit";

// The cast reading all of dx once, or -1 with the reason in `why`.
int grad_cast(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const TensorRef& dx = g.nodes[i].outputs[0];
  const int k = sole_reader(g, u, dx);
  if (!why(k >= 0 && g.buffers[dx.buffer].kind == BufferKind::Internal, "dx has other readers or is a result"))
    return -1;
  const Node& c = g.nodes[size_t(k)];
  if (!why(c.op == OpKind::Copy && !c.in_place && c.inputs.size() == 1 && c.inputs[0] && same_ref(*c.inputs[0], dx),
           std::string("dx is read by ") + op_name(c.op) + ", not by a cast of all of it"))
    return -1;
  const TensorRef& out = c.outputs[0];
  if (!why(is_16bit(out.dtype) && dx.dtype == DType::f32, "the cast is not f32 to bf16/f16") ||
      !why(out.shape == dx.shape && internal_once(g, u, out) && is_dense(out),
           "the cast writes a strided view or a buffer written elsewhere too") ||
      !why(g.buffers[out.buffer].device == g.buffers[dx.buffer].device, "the cast moves dx to another device"))
    return -1;
  return k;
}

}  // namespace

void write_norm_grad_16bit(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Node& n = g.nodes[i];
    if ((n.op != OpKind::BatchNormBackward && n.op != OpKind::GroupNormBackward) || n.attrs.has("dx_dtype") ||
        n.outputs[0].dtype != DType::f32)
      return;
    Why why;
    const int k = grad_cast(g, u, i, why);
    if (k < 0 || drop[size_t(k)]) return why_not(kPass, g, i, "the cast of dx", why.reason());
    Node m = n;
    m.outputs[0] = g.nodes[size_t(k)].outputs[0];
    m.attrs.set("dx_dtype", m.outputs[0].dtype);
    if (m.fused.empty()) m.fused.push_back(op_name(n.op));
    m.fused.push_back("copy");
    if (!call_supported(g, m))
      return why_not(kPass, g, i, "the cast of dx",
                     std::string("the device's ") + op_name(n.op) + " does not write this dx");
    g.nodes[i] = std::move(m);
    drop[size_t(k)] = true;
    stats.fused += 1;
  });
}

}  // namespace reel::compile
