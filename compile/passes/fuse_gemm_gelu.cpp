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
// On a GPU, only up to kMaxEpilogueGeluElements outputs: the epilogue's second output and its GELU cost the GEMM
// more as the output grows, while the elementwise kernel that takes GELU otherwise costs its launch
// and a memory-bound pass (its GELU in the logistic form, kernels/elementwise_math.h). Measured side by
// side on an H100 (bench/RESULTS.md, tenth step): gpt-small's fc, (4096, 2048), ran 0.5-1.1% faster
// per step without the epilogue; gpt-tiny's, (2048, 1024), 0.4-0.9% slower.
//
// The backward is left to elementwise fusion: GELU's backward reads z and fc2's 16-bit input
// gradient in one vectorised NVRTC kernel. cuBLASLt's DGELU epilogue, which would apply it in the
// epilogue of the GEMM that makes that gradient, measured slower on the H200: Nsight Compute timed
// its GEMM at 49 us against the plain GEMM's 18 us, and the step was 0.27 ms slower with it than with
// the plain GEMM and the vectorised kernel (bench/RESULTS.md).
#include "compile/passes/passes.h"


namespace reel::compile {

namespace {

constexpr const char* kPass = "gemm_gelu";
constexpr int64_t kMaxEpilogueGeluElements = int64_t(4) << 20;

// A GEMM + bias of 16-bit operands writing its own 16-bit buffer z.
bool is_16bit_gemm_bias(const Graph& g, const BufferUses& u, const Node& n) {
  if (!is_gemm_bias(n) || n.outputs.size() != 1 || n.inputs.size() != 3 || !n.inputs[0]) return false;
  const TensorRef& z = n.outputs[0];
  return is_16bit(z.dtype) && n.inputs[0]->dtype == z.dtype && internal_once(g, u, z) && is_contiguous(z);
}

// The chain after the GEMM at node i: the nodes (cast to f32, gelu, cast back) and their last output
// v, written there first (fc2's input), or nullopt with the reason in `why`.
std::optional<std::pair<std::vector<int>, TensorRef>> gelu_chain(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const TensorRef& z = g.nodes[i].outputs[0];
  const std::optional<std::vector<int>> c =
      match_chain(g, u, z,
                  {cast_link("a cast to f32", DType::f32, false, /*sole=*/false), op_link("gelu", OpKind::Gelu, DType::f32),
                   cast_link("a cast back to the GEMM's dtype", z.dtype)},
                  why);
  if (!c) {
    // The exact GELU (a ViT's MLP) has the chain's shape with gelu_erf in gelu's place; cuBLASLt's
    // epilogue computes the tanh form only, so it stays in the elementwise kernel: say so.
    Why erf;
    if (match_chain(g, u, z,
                    {cast_link("a cast to f32", DType::f32, false, /*sole=*/false),
                     op_link("gelu_erf", OpKind::GeluErf, DType::f32)},
                    erf)) {
      why = Why();
      why(false, "the GELU is the exact (erf) form and cuBLASLt's GELU epilogue computes the tanh form: "
                 "it stays in an elementwise kernel with the casts");
    }
    return std::nullopt;
  }
  const TensorRef& v = g.nodes[size_t(c->back())].outputs[0];
  if (!why(u.touches[v.buffer].front() == c->back(), "the 16-bit GELU output is touched before the cast writes it"))
    return std::nullopt;
  return std::make_pair(*c, v);
}

void fuse_gelu_into_gemms(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    if (!is_16bit_gemm_bias(g, u, g.nodes[i])) return;
    const bool on_gpu = g.buffers[size_t(g.nodes[i].outputs[0].buffer)].device.is_cuda();
    if (const int64_t n = numel_of(g.nodes[i].outputs[0].shape); on_gpu && n > kMaxEpilogueGeluElements)
      return why_not(kPass, g, i, "a GELU",
                     "its output of " + std::to_string(n) + " elements is above " +
                         std::to_string(kMaxEpilogueGeluElements) +
                         ": an elementwise kernel takes GELU faster than the epilogue's second output");
    Why why;
    const auto c = gelu_chain(g, u, i, why);
    if (!c) return why_not(kPass, g, i, "a GELU", why.reason());
    for (int k : c->first)
      if (drop[size_t(k)]) return;
    Node& n = g.nodes[i];
    Node fused = n;
    fused.outputs = {c->second, n.outputs[0]};
    fused.attrs.set("gelu", true);
    fused.fused.insert(fused.fused.end(), {"copy", "gelu", "copy"});
    if (!call_supported(g, fused)) return why_not(kPass, g, i, "its GELU", "the device's kernel does not take the call");
    n = std::move(fused);
    for (int k : c->first) drop[size_t(k)] = true;
    stats.fused += 3;
  });
}

}  // namespace

void fuse_gemm_gelu(Graph& g, PassStats& stats) { fuse_gelu_into_gemms(g, stats); }

}  // namespace reel::compile
