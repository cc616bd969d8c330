// Classifier-head fusion: a small head's three kernels, traced (after the gemm_epilogue and
// cross_entropy passes) as
//   logits      = gemm_epilogue(x, w, bias)                 x (N, C), w (C, K): W^T; logits (N, K) f32
//   loss, dlog  = cross_entropy_with_grad(logits, target, g) dlog (N, K) in x's dtype
//   dx          = matmul(dlog, w^T)                          dx (N, C) in x's dtype: the input's gradient
// become one linear_cross_entropy_with_grad node at the loss's place, with autocast's cast of x from
// f32 before the GEMM when nothing else reads x before the loss (the node then writes that cast). For
// a CNN's ten classes over a pooled feature vector each of those is a launch of a few microseconds
// around a few thousand multiply-adds; fused, the logits never leave the kernel. The node's outputs are
// the loss and dlog (which the weight and bias gradients still read), dx and the cast. The device
// decides which heads are small enough (kernels/cuda/cross_entropy.cu: linear_cross_entropy_supported);
// the CPU's kernel is the ops in turn, so a CPU plan keeps its bits.
//
// The fused node stands where the loss was computed, so: the logits are read by the loss alone,
// nothing writes x, w or bias between the GEMM and the loss, the matmul reads the loss's gradient and
// the GEMM's own w (transposed) into a fresh buffer, and nothing writes w before the matmul.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "linear_cross_entropy";

// r as the transpose of the 2-D ref w: the same buffer and offset, dims and strides swapped.
bool is_transpose_of(const TensorRef& r, const TensorRef& w) {
  return r.buffer == w.buffer && r.offset == w.offset && r.dtype == w.dtype && r.shape.size() == 2 &&
         w.shape.size() == 2 && r.shape[0] == w.shape[1] && r.shape[1] == w.shape[0] && r.strides[0] == w.strides[1] &&
         r.strides[1] == w.strides[0];
}

struct Head {
  int gemm = -1, matmul = -1;
  int cast = -1;  // autocast's cast of the GEMM's input from f32, folded in too, or -1
};

// The node that casts all of a contiguous f32 (N, C) into the GEMM's 16-bit input x16, where the fused
// node at j may do it instead: nothing reads x16 between the cast and j but the GEMM e, and nothing
// writes the f32 source in between. Its index, or -1.
int foldable_cast(const Graph& g, const BufferUses& u, const TensorRef& x16, int e, size_t j) {
  const int c = u.producer(x16.buffer);
  if (c < 0 || c >= e || !is_16bit(x16.dtype) || !is_contiguous(x16) || x16.offset != 0) return -1;
  const Node& cast = g.nodes[size_t(c)];
  if (cast.inputs.size() != 1 || !cast.inputs[0]) return -1;
  const TensorRef& src = *cast.inputs[0];
  if (!is_plain_cast_of(g, u, c, src) || !same_ref(cast.outputs[0], x16) || src.dtype != DType::f32 ||
      !is_contiguous(src) || u.written_between(src.buffer, c, int(j)))
    return -1;
  for (int r : u.readers[x16.buffer])
    if (r != e && r <= int(j)) return -1;
  return c;
}

// The GEMM before cross_entropy_with_grad node j and the matmul after it, or nullopt with the reason.
std::optional<Head> match(const Graph& g, const BufferUses& u, size_t j, Why& why) {
  const Node& x = g.nodes[j];
  if (!why(x.inputs.size() == 3 && x.outputs.size() == 2 && x.inputs[0] && x.inputs[1] && x.inputs[2] && !x.in_place,
           "it is not a plain call"))
    return std::nullopt;
  const TensorRef& logits = *x.inputs[0];
  const int e = u.producer(logits.buffer);
  if (!why(e >= 0 && e < int(j) && is_gemm_bias(g.nodes[size_t(e)]) && !g.nodes[size_t(e)].in_place,
           "its logits are not a GEMM + bias node's"))
    return std::nullopt;
  const Node& gemm = g.nodes[size_t(e)];
  if (!why(gemm.outputs.size() == 1 && same_ref(gemm.outputs[0], logits) && logits.dtype == DType::f32 &&
               internal_once(g, u, logits) && u.readers[logits.buffer] == std::vector<int>{int(j)},
           "the f32 logits are read by other nodes or are part of a larger result") ||
      !why(gemm.inputs.size() == 3 && gemm.inputs[0] && gemm.inputs[1] && gemm.inputs[2] &&
               gemm.inputs[0]->shape.size() == 2,
           "the GEMM's input is not a matrix"))
    return std::nullopt;
  const TensorRef &in = *gemm.inputs[0], &w = *gemm.inputs[1], &bias = *gemm.inputs[2];
  for (const TensorRef* r : {&in, &w, &bias})
    if (!why(!u.written_between(r->buffer, e, int(j)), "the GEMM's operands are written before the loss"))
      return std::nullopt;
  const TensorRef& dlog = x.outputs[1];
  if (!why(dlog.dtype == in.dtype, "the gradient is not in the input's dtype")) return std::nullopt;
  int m = -1;
  for (int k : u.readers[dlog.buffer]) {
    const Node& n = g.nodes[size_t(k)];
    if (k > int(j) && n.op == OpKind::Matmul && !n.in_place && n.inputs.size() == 2 && n.inputs[0] && n.inputs[1] &&
        same_ref(*n.inputs[0], dlog) && is_transpose_of(*n.inputs[1], w) && n.outputs.size() == 1) {
      m = k;
      break;
    }
  }
  if (!why(m >= 0, "no matmul reads the gradient times the GEMM's w transposed")) return std::nullopt;
  const TensorRef& dx = g.nodes[size_t(m)].outputs[0];
  if (!why(dx.dtype == in.dtype && dx.shape == in.shape && internal_once(g, u, dx) && u.touches[dx.buffer].front() == m,
           "the input's gradient is not a fresh buffer of the input's shape and dtype") ||
      !why(!u.written_between(w.buffer, int(j), m), "w is written between the loss and the input's gradient"))
    return std::nullopt;
  return Head{e, m, foldable_cast(g, u, in, e, j)};
}

}  // namespace

void fuse_linear_cross_entropy(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t j, std::vector<bool>& drop) {
    const Node& x = g.nodes[j];
    if (x.op != OpKind::CrossEntropyWithGrad) return;
    Why why;
    const std::optional<Head> h = match(g, u, j, why);
    if (!h) return why_not(kPass, g, j, "the head's GEMMs", why.reason());
    const Node &gemm = g.nodes[size_t(h->gemm)], &mm = g.nodes[size_t(h->matmul)];
    Attrs a = Attrs().set("ignore_index", x.attrs.i("ignore_index", -100)).set("reduction", x.attrs.i("reduction", 0));
    Node fused{OpKind::LinearCrossEntropyWithGrad,
               a,
               {gemm.inputs[0], gemm.inputs[1], gemm.inputs[2], x.inputs[1], x.inputs[2]},
               {x.outputs[0], x.outputs[1], mm.outputs[0]},
               false,
               {}};
    if (h->cast >= 0) {
      // The f32 source in, its 16-bit cast out (the weight gradient's GEMM reads it after the loss).
      fused.inputs[0] = g.nodes[size_t(h->cast)].inputs[0];
      fused.outputs.push_back(g.nodes[size_t(h->cast)].outputs[0]);
      fused.attrs.set("dtype", gemm.inputs[0]->dtype);
      fused.fused.push_back("copy");
    }
    for (const Node* n : {&gemm, &x, &mm}) {
      if (n->fused.empty()) fused.fused.push_back(op_name(n->op));
      fused.fused.insert(fused.fused.end(), n->fused.begin(), n->fused.end());
    }
    fused.phase = x.phase;
    if (!device_supports(g, x.outputs[0], fused.op) || !call_supported(g, fused))
      return why_not(kPass, g, j, "the head's GEMMs",
                     "the device's kernel does not take the call (a head too large, or operands not dense)");
    drop[size_t(h->gemm)] = drop[size_t(h->matmul)] = true;
    if (h->cast >= 0) drop[size_t(h->cast)] = true;
    g.nodes[j] = std::move(fused);
    stats.fused += h->cast >= 0 ? 3 : 2;
  });
}

}  // namespace reel::compile
