// GELU into the GEMM before it, under autocast: gemm_epilogue with gelu (on CUDA cuBLASLt's
// GELU_AUX_BIAS epilogue). An MLP's forward (a GPT's, a ViT's), as the earlier passes leave it:
//
//   z = gemm_bias(x, Wfc^T, bfc)     (B, T, 4d) in c, the 16-bit compute dtype: the pre-activation,
//                                    kept for GELU's backward (store_gemm_bias_16bit)       (node i)
//   t = copy(z) to f32               store_gemm_bias_16bit's cast for GELU
//   u = gelu(t)                      f32
//   v = copy(u) to c                 autocast's cast for fc2's GEMM
//
// becomes one gemm_epilogue node (gelu) that writes v = gelu(acc + bias) and z = acc + bias: three kernels fewer per
// layer and micro-batch, and u and t never go through memory. GELU reads the f32 acc + bias instead
// of its 16-bit rounding (one rounding fewer; cuBLASLt's tanh is its own): within the dtype tolerance
// of the compiled-against-eager parity tests, not equal to the bit. Applies on CUDA when t and u are
// Internal buffers written once and read only by the chain, v is touched by nothing before the cast
// that wrote it, and cuBLASLt has an algorithm (4d divisible by 8). Runs after store_gemm_bias_16bit,
// before elementwise fusion would take the casts and GELU into a kernel of their own.
//
// The backward is left to elementwise fusion: GELU's backward reads z and fc2's 16-bit input
// gradient in one vectorised NVRTC kernel. cuBLASLt's DGELU epilogue, which would apply it in the
// epilogue of the GEMM that makes that gradient, measured slower on the H200: Nsight Compute timed
// its GEMM at 49 us against the plain GEMM's 18 us, and the step was 0.27 ms slower with it than with
// the plain GEMM and the vectorised kernel (bench/RESULTS.md).
#include "compile/passes/passes.h"


namespace reel::compile {

namespace {

// Node n as GELU of all of t (f32), into f32.
bool is_gelu_of(const Node& n, const TensorRef& t) {
  return n.op == OpKind::Gelu && !n.in_place && n.inputs.size() == 1 && n.inputs[0] &&
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
    Node fused = n;
    fused.outputs = {c->v, n.outputs[0]};
    fused.attrs.set("gelu", true);
    fused.fused.insert(fused.fused.end(), {"copy", "gelu", "copy"});
    if (!call_supported(g, fused)) return;
    n = std::move(fused);
    for (int k : {c->cast_in, c->gelu, c->cast_out}) drop[size_t(k)] = true;
    stats.fused += 3;
  });
}

}  // namespace

void fuse_gemm_gelu(Graph& g, PassStats& stats) { fuse_gelu_into_gemms(g, stats); }

}  // namespace reel::compile
