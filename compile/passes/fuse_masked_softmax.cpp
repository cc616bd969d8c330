// Masked-softmax fusion: attention's
//   z = masked_fill(x, mask, -inf)   y = softmax(z, -1)   [y16 = copy(y) to bf16/f16]
// and, in the backward,
//   d = softmax_backward(g, y, -1)   dx = masked_fill(d, mask, 0)   [dx16 = copy(dx) to bf16/f16]
// traced as two or three kernels, become one masked_softmax (masked_softmax_backward) node: the masked
// scores are never written, and the cast for the next GEMM is made in the same pass. The first two nodes must be
// consecutive; the cast may come later (its output is untouched until then). Rows are the last dim,
// the mask a contiguous (T, C) f32 tensor broadcast over the leading dims, every other tensor
// contiguous f32. The kernels repeat the softmax kernels' arithmetic in their order (the CPU one runs
// them): results are bit-identical. On a device with the fused ops.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

bool last_dim(const Node& n, size_t rank) {
  const int64_t d = n.attrs.i("dim");
  return d == -1 || d == int64_t(rank) - 1;
}

bool rows_f32(const TensorRef& r) { return r.dtype == DType::f32 && is_contiguous(r) && !r.shape.empty(); }

bool mask_like(const TensorRef& m, const TensorRef& x) {
  return m.dtype == DType::f32 && m.shape.size() == 2 && is_contiguous(m) && x.shape.size() >= 2 &&
         m.shape[1] == x.shape.back() && m.shape[0] == x.shape[x.shape.size() - 2];
}

// Nodes i, i+1 as (masked_fill, softmax) or (softmax_backward, masked_fill) over one intermediate:
// the fused kernel's inputs (x, mask or g, y, mask), or nullopt.
std::optional<std::vector<TensorRef>> match_pair(const Graph& g, const BufferUses& u, size_t i, bool* backward,
                                                 Why& why) {
  const Node& a = g.nodes[i];
  const Node& b = g.nodes[i + 1];
  const bool fwd = a.op == OpKind::MaskedFill && b.op == OpKind::Softmax;
  const bool bwd = a.op == OpKind::SoftmaxBackward && b.op == OpKind::MaskedFill;
  if (!fwd && !bwd) return std::nullopt;
  const TensorRef& mid = a.outputs[0];
  if (!why(!a.in_place && !b.in_place, "one of them is in place") ||
      !why(b.inputs[0] && same_ref(*b.inputs[0], mid), "the second does not read the first's result as its input") ||
      !why(internal_once(g, u, mid) && u.readers[mid.buffer] == std::vector<int>{int(i + 1)},
           "the intermediate has other readers or writers"))
    return std::nullopt;
  const Node& mf = fwd ? a : b;
  const Node& sm = fwd ? b : a;
  if (!why(mf.inputs[1] && mask_like(*mf.inputs[1], mid), "the mask is not a contiguous f32 (T, C)") ||
      !why(!bwd || mf.attrs.f("value") == 0.0, "the backward's fill is not 0") ||
      !why(last_dim(sm, mid.shape.size()), "the softmax is not over the last dim"))
    return std::nullopt;
  std::vector<TensorRef> ins = fwd ? std::vector<TensorRef>{*a.inputs[0], *a.inputs[1]}
                                   : std::vector<TensorRef>{*a.inputs[0], *a.inputs[1], *b.inputs[1]};
  // fwd: x, mask; bwd: g, y, mask — every row tensor contiguous f32 of the result's shape.
  const TensorRef& out = b.outputs[0];
  bool ok = rows_f32(out) && rows_f32(mid) && mid.shape == out.shape;
  for (size_t k = 0; k + 1 < ins.size(); ++k) ok = ok && rows_f32(ins[k]) && ins[k].shape == out.shape;
  if (!why(ok, "the rows are not contiguous f32 of one shape") ||
      !why(device_supports(g, out, fwd ? OpKind::MaskedSoftmax : OpKind::MaskedSoftmaxBackward),
           "the device has no masked softmax"))
    return std::nullopt;
  *backward = bwd;
  return ins;
}

}  // namespace

void fuse_masked_softmax(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i + 1 < g.nodes.size(); ++i) {
    bool bwd = false;
    Why why;
    std::optional<std::vector<TensorRef>> ins = drop[i] ? std::nullopt : match_pair(g, u, i, &bwd, why);
    if (!ins) {
      if (!why.reason().empty()) why_not("masked_softmax", g, i, "the node after it", why.reason());
      continue;
    }
    const Node& a = g.nodes[i];
    const Node& b = g.nodes[i + 1];
    const TensorRef out = b.outputs[0];
    const int cast = later_16bit_cast(g, u, out);
    // The f32 result is still written when anything but the cast reads it.
    const bool keep_f32 = u.readers[out.buffer].size() > (cast >= 0 ? 1u : 0u) || !internal_once(g, u, out);
    if (!keep_f32 && cast < 0) continue;
    Node fused{bwd ? OpKind::MaskedSoftmaxBackward : OpKind::MaskedSoftmax, Attrs().set("keep_f32", keep_f32), {}, {},
               false, {op_name(a.op), op_name(b.op)}};
    if (!bwd) fused.attrs.set("value", a.attrs.f("value"));
    for (const TensorRef& r : *ins) fused.inputs.push_back(r);
    if (keep_f32) fused.outputs.push_back(out);
    if (cast >= 0) {
      fused.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
      fused.attrs.set("dtype", fused.outputs.back().dtype);
      fused.fused.push_back("copy");
    }
    if (!call_supported(g, fused)) {
      why_not("masked_softmax", g, i, "the node after it", "the device's kernel does not take the call");
      continue;
    }
    if (cast >= 0) drop[size_t(cast)] = true;
    stats.fused += cast >= 0 ? 2 : 1;
    g.nodes[i] = std::move(fused);
    drop[i + 1] = true;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
