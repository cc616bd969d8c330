// Constant folding: a node with no inputs, or only constant ones, whose outputs are Internal buffers
// written by no other node (position ids, causal masks, their casts) runs once at build time; its
// outputs become External constants of the plan, bound like parameters. Random ops are never folded:
// each run draws fresh numbers (Graph::random_sources).
#include "compile/passes/passes.h"
#include "kernels/dispatch.h"

namespace reel::compile {

void fold_constants(Graph& g, PassStats& stats) {
  std::vector<int> writers(g.buffers.size(), 0);
  for (const Node& n : g.nodes)
    for (const TensorRef& r : n.outputs) writers[r.buffer] += 1;
  std::vector<bool> constant(g.buffers.size(), false);
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    bool foldable = !n.in_place && !n.outputs.empty() && !is_random_op(n.op);
    for (const auto& r : n.inputs) foldable = foldable && (!r || constant[r->buffer]);
    for (const TensorRef& r : n.outputs)
      foldable = foldable && g.buffers[r.buffer].kind == BufferKind::Internal && writers[r.buffer] == 1;
    if (!foldable) {
      kept.push_back(std::move(n));
      continue;
    }
    // Give the outputs memory of their own, run the node once, keep the results as constants.
    std::vector<Tensor> in, out;
    for (const TensorRef& r : n.outputs) {
      Buffer& b = g.buffers[r.buffer];
      b.storage = std::make_shared<Storage>(std::max<size_t>(b.nbytes, 1), b.device);
      b.kind = BufferKind::External;
      constant[r.buffer] = true;
      out.push_back(view_of(b.storage, 0, r));
    }
    for (const auto& r : n.inputs) in.push_back(r ? view_of(g.buffers[r->buffer].storage, 0, *r) : Tensor());
    run_kernel(n.op, in, out, n.attrs);
    ++stats.folded;
  }
  g.nodes = std::move(kept);
}


}  // namespace reel::compile
