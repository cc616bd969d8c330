// Layer norm + cast fusion: under autocast a layer norm feeds a Linear, which casts it to 16 bits:
//   y, mean, rstd = layer_norm(x, w, b)   (y f32)      y16 = copy(y) to bf16/f16
// When the cast is y's only reader, the two become one layer_norm_cast node that writes y16 directly:
// the f32 y is never written nor read back. mean and rstd stay outputs (the backward reads them).
// The cast may come later than the norm (its output untouched until then). Bit-identical to the
// unfused pair. f32 x only, on a device with a layer_norm_cast kernel.
// The residual connection's add that feeds a pre-norm block's norm (x = r + h; layer_norm(x)) joins
// the same kernel when nothing reads x in between: the kernel computes x, writes it (the residual
// stream goes on) and normalises it, bit-identical to the add followed by the norm (the op's fourth
// input and output). One operand may have a suffix of x's shape, broadcast over x's leading dims (the
// first block's x = token embedding + position table): the kernel reads that addend row by row
// again for each leading index. When that add's other operand is a dropout's output, h * mask with the mask
// drawn by a dropout_mask node (redraw_dropout_masks.cpp), the kernel reads h and draws the mask
// itself (the op's dropout attrs and Philox state): the dropped branch is never written, and the
// result is the bits of the multiply, the add and the norm.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "norm_cast";

bool is_layer_norm(const Node& n) {
  return n.op == OpKind::LayerNorm && !n.in_place && n.inputs.size() == 3 && n.inputs[0] && n.outputs.size() == 3;
}

// Node i (a layer norm) whose f32 result only a later 16-bit cast reads: the cast's index, or -1 with
// the reason in `why`.
int match(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const Node& n = g.nodes[i];
  const TensorRef& y = n.outputs[0];
  if (!why(n.inputs[0]->dtype == DType::f32 && y.dtype == DType::f32, "x is not f32") ||
      !why(is_contiguous(y) && internal_once(g, u, y), "y is not a contiguous buffer of its own") ||
      !why(device_supports(g, y, OpKind::LayerNormCast), "the device has no layer_norm_cast"))
    return -1;
  const int cast = later_16bit_cast(g, u, y);
  if (!why(cast >= 0, "nothing casts y to 16 bits") ||
      !why(u.readers[y.buffer] == std::vector<int>{cast}, "y has readers besides the cast"))
    return -1;
  return cast;
}

// A ref of a suffix of x's shape (covering the last `normalized` dims), contiguous: an addend the norm's
// kernel broadcasts over x's leading dims (a position table added over the batch).
bool broadcast_suffix(const TensorRef& r, const TensorRef& x, int64_t normalized) {
  int64_t ones = 0;  // leading 1s, which broadcast
  while (ones < int64_t(r.shape.size()) && r.shape[size_t(ones)] == 1) ++ones;
  return r.shape.size() <= x.shape.size() && r.shape != x.shape && is_trailing_suffix(r.shape, x.shape) &&
         int64_t(r.shape.size()) - ones >= normalized && is_contiguous(r);
}

// The residual add that produces norm i's input, when it can move into the norm's kernel: an f32 add
// (node p < i, the add's only writer of its output) of operands of x's shape, or of one of x's shape
// and one of a suffix of it (broadcast_suffix), whose result nothing touches between p and i and whose
// operands nothing writes from p to i. Its index, or -1.
int residual_add(const Graph& g, const BufferUses& u, size_t i) {
  const TensorRef& x = *g.nodes[i].inputs[0];
  if (!internal_once(g, u, x) || !is_contiguous(x)) return -1;
  const int p = u.producer(x.buffer);
  if (p < 0 || p >= int(i)) return -1;
  const Node& a = g.nodes[size_t(p)];
  if (a.op != OpKind::Add || a.in_place || a.inputs.size() != 2 || !a.inputs[0] || !a.inputs[1] ||
      !same_ref(a.outputs[0], x) || u.touched_between(x.buffer, p, int(i)))
    return -1;
  const int64_t normalized = g.nodes[i].attrs.i("normalized_ndim");
  int broadcast = 0;
  for (const auto& r : a.inputs) {
    const bool full = r->shape == x.shape && is_contiguous(*r);
    broadcast += !full && broadcast_suffix(*r, x, normalized);
    if (!(full || broadcast_suffix(*r, x, normalized)) || r->dtype != DType::f32 || r->buffer == x.buffer) return -1;
    for (int w : u.writers[r->buffer])
      if (w >= p && w <= int(i)) return -1;
  }
  return broadcast <= 1 ? p : -1;
}

// Which operand of the residual add (node `add`, folded into norm i) is h * mask, a dropout's output
// (redraw_dropout_masks.cpp) that only the add reads, with h f32 of the norm's shape and untouched
// from the multiply to the norm: 0 or 1; -1 with the reason in `why`; -2 when neither is a dropout's.
int dropped_addend(const Graph& g, const BufferUses& u, int add, size_t i, const std::vector<bool>& drop, Why& why) {
  const Node& a = g.nodes[size_t(add)];
  for (int side : {1, 0}) {
    const TensorRef& y = *a.inputs[size_t(side)];
    const int mul = u.producer(y.buffer);
    const std::optional<DropoutProduct> dp = dropout_product(g, u, mul);
    if (!dp) continue;
    const TensorRef& h = dp->value;
    if (!why(!drop[size_t(mul)] && !drop[size_t(dp->mask)], "its dropout went into another kernel") ||
        !why(internal_once(g, u, y) && u.readers[y.buffer] == std::vector<int>{add}, "the dropout's output has other readers") ||
        !why(h.dtype == DType::f32 && h.shape == y.shape, "the dropped value is not f32 of the sum's shape"))
      return -1;
    for (int w : u.writers[h.buffer])
      if (!why(w < mul || w > int(i), "the dropped value is written between the dropout and the norm")) return -1;
    return side;
  }
  return -2;  // no dropout there: nothing to say
}

}  // namespace

void fuse_norm_cast(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  auto matched = [&](size_t i, Why& why) { return match(g, u, i, why); };
  fuse_partners(g, kPass, "its cast", is_layer_norm, matched, [&](size_t i, int cast, std::vector<bool>& drop) {
    Node& n = g.nodes[i];
    const TensorRef y16 = g.nodes[size_t(cast)].outputs[0];
    Node fused{OpKind::LayerNormCast, Attrs(n.attrs).set("dtype", y16.dtype), n.inputs, n.outputs, false,
               {"layer_norm", "copy"}};
    fused.outputs[0] = y16;
    if (!call_supported(g, fused)) return why_not(kPass, g, i, "its cast", "the device's kernel does not take the call");
    const TensorRef x = *n.inputs[0];
    n = std::move(fused);
    drop[size_t(cast)] = true;
    stats.fused += 1;
    // A pre-norm block's residual add just before: the norm's kernel computes the sum and writes it.
    const int add = residual_add(g, u, i);
    if (add < 0 || drop[size_t(add)]) return;
    const Node& a = g.nodes[size_t(add)];
    // x's own shape first, a broadcast addend second (an add's operands commute, to the bit).
    const bool swap = a.inputs[0]->shape != x.shape;
    Node with_add = n;
    with_add.inputs[0] = a.inputs[swap ? 1 : 0];
    with_add.inputs.push_back(a.inputs[swap ? 0 : 1]);
    with_add.outputs.push_back(x);
    with_add.fused.insert(with_add.fused.begin(), "add");
    if (!call_supported(g, with_add)) return why_not(kPass, g, i, "the add before it", "the device's kernel does not take the call");
    n = std::move(with_add);
    drop[size_t(add)] = true;
    stats.fused += 1;
    if (n.inputs[3]->shape != x.shape) return;  // a broadcast addend: no dropout on it
    // The residual branch's dropout (x + dropout(h)): the kernel draws the mask and reads h itself.
    Why why;
    const int side = dropped_addend(g, u, add, i, drop, why);
    if (side == -1) why_not(kPass, g, i, "the dropout of its addend", why.reason());
    if (side < 0) return;
    const int mul = u.producer(a.inputs[size_t(side)]->buffer);
    const DropoutProduct dp = *dropout_product(g, u, mul);
    Node with_dropout = n;
    with_dropout.inputs[0] = a.inputs[size_t(1 - side)];  // an add's operands commute, to the bit
    with_dropout.inputs[3] = dp.value;
    add_fused_dropout(with_dropout, g.nodes[size_t(dp.mask)]);
    if (!call_supported(g, with_dropout))
      return why_not(kPass, g, i, "the dropout of its addend", "the device's kernel does not take the call");
    n = std::move(with_dropout);
    drop[size_t(mul)] = drop[size_t(dp.mask)] = true;
    stats.fused += 2;
  });
}

}  // namespace reel::compile
