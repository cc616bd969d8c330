// Layer norms reading their GEMMs' results in 16 bits. In a pre-norm transformer block under autocast
// two f32 tensors of the residual stream's shape pass from a GEMM straight into a layer norm:
//   forward:  z = gemm_epilogue(h16, W, bias)  (f32)        s, y16 = layer_norm_cast(x, w, b, addend = z)
//             the attention projection's and fc2's output, added to the residual x by the next norm;
//   backward: z = matmul_into(dy16, W)  (f32: matmul + cast)   ... = layer_norm_backward_add(g = z, ...)
//             the input gradient of qkv's and fc's GEMM, the gradient the norm before them gets.
// Each z is written once, 4 bytes an element, and read once. The norm kernels take a 16-bit addend and
// a 16-bit g as their exact f32 widening (kernels/schema/norm.cpp), so the GEMM can write z in its
// operands' dtype, 2 bytes an element, and the norm widen it as it loads it: per block and micro-batch
// four such tensors move half their bytes (gpt-small: 16 MiB fewer written and 16 MiB fewer read).
// What it computes:
//   backward: eager's bits. Eager's GEMM rounds dy16 W to 16 bits and autocast casts that back to f32
//     for the norm; fuse_matmul_cast had skipped that rounding (one rounding fewer than eager); here
//     the GEMM rounds again and the norm reads the same widening eager's cast made.
//   forward: the bias is added in the GEMM's f32 accumulator before the one rounding to 16 bits (with
//     the bias itself rounded to 16 bits where the device's GEMM takes no f32 bias: cuBLASLt's case,
//     gemm_16bit_results.h), as PyTorch's autocast Linear does; eager reel rounds before the bias
//     add. Within 16-bit rounding of both.
// Applies where z is an Internal buffer written once and read by that norm alone, once, as its addend
// (forward; either operand of the add, which commutes to the bit, and no dropout on it) or as its g
// (backward; a plain matmul_into, not one adding into a gradient), the GEMM's operands are 16-bit,
// and the device takes the rewritten GEMM and norm (call_supported); otherwise REEL_LOG=fusion says
// why. Runs after norm_backward_add (whose node it rewrites) and gemm_16bit (passes/pipeline.cpp).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compile/passes/gemm_16bit_results.h"
#include "compile/passes/passes.h"
#include "kernels/philox_args.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "layer_norm_16bit";

// Where layer_norm_cast node r would read z (the f32 result of GEMM i) as its 16-bit addend: r with
// z16 as input 3 (swapped with input 0 when z is there), or nothing, the reason in `why`.
std::optional<Node> norm_reading_addend(const Graph& g, const Node& r, const TensorRef& z, Why& why) {
  if (!why(r.op == OpKind::LayerNormCast && r.inputs.size() == 4 && r.inputs[0] && r.inputs[3],
           std::string(op_name(r.op)) + " reads it, not a layer norm adding it to its input"))
    return std::nullopt;
  const bool first = same_ref(*r.inputs[0], z), addend = same_ref(*r.inputs[3], z);
  if (!why(first != addend && !has_fused_dropout(r.attrs), "the norm reads it other than as an addend without dropout"))
    return std::nullopt;
  Node m = r;
  if (first) std::swap(m.inputs[0], m.inputs[3]);  // x + z == z + x, to the bit
  return m;
}

void forward(Graph& g, const BufferUses& u) {
  Gemm16bitResults results(g, u);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!is_16bit_gemm_bias_to_f32(g.nodes[i])) continue;
    const TensorRef z = g.nodes[i].outputs[0];
    const int k = sole_reader(g, u, z);
    Why why;
    if (!why(k > int(i), "its f32 result has other readers or is a result of the step"))
      continue;  // not a candidate: no log line for every GEMM of the step
    std::optional<Node> m = norm_reading_addend(g, g.nodes[size_t(k)], z, why);
    if (!m) {
      why_not(kPass, g, i, "the layer norm after it", why.reason());
      continue;
    }
    const DType c = g.nodes[i].inputs[0]->dtype;
    m->inputs[3]->dtype = c;
    if (!why(call_supported(g, *m), "the device's layer_norm_cast does not take a 16-bit addend") ||
        !results.write_16bit(i, why)) {
      why_not(kPass, g, i, "the layer norm after it", why.reason());
      continue;
    }
    g.nodes[size_t(k)] = std::move(*m);
  }
  results.insert_casts();
}

// Node p as a plain matmul_into of 16-bit operands writing all of z in f32 (fuse_matmul_cast's
// matmul + cast, not an add into a gradient).
bool is_matmul_cast_into(const Node& p, const TensorRef& z) {
  return p.op == OpKind::MatmulInto && !p.in_place && p.fused == std::vector<std::string>{"matmul", "copy"} &&
         p.inputs.size() == 2 && p.inputs[0] && p.inputs[1] && is_16bit(p.inputs[0]->dtype) &&
         p.inputs[1]->dtype == p.inputs[0]->dtype && p.outputs.size() == 1 && same_ref(p.outputs[0], z) &&
         z.dtype == DType::f32;
}

void backward(Graph& g, const BufferUses& u) {
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& r = g.nodes[k];
    if (r.op != OpKind::LayerNormBackwardAdd || r.inputs.size() < 6 || !r.inputs[0] || !r.inputs[1] ||
        r.inputs[1]->dtype != DType::f32 || r.inputs[0]->dtype != DType::f32)
      continue;
    const TensorRef z = *r.inputs[0];
    const int p = u.producer(z.buffer);
    if (p < 0 || !is_matmul_cast_into(g.nodes[size_t(p)], z)) continue;  // not a GEMM's gradient
    Why why;
    if (!why(internal_once(g, u, z) && sole_reader(g, u, z) == int(k) && is_contiguous(z) && z.offset == 0,
             "the GEMM's f32 result is read elsewhere too or is not a buffer of its own")) {
      why_not(kPass, g, k, "the GEMM before it", why.reason());
      continue;
    }
    const Node& mm = g.nodes[size_t(p)];
    TensorRef z16 = z;
    z16.dtype = mm.inputs[0]->dtype;
    Node gemm{OpKind::Matmul, Attrs(), mm.inputs, {z16}, false, {}};
    Node norm = r;
    norm.inputs[0] = z16;
    if (!why(call_supported(g, gemm), "the device's matmul does not take the call") ||
        !why(call_supported(g, norm), "the device's layer_norm_backward_add does not take a 16-bit g")) {
      why_not(kPass, g, k, "the GEMM before it", why.reason());
      continue;
    }
    g.buffers[z.buffer].nbytes = z16.nbytes();
    g.nodes[size_t(p)] = std::move(gemm);
    g.nodes[k] = std::move(norm);
  }
}

}  // namespace

void read_layer_norm_16bit(Graph& g, PassStats& stats) {
  (void)stats;  // no node goes: the GEMMs write, and the norms read, half the bytes
  backward(g, buffer_uses(g));
  forward(g, buffer_uses(g));
}

}  // namespace reel::compile
