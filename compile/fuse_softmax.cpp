// Masked-softmax fusion (see fuse_softmax.h).
#include "compile/fuse_softmax.h"

#ifdef REEL_CUDA
#include "kernels/cuda/masked_softmax.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// in: x (or g, y), mask; out: y (or dx, possibly absent: its only reader was the cast), [y16].
class MaskedSoftmaxKernel : public FusedKernel {
 public:
  MaskedSoftmaxKernel(bool backward, double fill, bool has_f32, bool has_16)
      : backward_(backward), fill_(fill), has_f32_(has_f32), has_16_(has_16) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    const Tensor y = has_f32_ ? out[0] : Tensor();
    const Tensor y16 = has_16_ ? out.back() : Tensor();
    if (backward_) cuda::masked_softmax_bwd(in[0], in[1], in[2], y, y16);
    else cuda::masked_softmax_fwd(in[0], in[1], fill_, y, y16);
  }
  std::string name() const override { return backward_ ? "masked softmax backward" : "masked softmax"; }

 private:
  bool backward_;
  double fill_;
  bool has_f32_, has_16_;
};

struct Use {
  std::vector<int> readers, writers, touches;  // node indices
};

bool last_dim(const Node& n, size_t rank) {
  const int64_t d = n.attrs.i("dim");
  return d == -1 || d == int64_t(rank) - 1;
}

bool rows_f32(const TensorRef& r) { return r.dtype == DType::f32 && is_contiguous(r) && !r.shape.empty(); }

bool mask_like(const TensorRef& m, const TensorRef& x) {
  return m.dtype == DType::f32 && m.shape.size() == 2 && is_contiguous(m) && x.shape.size() >= 2 &&
         m.shape[1] == x.shape.back() && m.shape[0] == x.shape[x.shape.size() - 2];
}

}  // namespace
#endif

void fuse_masked_softmax(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  std::vector<Use> use(g.buffers.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& r : g.nodes[i].inputs)
      if (r) use[r->buffer].readers.push_back(int(i)), use[r->buffer].touches.push_back(int(i));
    for (const TensorRef& r : g.nodes[i].outputs)
      use[r.buffer].writers.push_back(int(i)), use[r.buffer].touches.push_back(int(i));
  }
  for (const TensorRef& r : g.outputs) use[r.buffer].readers.push_back(int(g.nodes.size()));
  auto internal_once = [&](const TensorRef& r) {
    return g.buffers[r.buffer].kind == BufferKind::Internal && use[r.buffer].writers.size() == 1;
  };
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i + 1 < g.nodes.size(); ++i) {
    Node& a = g.nodes[i];
    Node& b = g.nodes[i + 1];
    if (a.kernel || b.kernel || a.in_place || b.in_place || drop[i]) continue;
    const bool fwd = a.op == OpKind::MaskedFill && b.op == OpKind::Softmax;
    const bool bwd = a.op == OpKind::SoftmaxBackward && b.op == OpKind::MaskedFill;
    if (!fwd && !bwd) continue;
    // The intermediate: a's output, read by b alone.
    const TensorRef& mid = a.outputs[0];
    const std::optional<TensorRef>& b_in = b.inputs[0];
    if (!b_in || !same_ref(*b_in, mid) || !internal_once(mid) || use[mid.buffer].readers != std::vector<int>{int(i + 1)})
      continue;
    const Node& mf = fwd ? a : b;
    if (!mf.inputs[1] || !mask_like(*mf.inputs[1], mid) || (bwd && mf.attrs.f("value") != 0.0)) continue;
    const Node& sm = fwd ? b : a;
    if (!last_dim(sm, mid.shape.size())) continue;
    std::vector<TensorRef> ins = fwd ? std::vector<TensorRef>{*a.inputs[0], *a.inputs[1]}
                                     : std::vector<TensorRef>{*a.inputs[0], *a.inputs[1], *b.inputs[1]};
    const TensorRef out = b.outputs[0];
    // fwd: x, mask; bwd: g, y, mask — every row tensor contiguous f32 of the result's shape.
    bool ok = rows_f32(out) && rows_f32(mid) && mid.shape == out.shape;
    for (size_t k = 0; k + 1 < ins.size(); ++k) ok = ok && rows_f32(ins[k]) && ins[k].shape == out.shape;
    for (const TensorRef& r : ins) ok = ok && g.buffers[r.buffer].device.is_cuda();
    if (!ok) continue;
    // A later cast of the result to 16 bits (with the result's own geometry) joins the kernel.
    int cast = -1;
    for (int k : use[out.buffer].readers) {
      if (k >= int(g.nodes.size())) continue;
      const Node& c = g.nodes[size_t(k)];
      if (c.op == OpKind::Copy && !c.in_place && !c.kernel && c.inputs[0] && same_ref(*c.inputs[0], out) &&
          (c.outputs[0].dtype == DType::bf16 || c.outputs[0].dtype == DType::f16) && is_contiguous(c.outputs[0]) &&
          c.outputs[0].shape == out.shape && internal_once(c.outputs[0]) &&
          use[c.outputs[0].buffer].touches.front() == k) {
        cast = k;
        break;
      }
    }
    // The f32 result is still written when anything but the cast reads it.
    const bool keep_f32 = use[out.buffer].readers.size() > (cast >= 0 ? 1u : 0u) || !internal_once(out);
    Node fused{b.op, Attrs(), {}, {}, false, {op_name(a.op), op_name(b.op)}, nullptr};
    for (const TensorRef& r : ins) fused.inputs.push_back(r);
    if (keep_f32) fused.outputs.push_back(out);
    if (cast >= 0) {
      fused.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
      fused.fused.push_back("copy");
      drop[size_t(cast)] = true;
    }
    if (fused.outputs.empty()) continue;
    fused.kernel = std::make_shared<MaskedSoftmaxKernel>(bwd, fwd ? mf.attrs.f("value") : 0.0, keep_f32, cast >= 0);
    stats.fused += cast >= 0 ? 2 : 1;
    g.nodes[i] = std::move(fused);
    drop[i + 1] = true;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
