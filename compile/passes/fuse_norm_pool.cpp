// Group norm before a global average pool, forward and backward: a classifier CNN's last block,
//   forward:  y, mean, rstd = group_norm(x, w, b)          (with its relu: norm_relu, which runs first)
//             p = mean(y, dims 2..)                         p (N, C): the pooled features
//   backward: t  = copy(dp16) to f32                        (autocast's cast of the head's 16-bit dp)
//             s  = mul_scalar(t, 1/S)                       (the mean's backward, then expanded:
//             dy = expand(s) over the S positions             strides (C, 1, 0, 0))
//             dx, dw, db = group_norm_backward(dy, x, w, mean, rstd[, y])
// Each of the mean, the cast and the scale is a launch of a few microseconds on a few thousand
// values (relu_backward is already the norm's, norm_relu having let it read the expand where it
// lies), between the network's last convolution and its head. Here:
// - the norm writes p itself (attr pool, its last output): its kernel sums each channel of y as the
//   mean op's kernel sums a row, so p keeps the mean's bits (kernels/cuda/norm.cu; the CPU runs the
//   mean op);
// - the backward reads the (N, C) tensor behind the expand as it is (the norm kernels read a position
//   broadcast in place), with mul_scalar's value as attr grad_scale (each g multiplied and rounded
//   as mul_scalar rounds it) and, where t is a widening cast of a 16-bit dp of x's dtype, dp itself.
// Batch norm's kernels take neither attr (its schema refuses them), nor pools over other dims.
// Runs after norm_relu (whose relu and 16-bit operands it keeps) and before elementwise fusion, which
// would take the cast and the scale.
#include <algorithm>
#include <numeric>
#include <string>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "norm_pool";

// A mean of all of y over its spatial dims (2, 3, ...) into a contiguous (N, C) buffer written only
// there, after norm i with nothing writing y in between: its index among y's readers, or -1 with the
// reason in `why`.
int pool_of(const Graph& g, const BufferUses& u, size_t i, const TensorRef& y, Why& why) {
  const int64_t rank = int64_t(y.shape.size());
  std::vector<int64_t> spatial(size_t(std::max<int64_t>(rank - 2, 0)));
  std::iota(spatial.begin(), spatial.end(), 2);
  for (int k : u.readers[y.buffer]) {
    if (k <= int(i) || k >= int(g.nodes.size())) continue;
    const Node& m = g.nodes[size_t(k)];
    if (m.op != OpKind::Mean || m.in_place || m.inputs.size() != 1 || !m.inputs[0] || !same_ref(*m.inputs[0], y) ||
        !m.attrs.has("dims"))  // no dims: a mean over all of y
      continue;
    std::vector<int64_t> dims = m.attrs.ints("dims");
    for (int64_t& d : dims) d = d < 0 ? d + rank : d;
    std::sort(dims.begin(), dims.end());
    const TensorRef& p = m.outputs[0];
    if (why(rank >= 3 && dims == spatial && !m.attrs.b("keepdim", false), "y's mean is not over every spatial dim") &&
        why(p.dtype == y.dtype && p.shape == Shape{y.shape[0], y.shape[1]} && is_contiguous(p) &&
                internal_once(g, u, p),
            "the mean writes a view or a buffer written elsewhere too") &&
        why(!u.written_between(y.buffer, int(i), k), "y is written between the norm and the mean"))
      return k;
  }
  why(false, "no mean reads all of y");
  return -1;
}

void fuse_forward(Graph& g, const BufferUses& u, size_t i, std::vector<bool>& drop, PassStats& stats) {
  Why why;
  const int k = pool_of(g, u, i, g.nodes[i].outputs[0], why);
  if (k < 0 || drop[size_t(k)]) return why_not(kPass, g, i, "the mean after it", why.reason());
  Node m = g.nodes[i];
  m.outputs.push_back(g.nodes[size_t(k)].outputs[0]);
  m.attrs.set("pool", true);
  if (m.fused.empty()) m.fused.push_back(op_name(m.op));
  m.fused.push_back("mean");
  if (!call_supported(g, m))
    return why_not(kPass, g, i, "the mean after it", "the device's kernel does not take the call");
  g.nodes[i] = std::move(m);
  drop[size_t(k)] = true;
  stats.fused += 1;
}

// ref r's buffer and offset seen through `like`'s shape and strides (the expand of a contiguous
// (N, C) tensor that the norm reads).
TensorRef seen_as(const TensorRef& r, const TensorRef& like) {
  TensorRef v = like;
  v.buffer = r.buffer, v.offset = r.offset, v.dtype = r.dtype;
  return v;
}

// The node before backward node i that writes the (N, C) tensor behind g (a position broadcast), if
// it is `op` writing all of a contiguous buffer that only i reads: its index, or -1.
int writer_of_broadcast(const Graph& g, const BufferUses& u, size_t i, const TensorRef& src, OpKind op) {
  const int w = u.producer(src.buffer);
  if (w < 0 || w >= int(i) || !internal_once(g, u, src) || sole_reader(g, u, src) != int(i)) return -1;
  const Node& n = g.nodes[size_t(w)];
  if (n.op != op || n.in_place || n.inputs.size() != 1 || !n.inputs[0] || n.outputs[0].buffer != src.buffer ||
      !is_contiguous(n.outputs[0]) || n.outputs[0].offset != src.offset)
    return -1;
  const TensorRef& in = *n.inputs[0];
  if (!is_contiguous(in) || numel_of(in.shape) != numel_of(n.outputs[0].shape) ||
      u.written_between(in.buffer, w, int(i)) || g.buffers[in.buffer].device != g.buffers[src.buffer].device)
    return -1;
  return w;
}

void fuse_backward(Graph& g, const BufferUses& u, size_t i, std::vector<bool>& drop, PassStats& stats) {
  const Node& n = g.nodes[i];
  const TensorRef& dy = *n.inputs[0];
  if (!is_position_broadcast(dy)) return;  // not a pool's gradient: nothing to say
  const int s = writer_of_broadcast(g, u, i, dy, OpKind::MulScalar);
  if (s < 0 || drop[size_t(s)])
    return why_not(kPass, g, i, "the pool's scale", "g is not the expand of a mul_scalar only it reads");
  // The norm rounds the product to its own dtype (dw's), as mul_scalar rounds it to its output's.
  if (g.nodes[size_t(s)].outputs[0].dtype != n.outputs[1].dtype)
    return why_not(kPass, g, i, "the pool's scale", "the scale writes another dtype than the norm computes in");
  const Node& scale = g.nodes[size_t(s)];
  Node m = n;
  m.inputs[0] = seen_as(*scale.inputs[0], dy);
  m.attrs.set("grad_scale", scale.attrs.f("value"));
  m.fused.insert(m.fused.begin(), "mul_scalar");
  if (!call_supported(g, m))
    return why_not(kPass, g, i, "the pool's scale", "the device's kernel does not take the call");
  // The widening cast of a 16-bit gradient before the scale, read by it alone: the norm reads the
  // 16-bit tensor (of x's dtype; call_supported checks) instead.
  const TensorRef& t = *scale.inputs[0];
  const int c = t.dtype == DType::f32 ? u.producer(t.buffer) : -1;
  if (c >= 0 && c < s && !drop[size_t(c)] && internal_once(g, u, t) && sole_reader(g, u, t) == s) {
    const Node& cast = g.nodes[size_t(c)];
    const TensorRef& t16 = *cast.inputs[0];
    const TensorRef& wrote = cast.outputs[0];  // t itself, or t before the mean's backward reshaped it
    if (cast.op == OpKind::Copy && !cast.in_place && is_16bit(t16.dtype) && is_contiguous(t16) &&
        wrote.buffer == t.buffer && wrote.offset == t.offset && is_contiguous(wrote) &&
        numel_of(t16.shape) == numel_of(t.shape) && numel_of(wrote.shape) == numel_of(t.shape) &&
        !u.written_between(t16.buffer, c, int(i))) {
      Node narrow = m;
      narrow.inputs[0] = seen_as(t16, dy);
      narrow.fused.insert(narrow.fused.begin(), "copy");
      if (call_supported(g, narrow)) {
        m = std::move(narrow);
        drop[size_t(c)] = true;
        stats.fused += 1;
      } else {
        why_not(kPass, g, i, "the cast of the pool's gradient", "the device's kernel does not take the call");
      }
    }
  }
  g.nodes[i] = std::move(m);
  drop[size_t(s)] = true;
  stats.fused += 1;
}

}  // namespace

void fuse_norm_pool(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Node& n = g.nodes[i];
    if (n.op == OpKind::GroupNorm && !n.in_place && !n.attrs.b("pool", false) && n.outputs.size() >= 3)
      return fuse_forward(g, u, i, drop, stats);
    if (n.op == OpKind::GroupNormBackward && !n.in_place && !n.attrs.has("grad_scale") && n.inputs.size() >= 5 &&
        n.inputs[0])
      fuse_backward(g, u, i, drop, stats);
  });
}

}  // namespace reel::compile
