// Layer-norm backward + residual add: in a pre-norm block x + f(layer_norm(x)) the gradient of x is
// the sum of the residual branch's and the norm's:
//   dx, dw, db = layer_norm_backward(g, x, w, mean, rstd)     (node i)
//   ...                                                       nodes that touch neither dx nor out
//   out = add(dx, r)  or  add(r, dx)                          (node j > i; r final before node i)
// becomes one layer_norm_backward_add node at i that writes out = dx + r: dx is never written, and
// one kernel and two passes over memory go. Applies when dx is read only by the add, no node from i
// to j writes r, the add's output is untouched before j, everything is contiguous and of one dtype,
// and the device has the fused op. Equal to the unfused pair to the bit.
// A later cast of the sum to 16 bits (autocast's, for the GEMMs of the layer before) joins the same
// kernel, which writes both copies; so does a cast of the sum times a dropout's mask (the branch's
// dropout, its mask drawn in the kernel: the op's dropout attrs), which then goes with its multiply. That 16-bit sum is
// also the output gradient of the layer before's last Linear (a GPT's proj or fc2), whose bias gradient the
// bias-gradient pass sums from it (compile/passes/fuse_bias_grad_cast.cpp, a column_sums node): the same pass over the
// rows then sums it too, into (or onto) the bias's gradient, and that launch goes. Applies when the column sums read
// the whole 16-bit sum, one value per normalised column, and nothing touches their output between the two nodes. Equal
// to those column sums up to f32 rounding (another fixed order; the same bits every run). A norm with no residual's add
// after it (a stack's last, before the head) takes its dx's 16-bit cast and that copy's column sums all the same, as a
// layer_norm_backward_add without a residual (out is dx): two launches fewer per micro-batch in a GPT.
#include "compile/passes/passes.h"


namespace reel::compile {

namespace {

struct Match {
  int add = -1;     // the add's node index
  int operand = 0;  // which of the add's inputs is r
};

constexpr const char* kPass = "norm_backward_add";

bool is_layer_norm_backward(const Node& n) {
  return n.op == OpKind::LayerNormBackward && !n.in_place && n.inputs.size() == 5 && n.outputs.size() == 3;
}

// Node i (a layer_norm_backward) whose dx only a later add with an operand ready before i reads; the
// reason in `why` when not.
Match match(const Graph& g, const BufferUses& u, size_t i, Why& why) {
  const TensorRef& dx = g.nodes[i].outputs[0];
  if (!why(is_contiguous(dx) && internal_once(g, u, dx), "dx is not a contiguous buffer of its own") ||
      !why(device_supports(g, dx, OpKind::LayerNormBackwardAdd), "the device has no layer_norm_backward_add") ||
      !why(u.readers[dx.buffer].size() == 1 && u.readers[dx.buffer][0] < int(g.nodes.size()),
           "dx has more than one reader"))
    return {};
  const int j = u.readers[dx.buffer][0];
  const Node& a = g.nodes[size_t(j)];
  if (!why(a.op == OpKind::Add && !a.in_place && a.inputs.size() == 2 && a.inputs[0] && a.inputs[1],
           "dx's reader is not an add"))
    return {};
  const int mine = same_ref(*a.inputs[0], dx) ? 0 : same_ref(*a.inputs[1], dx) ? 1 : -1;
  if (!why(mine >= 0, "the add reads dx through another view")) return {};
  const TensorRef &r = *a.inputs[size_t(1 - mine)], &out = a.outputs[0];
  if (!why(r.buffer != dx.buffer && r.shape == dx.shape && r.dtype == dx.dtype && is_contiguous(r),
           "the other addend is not a contiguous tensor of dx's shape and dtype") ||
      !why(out.shape == dx.shape && out.dtype == dx.dtype && is_contiguous(out) && internal_once(g, u, out) &&
               u.touches[out.buffer].front() == j,
           "the sum is not a fresh contiguous buffer of dx's shape"))
    return {};
  // r must hold at node i the value the add reads at node j: nothing writes it from i to j.
  for (int w : u.writers[r.buffer])
    if (!why(w < int(i) || w > j, "the other addend is written between the two")) return {};
  return {j, 1 - mine};
}

// The column sums (a column_sums node of compile/passes/fuse_bias_grad_cast.cpp) of the 16-bit sum x16 that
// node i now writes, when they can move into node i: their node index, or -1. They must read all of
// x16, one sum per normalised column (cols), and nothing from i to them may touch their output.
int column_sums_of(const Graph& g, const BufferUses& u, size_t i, const TensorRef& x16, int64_t cols,
                   const std::vector<bool>& drop) {
  if (x16.shape.empty() || x16.shape.back() != cols) return -1;
  for (int k : u.readers[x16.buffer]) {
    if (k <= int(i) || drop[size_t(k)]) continue;
    const Node& s = g.nodes[size_t(k)];
    if (s.op != OpKind::ColumnSums || s.outputs.size() != 1 || !s.inputs[0] || !same_ref(*s.inputs[0], x16)) continue;
    const TensorRef& z = s.outputs[0];
    if (z.dtype != DType::f32 || z.shape != Shape{cols} || !is_contiguous(z) || u.touched_between(z.buffer, int(i), k))
      continue;
    return k;
  }
  return -1;
}

// The 16-bit cast of sum * mask (a dropout's backward: the multiply by the mask a dropout_mask node
// draws, redraw_dropout_masks.cpp) into a fresh buffer, the product read by the cast alone: the
// multiply's, the mask's and the cast's node indices, or cast -1.
struct DroppedCast {
  int mul = -1, mask = -1, cast = -1;
};
DroppedCast dropped_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& sum, const std::vector<bool>& drop) {
  for (int k : u.readers[sum.buffer]) {
    const std::optional<DropoutProduct> dp = dropout_product(g, u, k);
    if (!dp || !same_ref(dp->value, sum) || drop[size_t(k)] || drop[size_t(dp->mask)]) continue;
    const TensorRef& z = g.nodes[size_t(k)].outputs[0];
    if (z.dtype != sum.dtype || z.shape != sum.shape || !is_contiguous(z) || !internal_once(g, u, z)) continue;
    const int cast = later_16bit_cast(g, u, z);
    if (cast < 0 || drop[size_t(cast)] || u.readers[z.buffer] != std::vector<int>{cast}) continue;
    return {k, dp->mask, cast};
  }
  return {};
}

// Node i (now a layer_norm_backward_add writing `sum`) also writes the sum's later cast to 16 bits,
// if any, for the next GEMM, or the cast of the sum times a dropout's mask (the gradient of the branch
// a dropout closed); and then the bias gradient summed from that 16-bit copy, by the same pass over
// the rows. Returns whether the cast joined.
bool take_cast_and_sums(Graph& g, const BufferUses& u, size_t i, const TensorRef& sum, std::vector<bool>& drop,
                        PassStats& stats) {
  Node& n = g.nodes[i];
  const DroppedCast dc = dropped_16bit_cast(g, u, sum, drop);
  const int cast = dc.cast >= 0 ? dc.cast : later_16bit_cast(g, u, sum);
  if (cast < 0 || drop[size_t(cast)]) return false;
  Node with_cast = n;
  with_cast.outputs.push_back(g.nodes[size_t(cast)].outputs[0]);
  with_cast.attrs.set("dtype", with_cast.outputs.back().dtype);
  with_cast.fused.push_back("copy");
  if (dc.cast >= 0) add_fused_dropout(with_cast, g.nodes[size_t(dc.mask)]);
  if (!call_supported(g, with_cast)) return false;
  n = std::move(with_cast);
  drop[size_t(cast)] = true;
  stats.fused += 1;
  if (dc.cast >= 0) {
    drop[size_t(dc.mul)] = drop[size_t(dc.mask)] = true;
    stats.fused += 2;
  }
  const int s = column_sums_of(g, u, i, n.outputs.back(), numel_of(n.outputs[1].shape), drop);
  if (s < 0) return true;
  const Node& sums = g.nodes[size_t(s)];
  const bool add = sums.attrs.b("accumulate", false);
  Node with_sums = n;
  with_sums.outputs.push_back(sums.outputs[0]);
  if (add) with_sums.inputs.insert(with_sums.inputs.begin() + 6, sums.outputs[0]);  // before a Philox state
  with_sums.attrs.set("column_sums", true).set("accumulate", add);
  if (sums.fused.empty())
    with_sums.fused.push_back("sum");  // summed into a buffer of its own
  else
    with_sums.fused.insert(with_sums.fused.end(), sums.fused.begin(), sums.fused.end());  // "sum" and "copy" or "add"
  if (!call_supported(g, with_sums)) return true;
  n = std::move(with_sums);
  drop[size_t(s)] = true;
  stats.fused += 1;
  return true;
}

}  // namespace

void fuse_norm_backward_add(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  Match m;
  auto matched = [&](size_t i, Why& why) { return (m = match(g, u, i, why)).add; };
  fuse_partners(
      g, kPass, "the residual's add", is_layer_norm_backward, matched, [&](size_t i, int, std::vector<bool>& drop) {
        Node& n = g.nodes[i];
        const Node& a = g.nodes[size_t(m.add)];
        Node fused{OpKind::LayerNormBackwardAdd, Attrs(), n.inputs, n.outputs, false, {"layer_norm_backward", "add"}};
        fused.inputs.push_back(a.inputs[size_t(m.operand)]);
        fused.outputs[0] = a.outputs[0];
        if (!call_supported(g, fused))
          return why_not(kPass, g, i, "the residual's add", "the device's kernel does not take the call");
        n = std::move(fused);
        drop[size_t(m.add)] = true;
        stats.fused += 1;
        take_cast_and_sums(g, u, i, a.outputs[0], drop, stats);
      });
  // A norm with no residual's add after it (a stack's last, before its head): its dx's 16-bit cast
  // and that copy's column sums join it all the same, the residual absent.
  const BufferUses v = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    Node& n = g.nodes[i];
    if (!is_layer_norm_backward(n)) return;
    const TensorRef dx = n.outputs[0];
    if (!is_contiguous(dx) || !internal_once(g, v, dx) || !device_supports(g, dx, OpKind::LayerNormBackwardAdd)) return;
    const int cast = later_16bit_cast(g, v, dx);
    if (cast < 0 || drop[size_t(cast)]) return;
    const Node before = n;
    n = Node{OpKind::LayerNormBackwardAdd, Attrs(), before.inputs, before.outputs, false, {"layer_norm_backward"}};
    n.inputs.push_back(std::nullopt);
    n.phase = before.phase;
    if (!call_supported(g, n) || !take_cast_and_sums(g, v, i, dx, drop, stats)) n = before;
  });
}

}  // namespace reel::compile
