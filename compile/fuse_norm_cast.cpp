// Layer norm + cast fusion (see fuse_norm_cast.h).
#include "compile/fuse_norm_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/layer_norm_fused.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// in: x, w, b (w, b possibly undefined); out: y16, mean, rstd.
class LayerNormCastKernel : public FusedKernel {
 public:
  explicit LayerNormCastKernel(double eps) : eps_(eps) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::layer_norm_fwd_16(in[0], in[1], in[2], eps_, out[0], out[1], out[2]);
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

}  // namespace
#endif

void fuse_norm_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int cast = drop[i] ? -1 : match(g, u, i);
    if (cast < 0) continue;
    Node& n = g.nodes[i];
    n.outputs[0] = g.nodes[size_t(cast)].outputs[0];
    n.fused = {"layer_norm", "copy"};
    n.kernel = std::make_shared<LayerNormCastKernel>(n.attrs.f("eps"));
    drop[size_t(cast)] = true;
    stats.fused += 1;
  }
  drop_nodes(g, drop);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
