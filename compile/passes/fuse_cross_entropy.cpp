// Cross-entropy fusion: a classifier's loss and its gradient, traced as
//   loss, lse = cross_entropy(logits, target)                 (reads the logits)
//   dlogits   = cross_entropy_backward(g, logits, target, lse) (reads them again, writes f32)
//   [d16      = copy(dlogits) to bf16/f16]                     (autocast's cast for the head's GEMMs)
// become one cross_entropy_with_grad node at the backward's place: one read of the logits, the lse
// never stored, and under autocast the gradient written in 16 bits only (the f32 one had the cast as
// its one reader). The kernels run the unfused kernels' folds and formulas, so the loss and the
// gradient keep their bits.
//
// The fused node computes the loss where the backward ran, so: the lse is read by the backward
// alone, nothing reads the loss before that place, nothing writes the logits or targets in between,
// and both nodes take the same logits, targets, ignore_index and reduction. The gradient seed g
// (a constant, or the loss scale times 1/micro-batches) is made before the backward by construction.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "cross_entropy";

bool same_input(const Node& a, size_t i, const Node& b, size_t j) {
  return i < a.inputs.size() && j < b.inputs.size() && a.inputs[i] && b.inputs[j] &&
         same_ref(*a.inputs[i], *b.inputs[j]);
}

// The backward that reads cross_entropy node i's lse, where the fused node may stand: its index, or
// -1 with the reason in `why`.
int match(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const Node& f = g.nodes[i];
  if (!why(f.outputs.size() == 2 && f.inputs.size() == 2 && f.inputs[0] && f.inputs[1], "it is not a plain call"))
    return -1;
  const TensorRef &loss = f.outputs[0], &lse = f.outputs[1];
  const int k = internal_once(g, u, lse) && u.readers[lse.buffer].size() == 1 ? u.readers[lse.buffer][0] : -1;
  if (!why(k > int(i) && k < int(g.nodes.size()), "its lse is not read by one later node alone")) return -1;
  const Node& b = g.nodes[size_t(k)];
  if (!why(b.op == OpKind::CrossEntropyBackward && !b.in_place && b.inputs.size() == 4 && b.inputs[3] &&
               same_ref(*b.inputs[3], lse) && b.inputs[0],
           "the lse's reader is not cross_entropy_backward") ||
      !why(same_input(f, 0, b, 1) && same_input(f, 1, b, 2), "the backward reads other logits or targets") ||
      !why(f.attrs.i("ignore_index", -100) == b.attrs.i("ignore_index", -100) &&
               f.attrs.i("reduction", 0) == b.attrs.i("reduction", 0),
           "the backward's ignore_index or reduction differ"))
    return -1;
  bool loss_read_early = false;
  for (int r : u.readers[loss.buffer]) loss_read_early = loss_read_early || r <= k;
  if (!why(internal_once(g, u, loss) && !loss_read_early, "the loss is read before the backward") ||
      !why(!u.written_between(f.inputs[0]->buffer, int(i), k) && !u.written_between(f.inputs[1]->buffer, int(i), k),
           "the logits or targets are written between the two") ||
      !why(device_supports(g, loss, OpKind::CrossEntropyWithGrad), "the device has no fused cross-entropy"))
    return -1;
  return k;
}

// A cast of all of the backward's f32 dlogits (through any contiguous view of them: the head's GEMM
// reads them as (B, T, C)) into a fresh 16-bit buffer, the dlogits' one reader: the cast's index, or -1.
int sole_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& d) {
  const int c = sole_reader(g, u, d);
  if (c < 0 || !internal_once(g, u, d) || d.dtype != DType::f32 || !is_contiguous(d)) return -1;
  const Node& cast = g.nodes[size_t(c)];
  if (cast.op != OpKind::Copy || cast.in_place || cast.inputs.size() != 1 || cast.outputs.size() != 1) return -1;
  const TensorRef &in = *cast.inputs[0], &out = cast.outputs[0];
  const bool whole = is_contiguous(in) && in.offset == d.offset && numel_of(in.shape) == numel_of(d.shape);
  const bool fresh = is_16bit(out.dtype) && is_contiguous(out) && numel_of(out.shape) == numel_of(d.shape) &&
                     internal_once(g, u, out) && u.touches[out.buffer].front() == c;
  return whole && fresh ? c : -1;
}

}  // namespace

void fuse_cross_entropy(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Node& f = g.nodes[i];
    if (f.op != OpKind::CrossEntropy || f.in_place) return;
    Why why;
    const int k = match(g, u, i, why);
    if (k < 0) return why_not(kPass, g, i, "its backward", why.reason());
    Node& b = g.nodes[size_t(k)];
    Node fused{OpKind::CrossEntropyWithGrad, f.attrs, {f.inputs[0], f.inputs[1], b.inputs[0]},
               {f.outputs[0], b.outputs[0]}, false,   {"cross_entropy", "cross_entropy_backward"}};
    fused.phase = b.phase;
    const int cast = sole_16bit_cast(g, u, b.outputs[0]);
    if (cast >= 0) {
      // The 16-bit gradient as the logits' (N, C): the cast's buffer, seen as the fused op writes it.
      TensorRef d16 = b.outputs[0];
      d16.buffer = g.nodes[size_t(cast)].outputs[0].buffer;
      d16.dtype = g.nodes[size_t(cast)].outputs[0].dtype;
      d16.offset = g.nodes[size_t(cast)].outputs[0].offset;
      fused.outputs[1] = d16;
      fused.attrs.set("dtype", d16.dtype);
      fused.fused.push_back("copy");
    }
    if (!call_supported(g, fused))
      return why_not(kPass, g, i, "its backward", "the device's kernel does not take the call");
    b = std::move(fused);
    drop[i] = true;
    if (cast >= 0) drop[size_t(cast)] = true;
    stats.fused += cast >= 0 ? 2 : 1;
  });
}

}  // namespace reel::compile
