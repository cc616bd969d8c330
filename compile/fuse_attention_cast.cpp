// Attention + cast fusion (see fuse_attention_cast.h).
#include "compile/fuse_attention_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/attention.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// Forward. in: qkv; out: y, lse, y16, or only lse, y16 when the f32 y is not kept.
class AttentionCastKernel : public FusedKernel {
 public:
  AttentionCastKernel(int64_t heads, DType compute, bool writes_y = true)
      : heads_(heads), compute_(compute), writes_y_(writes_y) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    if (writes_y_) cuda::causal_attention_fwd_into(in[0], heads_, compute_, out[0], out[1], out[2]);
    else cuda::causal_attention_fwd_into(in[0], heads_, compute_, Tensor(), out[0], out[1]);
  }
  std::string name() const override {
    return writes_y_ ? "causal attention, also into 16 bits" : "causal attention into 16 bits";
  }

 private:
  int64_t heads_;
  DType compute_;
  bool writes_y_;
};

// Backward. in: dy, qkv, y, lse; out: dqkv, dqkv16, or only dqkv16 when nothing reads the f32 dqkv.
class AttentionBackwardCastKernel : public FusedKernel {
 public:
  AttentionBackwardCastKernel(int64_t heads, DType compute, bool writes_f32 = true)
      : heads_(heads), compute_(compute), writes_f32_(writes_f32) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::causal_attention_bwd_into(in[0], in[1], in[2], in[3], heads_, compute_, writes_f32_ ? out[0] : Tensor(),
                                    writes_f32_ ? out[1] : out[0]);
  }
  std::string name() const override {
    return writes_f32_ ? "causal attention backward, also into 16 bits" : "causal attention backward into 16 bits";
  }

 private:
  int64_t heads_;
  DType compute_;
  bool writes_f32_;
};

// Node i as an attention op whose f32 result a later cast to its compute dtype reads: the cast's index, or -1.
int match(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if ((n.op != OpKind::CausalAttention && n.op != OpKind::CausalAttentionBackward) || n.kernel || n.in_place ||
      n.outputs.empty())
    return -1;
  const TensorRef& out = n.outputs[0];
  const DType compute = static_cast<DType>(n.attrs.i("compute"));
  if (out.dtype != DType::f32 || (compute != DType::bf16 && compute != DType::f16) || !is_contiguous(out) ||
      !internal_once(g, u, out) || !g.buffers[out.buffer].device.is_cuda())
    return -1;
  const int cast = later_16bit_cast(g, u, out);
  if (cast < 0 || g.nodes[size_t(cast)].outputs[0].dtype != compute) return -1;
  return cast;
}

// After the casts are folded: a forward whose f32 y only the backward reads (as its input 2). The
// backward then reads y16 (the D = dy . y term sees y rounded, as PyTorch's 16-bit attention does) and
// the forward writes y16 alone, so the step keeps half the bytes of y for the backward.
void keep_only_16bit_y(Graph& g) {
  const BufferUses u = buffer_uses(g);
  for (Node& f : g.nodes) {
    if (f.op != OpKind::CausalAttention || f.outputs.size() != 3 || !f.kernel || f.fused.size() != 2) continue;
    const TensorRef y = f.outputs[0], y16 = f.outputs[2];
    if (!internal_once(g, u, y)) continue;
    bool only_backward = !u.readers[y.buffer].empty();
    for (int k : u.readers[y.buffer]) {
      const Node* r = k < int(g.nodes.size()) ? &g.nodes[size_t(k)] : nullptr;
      only_backward = only_backward && r && r->op == OpKind::CausalAttentionBackward && r->inputs.size() == 4 &&
                      r->inputs[2] && same_ref(*r->inputs[2], y) && r->attrs.i("compute") == f.attrs.i("compute");
      for (size_t j = 0; r && j < r->inputs.size(); ++j)
        only_backward = only_backward && (j == 2 || !r->inputs[j] || r->inputs[j]->buffer != y.buffer);
    }
    if (!only_backward) continue;
    for (int k : u.readers[y.buffer]) g.nodes[size_t(k)].inputs[2] = y16;
    f.outputs.erase(f.outputs.begin());
    f.kernel = std::make_shared<AttentionCastKernel>(f.attrs.i("heads"), static_cast<DType>(f.attrs.i("compute")),
                                                     /*writes_y=*/false);
  }
  // A backward whose f32 dqkv nothing reads (its GEMMs and the bias gradient take dqkv16) writes
  // dqkv16 alone. Dead-code elimination keeps a node for any output that is read, so this output goes here.
  for (Node& b : g.nodes) {
    if (b.op != OpKind::CausalAttentionBackward || b.outputs.size() != 2 || !b.kernel || b.fused.size() != 2) continue;
    const TensorRef& dqkv = b.outputs[0];
    if (!internal_once(g, u, dqkv) || !u.readers[dqkv.buffer].empty()) continue;
    b.outputs.erase(b.outputs.begin());
    b.kernel = std::make_shared<AttentionBackwardCastKernel>(b.attrs.i("heads"), static_cast<DType>(b.attrs.i("compute")),
                                                             /*writes_f32=*/false);
  }
}

}  // namespace
#endif

void fuse_attention_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const int cast = match(g, u, i);
    if (cast < 0 || drop[size_t(cast)]) return;
    Node& n = g.nodes[i];
    const int64_t heads = n.attrs.i("heads");
    const DType compute = static_cast<DType>(n.attrs.i("compute"));
    n.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
    if (n.op == OpKind::CausalAttention) {
      n.fused = {"causal_attention", "copy"};
      n.kernel = std::make_shared<AttentionCastKernel>(heads, compute);
    } else {
      n.fused = {"causal_attention_backward", "copy"};
      n.kernel = std::make_shared<AttentionBackwardCastKernel>(heads, compute);
    }
    drop[size_t(cast)] = true;
    stats.fused += 1;
  });
  keep_only_16bit_y(g);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
