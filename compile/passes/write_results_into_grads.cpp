// Results written into new gradients: the first micro-batch's gradient of a parameter is a copy of
// what its backward computed (AccumulateGrad's grad = result, where the later micro-batches add):
//   i: ..., r, ... = op(...)       (a norm backward's dweight and dbias, say)
//   j: grad = copy(r)              (grad made here: no node touched it before)
// Node i writes r straight into the gradient's memory and j goes: one kernel fewer per such
// parameter and step, the same bits (a copy of r is r). The later micro-batches' adds stay for
// elementwise fusion, which gathers them by shape. Applies when r is an Internal buffer written by
// i alone (not in place) and read by j alone, wholly, with the gradient's dtype and element count,
// both contiguous, and nothing touches the gradient between i and j. Runs after the fusion passes
// that rewrite the producers (a norm's backward joined with its residual's add), before elementwise
// fusion would take the copy into a kernel of its own.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

// The output of node i that is buffer b, or null.
const TensorRef* output_of(const Node& n, int b) {
  for (const TensorRef& r : n.outputs)
    if (r.buffer == b) return &r;
  return nullptr;
}

// Node j as the copy that makes a gradient from node i's whole result: i, or -1 with the reason.
int copied_result(const Graph& g, const BufferUses& u, size_t j, Why& why) {
  const Node& c = g.nodes[j];
  const std::optional<GradientWrite> write = gradient_write(c);
  if (!write || write->add) return -1;
  const TensorRef &r = *write->source, &z = c.outputs[0];
  const int i = u.producer(r.buffer);
  if (!why(i >= 0 && i < int(j), "no node before it writes what it copies")) return -1;
  const Node& n = g.nodes[size_t(i)];
  const TensorRef* made = output_of(n, r.buffer);
  if (!why(!n.in_place && made && internal_once(g, u, r) && u.readers[r.buffer].size() == 1,
           "the result is written or read by other nodes too"))
    return -1;
  const int64_t count = numel_of(made->shape);
  if (!why(r.offset == made->offset && numel_of(r.shape) == count && is_contiguous(r) && is_contiguous(*made) &&
               g.buffers[r.buffer].nbytes == made->nbytes(),
           "it copies part of the result, or through another layout"))
    return -1;
  if (!why(z.dtype == made->dtype && numel_of(z.shape) == count && is_contiguous(z),
           "the gradient has another dtype or layout"))
    return -1;
  if (!why(may_write_gradient_early(u, z, i, int(j), false), "the gradient is touched before the copy")) return -1;
  return i;
}

}  // namespace

void write_results_into_grads(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    Why why;
    const int i = copied_result(g, u, j, why);
    if (i < 0) {
      if (!why.reason().empty())
        why_not("results_into_grads", g, j, "the node that makes what it copies", why.reason());
      continue;
    }
    if (drop[size_t(i)]) continue;
    const TensorRef& z = g.nodes[j].outputs[0];
    const int from = g.nodes[j].inputs[0]->buffer;
    for (TensorRef& out : g.nodes[size_t(i)].outputs)
      if (out.buffer == from) out = TensorRef{z.buffer, out.shape, out.strides, z.offset, out.dtype};
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
