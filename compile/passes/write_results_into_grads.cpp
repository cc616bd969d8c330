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

void write_results_into_grads(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    Why why;
    const std::optional<ResultWrite> w = whole_result_written_to_grad(g, u, j, why);
    if (!w || w->add) {  // an add: the producer would have to add, which only sums_into_grads teaches
      if (!why.reason().empty())
        why_not("results_into_grads", g, j, "the node that makes what it copies", why.reason());
      continue;
    }
    if (drop[size_t(w->producer)]) continue;
    const TensorRef& z = g.nodes[j].outputs[0];
    TensorRef& out = g.nodes[size_t(w->producer)].outputs[w->output];
    out = TensorRef{z.buffer, out.shape, out.strides, z.offset, out.dtype};
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
