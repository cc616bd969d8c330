// Layer norm + cast fusion (see fuse_norm_cast.h).
#include "compile/fuse_norm_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/layer_norm_fused.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// in: x, w, b (w, b possibly undefined), and the addend when the residual add was taken; out: y16,
// mean, rstd, and then x + addend.
class LayerNormCastKernel : public FusedKernel {
 public:
  explicit LayerNormCastKernel(double eps) : eps_(eps) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    const bool add = in.size() > 3;
    cuda::layer_norm_fwd_16(in[0], in[1], in[2], eps_, out[0], out[1], out[2], add ? in[3] : Tensor(),
                            add ? out[3] : Tensor());
  }
  std::string name() const override { return "layer norm into 16 bits"; }

 private:
  double eps_;
};

// Node i as a layer norm whose f32 result only a later 16-bit cast reads: the cast's index, or -1.
int match(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::LayerNorm || n.kernel || n.in_place || n.inputs.size() != 3 || !n.inputs[0] ||
      n.outputs.size() != 3)
    return -1;
  const TensorRef& y = n.outputs[0];
  if (n.inputs[0]->dtype != DType::f32 || y.dtype != DType::f32 || !is_contiguous(y) || !internal_once(g, u, y) ||
      !g.buffers[y.buffer].device.is_cuda())
    return -1;
  const int cast = later_16bit_cast(g, u, y);
  if (cast < 0 || u.readers[y.buffer] != std::vector<int>{cast}) return -1;
  return cast;
}

// The residual add that produces norm i's input, when it can move into the norm's kernel: a
// same-shape f32 add (node p < i, the add's only writer of its output) whose result nothing touches
// between p and i and whose operands nothing writes from p to i. Its index, or -1.
int residual_add(const Graph& g, const BufferUses& u, size_t i) {
  const TensorRef& x = *g.nodes[i].inputs[0];
  if (!internal_once(g, u, x) || !is_contiguous(x)) return -1;
  const int p = u.producer(x.buffer);
  if (p < 0 || p >= int(i)) return -1;
  const Node& a = g.nodes[size_t(p)];
  if (a.op != OpKind::Add || a.kernel || a.in_place || a.inputs.size() != 2 || !a.inputs[0] || !a.inputs[1] ||
      !same_ref(a.outputs[0], x) || u.touched_between(x.buffer, p, int(i)))
    return -1;
  for (const auto& r : a.inputs) {
    if (r->shape != x.shape || r->dtype != DType::f32 || !is_contiguous(*r) || !g.buffers[r->buffer].device.is_cuda() ||
        r->buffer == x.buffer)
      return -1;
    for (int w : u.writers[r->buffer])
      if (w >= p && w <= int(i)) return -1;
  }
  return p;
}

}  // namespace
#endif

void fuse_norm_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const int cast = match(g, u, i);
    if (cast < 0 || drop[size_t(cast)]) return;
    Node& n = g.nodes[i];
    const TensorRef x = *n.inputs[0];
    n.outputs[0] = g.nodes[size_t(cast)].outputs[0];
    n.fused = {"layer_norm", "copy"};
    n.kernel = std::make_shared<LayerNormCastKernel>(n.attrs.f("eps"));
    drop[size_t(cast)] = true;
    stats.fused += 1;
    // A pre-norm block's residual add just before: the norm's kernel computes the sum and writes it.
    const int add = residual_add(g, u, i);
    if (add >= 0 && !drop[size_t(add)]) {
      const Node& a = g.nodes[size_t(add)];
      n.inputs[0] = a.inputs[0];
      n.inputs.push_back(a.inputs[1]);
      n.outputs.push_back(x);
      n.fused.insert(n.fused.begin(), "add");
      drop[size_t(add)] = true;
      stats.fused += 1;
    }
  });
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
