// Batch and group norm with the relu after them, forward and backward: a ResNet-style block's
//   forward:  y, mean, rstd = batch_norm(x, w, b, ...)      r = relu(y)
//             r16 = copy(r) to bf16/f16                      (autocast's input of the next convolution,
//                                                             channels-last on the GPU)
//   backward: g = copy(dr16) to f32                         (the convolution's 16-bit input gradient)
//             gr = relu_backward(g, r)
//             dx, dw, db = batch_norm_backward(gr, x, w, mean, rstd)
// (group_norm alike). On the GPU each of relu, the cast and relu_backward is a kernel of its own per
// norm and micro-batch (the cast transposes into channels-last, which the elementwise fuser's
// contiguous kernels do not write), each moving the whole activation once more.
// Forward: where the relu is y's only reader, the norm writes r itself (attr relu) and y goes; where
// a reader of r is a 16-bit cast of all of it into a dense buffer (contiguous or channels-last) that
// nothing touches before, the norm also writes that copy (attr cast_dtype, its 4th output) and the
// cast goes. Backward: where relu_backward's result is the norm backward's g and read nowhere else,
// the norm backward reads relu_backward's operands instead (attr relu, r as its 6th input) and
// computes it as it loads g; where the incoming gradient is a widening cast of a 16-bit tensor of x's
// dtype that only relu_backward reads, the norm reads the 16-bit tensor (a g of x's dtype,
// kernels/schema/norm.cpp) and the cast goes too. The norm's kernels compute the same relu, rounding
// and selection as the ops they replace: the same bits (tests/test_compile_norm_relu.cpp).
// Runs after norm_16bit_input and norm_grad_16bit (which make the norms read a 16-bit x and write a
// 16-bit dx) and before elementwise fusion, which would otherwise take the relu and the casts.
#include <string>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "norm_relu";

bool is_norm_forward(const Node& n) {
  return (n.op == OpKind::BatchNorm || n.op == OpKind::GroupNorm) && !n.in_place && n.outputs.size() == 3 &&
         !n.attrs.b("relu", false);
}

bool is_norm_backward(const Node& n) {
  return (n.op == OpKind::BatchNormBackward || n.op == OpKind::GroupNormBackward) && !n.in_place &&
         n.inputs.size() == 5 && n.inputs[0] && n.inputs[1] && !n.attrs.b("relu", false);
}

// The relu that alone reads norm i's y, all of it, into a buffer of its own: its index, or -1 with the
// reason in `why`.
// The fused node m extended to `wider`, which also does node k's work, where the device's kernel takes
// that call (node k then goes); else m as it is, with the reason logged.
void take_if_supported(const Graph& g, size_t i, Node& m, Node wider, int k, std::vector<bool>& drop, PassStats& stats,
                       const char* with) {
  if (!call_supported(g, wider)) return why_not(kPass, g, i, with, "the device's kernel does not take the call");
  m = std::move(wider);
  drop[size_t(k)] = true;
  stats.fused += 1;
}

int relu_after(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const TensorRef& y = g.nodes[i].outputs[0];
  const int k = sole_reader(g, u, y);
  if (!why(k >= 0 && internal_once(g, u, y), "y has other readers or is a result")) return -1;
  const Node& r = g.nodes[size_t(k)];
  if (!why(r.op == OpKind::Relu && !r.in_place && r.inputs.size() == 1 && r.inputs[0] && same_ref(*r.inputs[0], y),
           std::string("y is read by ") + op_name(r.op) + ", not by a relu of all of it"))
    return -1;
  const TensorRef& out = r.outputs[0];
  if (!why(out.shape == y.shape && out.dtype == y.dtype && internal_once(g, u, out) && is_dense(out),
           "the relu writes a strided view or a buffer written elsewhere too"))
    return -1;
  return k;
}

// A cast of all of the relu's output r into a dense 16-bit buffer on r's device that nothing touches
// before it: its index, or -1.
int cast_of(const Graph& g, const BufferUses& u, const TensorRef& r) {
  if (r.dtype != DType::f32) return -1;
  for (int k : u.readers[r.buffer]) {
    if (k >= int(g.nodes.size())) continue;
    const Node& c = g.nodes[size_t(k)];
    if (c.op != OpKind::Copy || c.in_place || c.inputs.size() != 1 || !c.inputs[0] || !same_ref(*c.inputs[0], r))
      continue;
    const TensorRef& out = c.outputs[0];
    if (is_16bit(out.dtype) && out.shape == r.shape && is_dense(out) && internal_once(g, u, out) &&
        u.touches[out.buffer].front() == k && g.buffers[out.buffer].device == g.buffers[r.buffer].device)
      return k;
  }
  return -1;
}

void fuse_forward(Graph& g, const BufferUses& u, size_t i, std::vector<bool>& drop, PassStats& stats) {
  Why why;
  const int k = relu_after(g, u, i, why);
  if (k < 0 || drop[size_t(k)]) return why_not(kPass, g, i, "the relu after it", why.reason());
  Node m = g.nodes[i];
  m.outputs[0] = g.nodes[size_t(k)].outputs[0];
  m.attrs.set("relu", true);
  if (m.fused.empty()) m.fused.push_back(op_name(m.op));
  m.fused.push_back("relu");
  if (!call_supported(g, m))
    return why_not(kPass, g, i, "the relu after it", "the device's kernel does not take the call");
  const int c = cast_of(g, u, m.outputs[0]);
  if (c >= 0 && !drop[size_t(c)]) {
    Node with_cast = m;
    with_cast.outputs.push_back(g.nodes[size_t(c)].outputs[0]);
    with_cast.attrs.set("cast_dtype", with_cast.outputs.back().dtype);
    with_cast.fused.push_back("copy");
    take_if_supported(g, i, m, std::move(with_cast), c, drop, stats, "the cast of its relu");
  }
  g.nodes[i] = std::move(m);
  drop[size_t(k)] = true;
  stats.fused += 1;
}

// Norm backward i's g as relu_backward(dy, r) that only it reads: that node's index, or -1 with the
// reason in `why`. Its operands must be of x's shape and the norm's dtype, written by nothing between
// it and the norm, and dense, but for dy, which may also be a pool's gradient broadcast over the
// positions for group norm, whose kernels read that where it lies (compile/passes/fuse_norm_pool.cpp
// folds the pool's scale in afterwards).
int relu_backward_before(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const Node& n = g.nodes[i];
  const TensorRef &gr = *n.inputs[0], &x = *n.inputs[1];
  const int p = u.producer(gr.buffer);
  if (!why(p >= 0 && p < int(i), "no node before it writes g")) return -1;
  const Node& rb = g.nodes[size_t(p)];
  if (!why(rb.op == OpKind::ReluBackward && !rb.in_place && rb.inputs.size() == 2 && rb.inputs[0] && rb.inputs[1] &&
               same_ref(rb.outputs[0], gr),
           std::string("g is written by ") + op_name(rb.op) + ", not by relu_backward") ||
      !why(internal_once(g, u, gr) && sole_reader(g, u, gr) == int(i), "relu_backward's result has other readers"))
    return -1;
  for (const auto& in : rb.inputs) {
    const bool layout_ok =
        is_dense(*in) || (&in == &rb.inputs[0] && n.op == OpKind::GroupNormBackward && is_position_broadcast(*in));
    if (!why(in->shape == x.shape && in->dtype == gr.dtype && layout_ok,
             "relu_backward reads a strided operand, or one of another dtype") ||
        !why(!u.written_between(in->buffer, p, int(i)), "an operand of relu_backward is written before the norm"))
      return -1;
  }
  return p;
}

// The widening cast that writes relu_backward's incoming gradient dy (f32) from a dense 16-bit tensor
// of x's dtype, when only relu_backward reads dy and nothing writes the 16-bit tensor before the norm
// (node i): its index, or -1.
int widened_grad(const Graph& g, const BufferUses& u, int p, size_t i) {
  const TensorRef &dy = *g.nodes[size_t(p)].inputs[0], &x = *g.nodes[i].inputs[1];
  if (dy.dtype != DType::f32 || !is_16bit(x.dtype) || !internal_once(g, u, dy) || sole_reader(g, u, dy) != p) return -1;
  const int j = u.producer(dy.buffer);
  if (j < 0 || j >= p) return -1;
  const Node& c = g.nodes[size_t(j)];
  if (c.op != OpKind::Copy || c.in_place || c.inputs.size() != 1 || !c.inputs[0] || !same_ref(c.outputs[0], dy))
    return -1;
  const TensorRef& dy16 = *c.inputs[0];
  if (dy16.dtype != x.dtype || dy16.shape != dy.shape || !is_dense(dy16) || u.written_between(dy16.buffer, j, int(i)) ||
      g.buffers[dy16.buffer].device != g.buffers[dy.buffer].device)
    return -1;
  return j;
}

void fuse_backward(Graph& g, const BufferUses& u, size_t i, std::vector<bool>& drop, PassStats& stats) {
  Why why;
  const int p = relu_backward_before(g, u, i, why);
  if (p < 0 || drop[size_t(p)]) return why_not(kPass, g, i, "the relu_backward before it", why.reason());
  const Node& rb = g.nodes[size_t(p)];
  Node m = g.nodes[i];
  m.inputs[0] = rb.inputs[0];
  m.inputs.push_back(rb.inputs[1]);
  m.attrs.set("relu", true);
  if (m.fused.empty()) m.fused.push_back(op_name(m.op));
  m.fused.insert(m.fused.begin(), "relu_backward");
  if (!call_supported(g, m))
    return why_not(kPass, g, i, "the relu_backward before it", "the device's kernel does not take the call");
  const int j = widened_grad(g, u, p, i);
  if (j >= 0 && !drop[size_t(j)]) {
    Node wide = m;
    wide.inputs[0] = g.nodes[size_t(j)].inputs[0];
    wide.fused.insert(wide.fused.begin(), "copy");
    take_if_supported(g, i, m, std::move(wide), j, drop, stats, "the cast of its gradient");
  }
  g.nodes[i] = std::move(m);
  drop[size_t(p)] = true;
  stats.fused += 1;
}

}  // namespace

void fuse_norm_relu(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Node& n = g.nodes[i];
    if (is_norm_forward(n)) return fuse_forward(g, u, i, drop, stats);
    if (is_norm_backward(n)) fuse_backward(g, u, i, drop, stats);
  });
}

}  // namespace reel::compile
