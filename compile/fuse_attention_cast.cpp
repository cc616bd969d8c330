// Attention + cast fusion (see fuse_attention_cast.h).
#include "compile/fuse_attention_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/attention.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// Forward. in: qkv; out: y, lse, y16.
class AttentionCastKernel : public FusedKernel {
 public:
  AttentionCastKernel(int64_t heads, DType compute) : heads_(heads), compute_(compute) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::causal_attention_fwd_into(in[0], heads_, compute_, out[0], out[1], out[2]);
  }
  std::string name() const override { return "causal attention, also into 16 bits"; }

 private:
  int64_t heads_;
  DType compute_;
};

// Backward. in: dy, qkv, y, lse; out: dqkv, dqkv16.
class AttentionBackwardCastKernel : public FusedKernel {
 public:
  AttentionBackwardCastKernel(int64_t heads, DType compute) : heads_(heads), compute_(compute) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::causal_attention_bwd_into(in[0], in[1], in[2], in[3], heads_, compute_, out[0], out[1]);
  }
  std::string name() const override { return "causal attention backward, also into 16 bits"; }

 private:
  int64_t heads_;
  DType compute_;
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
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
