// Layer-norm backward + residual add fusion (see fuse_norm_backward_add.h).
#include "compile/fuse_norm_backward_add.h"

#include "compile/fuse_bias_grad_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/layer_norm_fused.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// in: g, x, w, mean, rstd, r (w possibly undefined), and the bias gradient when the column sums add to
// it; out: dx + r, dw, db, and (dx + r) in 16 bits when the pass also took a cast, then its column
// sums when it took those too.
class LayerNormBackwardAddKernel : public FusedKernel {
 public:
  explicit LayerNormBackwardAddKernel(bool accumulate = false) : accumulate_(accumulate) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::layer_norm_bwd_add(in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1], out[2],
                             out.size() > 3 ? out[3] : Tensor(), out.size() > 4 ? out[4] : Tensor(), accumulate_);
  }
  std::string name() const override {
    return accumulate_ ? "layer norm backward + residual add, the 16-bit copy's column sums added to a gradient"
                       : "layer norm backward + residual add";
  }

 private:
  bool accumulate_;
};

struct Match {
  int add = -1;     // the add's node index
  int operand = 0;  // which of the add's inputs is r
};

// Node i as a layer_norm_backward whose dx only a later add with an operand ready before i reads.
Match match(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::LayerNormBackward || n.kernel || n.in_place || n.inputs.size() != 5 || n.outputs.size() != 3)
    return {};
  const TensorRef& dx = n.outputs[0];
  if (!is_contiguous(dx) || !internal_once(g, u, dx) || !g.buffers[dx.buffer].device.is_cuda() ||
      u.readers[dx.buffer].size() != 1)
    return {};
  const int j = u.readers[dx.buffer][0];
  if (j >= int(g.nodes.size())) return {};
  const Node& a = g.nodes[size_t(j)];
  if (a.op != OpKind::Add || a.kernel || a.in_place || a.inputs.size() != 2 || !a.inputs[0] || !a.inputs[1]) return {};
  const int mine = same_ref(*a.inputs[0], dx) ? 0 : same_ref(*a.inputs[1], dx) ? 1 : -1;
  if (mine < 0) return {};
  const TensorRef &r = *a.inputs[size_t(1 - mine)], &out = a.outputs[0];
  if (r.buffer == dx.buffer || r.shape != dx.shape || r.dtype != dx.dtype || !is_contiguous(r) || out.shape != dx.shape ||
      out.dtype != dx.dtype || !is_contiguous(out) || !internal_once(g, u, out) || u.touches[out.buffer].front() != j)
    return {};
  // r must hold at node i the value the add reads at node j: nothing writes it from i to j.
  for (int w : u.writers[r.buffer])
    if (w >= int(i) && w <= j) return {};
  return {j, 1 - mine};
}

// The column sums (compile/fuse_bias_grad_cast.h) of the 16-bit sum x16 that node i now writes, when
// they can move into node i: their node index, or -1. They must read all of x16, one sum per
// normalised column (cols), and nothing from i to them may touch their output.
int column_sums_of(const Graph& g, const BufferUses& u, size_t i, const TensorRef& x16, int64_t cols,
                   const std::vector<bool>& drop) {
  if (x16.shape.empty() || x16.shape.back() != cols) return -1;
  for (int k : u.readers[x16.buffer]) {
    if (k <= int(i) || drop[size_t(k)]) continue;
    const Node& s = g.nodes[size_t(k)];
    const std::optional<bool> add = column_sums_accumulate(s);
    if (!add || s.outputs.size() != 1 || !s.inputs[0] || !same_ref(*s.inputs[0], x16)) continue;
    const TensorRef& z = s.outputs[0];
    if (z.dtype != DType::f32 || numel_of(z.shape) != cols || !is_contiguous(z) || u.touched_between(z.buffer, int(i), k))
      continue;
    return k;
  }
  return -1;
}

}  // namespace
#endif

void fuse_norm_backward_add(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Match m = match(g, u, i);
    if (m.add < 0 || drop[size_t(m.add)]) return;
    Node& n = g.nodes[i];
    const Node& a = g.nodes[size_t(m.add)];
    n.inputs.push_back(a.inputs[size_t(m.operand)]);
    n.outputs[0] = a.outputs[0];
    n.fused = {"layer_norm_backward", "add"};
    n.kernel = std::make_shared<LayerNormBackwardAddKernel>();
    drop[size_t(m.add)] = true;
    stats.fused += 1;
    // The sum's cast to 16 bits for the next GEMM, if any, is written by the same kernel.
    const int cast = later_16bit_cast(g, u, a.outputs[0]);
    if (cast >= 0 && !drop[size_t(cast)]) {
      n.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
      n.fused.push_back("copy");
      drop[size_t(cast)] = true;
      stats.fused += 1;
      // And the bias gradient summed from that 16-bit copy, by the same pass over the rows.
      const int s = column_sums_of(g, u, i, n.outputs.back(), numel_of(n.outputs[1].shape), drop);
      if (s >= 0) {
        const Node& sums = g.nodes[size_t(s)];
        const bool add = *column_sums_accumulate(sums);
        n.outputs.push_back(sums.outputs[0]);
        if (add) n.inputs.push_back(sums.outputs[0]);
        if (sums.fused.empty()) n.fused.push_back("sum");  // summed into a buffer of its own
        else n.fused.insert(n.fused.end(), sums.fused.begin(), sums.fused.end());  // "sum" and "copy" or "add"
        n.kernel = std::make_shared<LayerNormBackwardAddKernel>(add);
        drop[size_t(s)] = true;
        stats.fused += 1;
      }
    }
  });
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
