// GELU into the GEMMs on either side of it (see fuse_gemm_gelu.h).
#include "compile/fuse_gemm_gelu.h"

#include "compile/fuse_gemm_epilogue.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_epilogue.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

bool is_16bit(DType d) { return d == DType::bf16 || d == DType::f16; }

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

// in: dy (traced geometry), W (K, N), z (the pre-activation); out: e = (dy @ W) * gelu'(z).
class GemmDgeluKernel : public FusedKernel {
 public:
  GemmDgeluKernel(TensorRef a, TensorRef pre, TensorRef dx) : a_(std::move(a)), pre_(std::move(pre)), dx_(std::move(dx)) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::gemm_dgelu(as_2d(in[0], a_), in[1], as_2d(in[2], pre_), as_2d(out[0], dx_));
  }
  std::string name() const override { return "gemm_dgelu (cuBLASLt DGELU epilogue)"; }

 private:
  TensorRef a_, pre_, dx_;
};

// Node k as a plain cast of all of src into a new contiguous Internal buffer of src's shape in
// dtype `to`, written only there.
bool is_cast_of(const Graph& g, const BufferUses& u, int k, const TensorRef& src, DType to) {
  if (k < 0) return false;
  const Node& c = g.nodes[size_t(k)];
  if (c.op != OpKind::Copy || c.in_place || c.kernel || c.inputs.size() != 1 || !c.inputs[0] ||
      !same_ref(*c.inputs[0], src) || c.outputs.size() != 1)
    return false;
  const TensorRef& out = c.outputs[0];
  return out.dtype == to && out.shape == src.shape && is_contiguous(out) && internal_once(g, u, out);
}

// A single-input/single-output elementwise node of kind `op` (no kernel yet) whose first input is all of `in`.
bool is_plain(const Node& n, OpKind op, size_t inputs, const TensorRef& in) {
  return n.op == op && !n.kernel && !n.in_place && n.inputs.size() == inputs && n.inputs[0] && same_ref(*n.inputs[0], in) &&
         n.outputs.size() == 1 && n.outputs[0].dtype == DType::f32;
}

// Nothing touches r's buffer before node k writes it.
bool first_touched_at(const BufferUses& u, const TensorRef& r, int k) { return u.touches[r.buffer].front() == k; }

// The forward at node i: the chain's node indices (cast, gelu, cast) and the fused node's outputs.
struct ForwardChain {
  int cast_in, gelu, cast_out;
  TensorRef v;
};
std::optional<ForwardChain> forward_chain(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if (!is_gemm_bias(n) || n.outputs.size() != 1 || n.inputs.size() != 3 || !n.inputs[0]) return std::nullopt;
  const TensorRef& z = n.outputs[0];
  if (!is_16bit(z.dtype) || n.inputs[0]->dtype != z.dtype || !internal_once(g, u, z) || !is_contiguous(z))
    return std::nullopt;
  for (int k : u.readers[z.buffer]) {
    if (k >= int(g.nodes.size()) || !is_cast_of(g, u, k, z, DType::f32)) continue;
    const TensorRef& t = g.nodes[size_t(k)].outputs[0];
    const int gl = sole_reader(g, u, t);
    if (gl < 0 || !is_plain(g.nodes[size_t(gl)], OpKind::Gelu, 1, t)) continue;
    const TensorRef& gu = g.nodes[size_t(gl)].outputs[0];
    const int c2 = sole_reader(g, u, gu);
    if (!internal_once(g, u, gu) || !is_cast_of(g, u, c2, gu, z.dtype)) continue;
    const TensorRef& v = g.nodes[size_t(c2)].outputs[0];
    if (!first_touched_at(u, v, c2)) continue;
    return ForwardChain{k, gl, c2, v};
  }
  return std::nullopt;
}

// The backward at node m: the chain's node indices and what the fused node reads and writes.
struct BackwardChain {
  int cast_grad, cast_pre, gelu_backward, cast_out;
  TensorRef pre, e;
};
std::optional<BackwardChain> backward_chain(const Graph& g, const BufferUses& u, size_t m) {
  const Node& mm = g.nodes[m];
  if (mm.op != OpKind::Matmul || mm.kernel || mm.in_place || mm.inputs.size() != 2 || !mm.inputs[0] || !mm.inputs[1] ||
      mm.outputs.size() != 1 || mm.inputs[1]->shape.size() != 2)
    return std::nullopt;
  const TensorRef& y = mm.outputs[0];
  if (!is_16bit(y.dtype) || !internal_once(g, u, y)) return std::nullopt;
  const int c3 = sole_reader(g, u, y);
  if (!is_cast_of(g, u, c3, y, DType::f32)) return std::nullopt;
  const TensorRef& gr = g.nodes[size_t(c3)].outputs[0];
  const int gb = sole_reader(g, u, gr);
  if (gb < 0 || !is_plain(g.nodes[size_t(gb)], OpKind::GeluBackward, 2, gr) || !g.nodes[size_t(gb)].inputs[1])
    return std::nullopt;
  const Node& back = g.nodes[size_t(gb)];
  const TensorRef& x = *back.inputs[1];
  const int c4 = u.producer(x.buffer);
  if (c4 < 0 || sole_reader(g, u, x) != gb || g.nodes[size_t(c4)].inputs.size() != 1 || !g.nodes[size_t(c4)].inputs[0] ||
      !same_ref(g.nodes[size_t(c4)].outputs[0], x))
    return std::nullopt;
  const TensorRef pre = *g.nodes[size_t(c4)].inputs[0];
  if (pre.dtype != y.dtype || pre.shape != y.shape || !is_contiguous(pre) || !is_cast_of(g, u, c4, pre, DType::f32))
    return std::nullopt;
  for (int w : u.writers[pre.buffer])  // the GEMM reads z where the cast did: nothing may write it in between
    if (w >= std::min(int(m), c4)) return std::nullopt;
  const TensorRef& d = back.outputs[0];
  const int c5 = sole_reader(g, u, d);
  if (!internal_once(g, u, d) || !is_cast_of(g, u, c5, d, y.dtype)) return std::nullopt;
  const TensorRef& e = g.nodes[size_t(c5)].outputs[0];
  if (!first_touched_at(u, e, c5)) return std::nullopt;
  return BackwardChain{c3, c4, gb, c5, pre, e};
}

void fuse_forward(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const std::optional<ForwardChain> c = forward_chain(g, u, i);
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

void fuse_backward(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t m, std::vector<bool>& drop) {
    const std::optional<BackwardChain> c = backward_chain(g, u, m);
    if (!c) return;
    for (int k : {c->cast_grad, c->cast_pre, c->gelu_backward, c->cast_out})
      if (drop[size_t(k)]) return;
    Node& n = g.nodes[m];
    const std::optional<TensorRef> a2 = as_matrix(*n.inputs[0]), pre2 = as_matrix(c->pre), e2 = as_matrix(c->e);
    if (!a2 || !pre2 || !e2 ||
        !cuda::gemm_dgelu_supported(traced(g, *a2), traced(g, *n.inputs[1]), traced(g, *pre2), traced(g, *e2)))
      return;
    n.inputs.push_back(c->pre);
    n.outputs = {c->e};
    n.kernel = std::make_shared<GemmDgeluKernel>(*a2, *pre2, *e2);
    n.fused = {"matmul", "copy", "copy", "gelu_backward", "copy"};
    for (int k : {c->cast_grad, c->cast_pre, c->gelu_backward, c->cast_out}) drop[size_t(k)] = true;
    stats.fused += 4;
  });
}

}  // namespace
#endif

void fuse_gemm_gelu(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  fuse_forward(g, stats);
  fuse_backward(g, stats);  // on fresh uses: the forward's GEMMs now also write what fc2 reads
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
