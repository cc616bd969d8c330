// Attention + cast fusion: under autocast, the f32 result of the fused attention op feeds a GEMM, which
// casts it to 16 bits first:
//   y, lse = attention(qkv)           (y f32: the backward reads it)     y16 = copy(y) to bf16
//   dqkv = attention_backward(...)    (f32: the bias gradient sums it)   d16 = copy(dqkv) to bf16
// The node becomes attention_cast (attention_backward_cast), which writes the 16-bit
// copy as well, and the cast node goes: one kernel and one read of the f32 result fewer per op. The
// f32 result stays (it has other readers). Applies when the cast is to the op's compute dtype, its
// output is contiguous and untouched before the cast, and the device has the fused op; the copy
// equals the unfused cast to the bit. The fused node keeps the op's inputs (the optional mask last)
// and attrs (heads, compute, causal) as they are: the cast changes nothing the kernels compute.
//
// Then, where the forward's f32 y is read by nothing but the backward (a transformer block's case: y16 feeds the
// projection's GEMM), the backward reads y16 instead and the forward no longer writes the f32 y: the
// step keeps y for the backward in 16 bits, as PyTorch's autocast does. Only the backward's row sums
// D = dy . y change (by y's rounding), so this one step is within tolerance of eager, not bitwise.
// Likewise a backward whose f32 dqkv has no reader left (its GEMMs and the bias gradient read the
// 16-bit copy) writes only the copy.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "attention_cast";

bool is_attention(const Node& n) {
  return (n.op == OpKind::Attention || n.op == OpKind::AttentionBackward) && !n.in_place && !n.outputs.empty();
}

// Node i (an attention op) whose f32 result a later cast to its compute dtype reads: the cast's
// index, or -1 with the reason in `why`.
int match(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const Node& n = g.nodes[i];
  const TensorRef& out = n.outputs[0];
  const DType compute = static_cast<DType>(n.attrs.i("compute"));
  if (!why(out.dtype == DType::f32 && (compute == DType::bf16 || compute == DType::f16),
           "it is not an f32 result computed in 16 bits") ||
      !why(is_contiguous(out) && internal_once(g, u, out), "its result is not a contiguous buffer of its own") ||
      !why(device_supports(g, out, n.op == OpKind::Attention ? OpKind::AttentionCast
                                                                   : OpKind::AttentionBackwardCast),
           "the device has no attention with a 16-bit copy"))
    return -1;
  const int cast = later_16bit_cast(g, u, out);
  if (!why(cast >= 0 && g.nodes[size_t(cast)].outputs[0].dtype == compute, "nothing casts its result to the compute dtype"))
    return -1;
  return cast;
}

// After the casts are folded: a forward whose f32 y only the backward reads (as its input 2). The
// backward then reads y16 (the D = dy . y term sees y rounded, as PyTorch's 16-bit attention does) and
// the forward writes y16 alone, so the step keeps half the bytes of y for the backward.
void keep_only_16bit_y(Graph& g) {
  const BufferUses u = buffer_uses(g);
  for (Node& f : g.nodes) {
    if (f.op != OpKind::AttentionCast || f.outputs.size() != 3 || !f.attrs.b("keep_f32", true)) continue;
    const TensorRef y = f.outputs[0], y16 = f.outputs[2];
    if (!internal_once(g, u, y)) continue;
    bool only_backward = !u.readers[y.buffer].empty();
    for (int k : u.readers[y.buffer]) {
      const Node* r = k < int(g.nodes.size()) ? &g.nodes[size_t(k)] : nullptr;
      const bool backward = r && (r->op == OpKind::AttentionBackward || r->op == OpKind::AttentionBackwardCast);
      only_backward = only_backward && backward && (r->inputs.size() == 4 || r->inputs.size() == 5) &&
                      r->inputs[2] && same_ref(*r->inputs[2], y) && r->attrs.i("compute") == f.attrs.i("compute");
      for (size_t j = 0; r && j < r->inputs.size(); ++j)
        only_backward = only_backward && (j == 2 || !r->inputs[j] || r->inputs[j]->buffer != y.buffer);
    }
    if (!only_backward) continue;
    for (int k : u.readers[y.buffer]) g.nodes[size_t(k)].inputs[2] = y16;
    f.outputs.erase(f.outputs.begin());
    f.attrs.set("keep_f32", false);
  }
  // A backward whose f32 dqkv nothing reads (its GEMMs and the bias gradient take dqkv16) writes
  // dqkv16 alone. Dead-code elimination keeps a node for any output that is read, so this output goes here.
  for (Node& b : g.nodes) {
    if (b.op != OpKind::AttentionBackwardCast || b.outputs.size() != 2 || !b.attrs.b("keep_f32", true)) continue;
    const TensorRef& dqkv = b.outputs[0];
    if (!internal_once(g, u, dqkv) || !u.readers[dqkv.buffer].empty()) continue;
    b.outputs.erase(b.outputs.begin());
    b.attrs.set("keep_f32", false);
  }
}

}  // namespace

void fuse_attention_cast(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  auto matched = [&](size_t i, Why& why) { return match(g, u, i, why); };
  fuse_partners(g, kPass, "its cast", is_attention, matched, [&](size_t i, int cast, std::vector<bool>& drop) {
    Node& n = g.nodes[i];
    const bool forward = n.op == OpKind::Attention;
    Node fused{forward ? OpKind::AttentionCast : OpKind::AttentionBackwardCast, n.attrs, n.inputs, n.outputs,
               false, {op_name(n.op), "copy"}};
    fused.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
    if (!call_supported(g, fused)) return why_not(kPass, g, i, "its cast", "the device's kernel does not take the call");
    n = std::move(fused);
    drop[size_t(cast)] = true;
    stats.fused += 1;
  });
  keep_only_16bit_y(g);
}

}  // namespace reel::compile
