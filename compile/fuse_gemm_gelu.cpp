// GELU into the GEMM before it (see fuse_gemm_gelu.h).
#include "compile/fuse_gemm_gelu.h"

#include "compile/fuse_gemm_epilogue.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_epilogue.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// 2-D views of the bound tensors with the geometry the pass worked out (offsets come from the bindings).
Tensor as_2d(const Tensor& t, const TensorRef& r) { return Tensor::make_view(t, r.shape, r.strides, t.offset()); }

// in: x (traced geometry), W^T (K, N), bias (N); out: v = gelu(z), z (both contiguous, x's rows by N).
class GemmBiasGeluKernel : public FusedKernel {
 public:
  GemmBiasGeluKernel(TensorRef a, TensorRef y, TensorRef pre) : a_(std::move(a)), y_(std::move(y)), pre_(std::move(pre)) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::gemm_bias_gelu(as_2d(in[0], a_), in[1], in[2], as_2d(out[0], y_), as_2d(out[1], pre_));
  }
  std::string name() const override { return "gemm_bias_gelu (cuBLASLt GELU_AUX_BIAS epilogue)"; }

 private:
  TensorRef a_, y_, pre_;
};

// Node n as GELU of all of t (f32, no kernel yet), into f32.
bool is_gelu_of(const Node& n, const TensorRef& t) {
  return n.op == OpKind::Gelu && !n.kernel && !n.in_place && n.inputs.size() == 1 && n.inputs[0] &&
         same_ref(*n.inputs[0], t) && n.outputs.size() == 1 && n.outputs[0].dtype == DType::f32;
}

// Nothing touches r's buffer before node k writes it.
bool first_touched_at(const BufferUses& u, const TensorRef& r, int k) { return u.touches[r.buffer].front() == k; }

// The chain after the GEMM at node i: its node indices (cast, gelu, cast) and what fc2 reads.
struct GeluChain {
  int cast_in, gelu, cast_out;
  TensorRef v;
};
std::optional<GeluChain> gelu_chain(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if (!is_gemm_bias(n) || n.outputs.size() != 1 || n.inputs.size() != 3 || !n.inputs[0]) return std::nullopt;
  const TensorRef& z = n.outputs[0];
  if (!is_16bit(z.dtype) || n.inputs[0]->dtype != z.dtype || !internal_once(g, u, z) || !is_contiguous(z))
    return std::nullopt;
  for (int k : u.readers[z.buffer]) {
    if (!is_plain_cast_of(g, u, k, z) || g.nodes[size_t(k)].outputs[0].dtype != DType::f32) continue;
    const TensorRef& t = g.nodes[size_t(k)].outputs[0];
    const int gl = sole_reader(g, u, t);
    if (gl < 0 || !is_gelu_of(g.nodes[size_t(gl)], t)) continue;
    const TensorRef& gu = g.nodes[size_t(gl)].outputs[0];
    const int c2 = sole_reader(g, u, gu);
    if (!internal_once(g, u, gu) || !is_plain_cast_of(g, u, c2, gu) || g.nodes[size_t(c2)].outputs[0].dtype != z.dtype)
      continue;
    const TensorRef& v = g.nodes[size_t(c2)].outputs[0];
    if (!first_touched_at(u, v, c2)) continue;
    return GeluChain{k, gl, c2, v};
  }
  return std::nullopt;
}

void fuse_gelu_into_gemms(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const std::optional<GeluChain> c = gelu_chain(g, u, i);
    if (!c || drop[size_t(c->cast_in)] || drop[size_t(c->gelu)] || drop[size_t(c->cast_out)]) return;
    Node& n = g.nodes[i];
    const TensorRef z = n.outputs[0];
    const std::optional<TensorRef> a2 = as_matrix(*n.inputs[0]), v2 = as_matrix(c->v), z2 = as_matrix(z);
    if (!a2 || !v2 || !z2 ||
        !cuda::gemm_bias_gelu_supported(traced(g, *a2), traced(g, *n.inputs[1]), traced(g, *n.inputs[2]),
                                        traced(g, *v2), traced(g, *z2)))
      return;
    n.outputs = {c->v, z};
    n.kernel = std::make_shared<GemmBiasGeluKernel>(*a2, *v2, *z2);
    n.fused.insert(n.fused.end(), {"copy", "gelu", "copy"});
    for (int k : {c->cast_in, c->gelu, c->cast_out}) drop[size_t(k)] = true;
    stats.fused += 3;
  });
}

}  // namespace
#endif

void fuse_gemm_gelu(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  fuse_gelu_into_gemms(g, stats);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
