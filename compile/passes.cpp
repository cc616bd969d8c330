// Dead-code elimination and constant folding (see passes.h).
#include "compile/passes.h"

#include <algorithm>
#include <vector>

#include "kernels/dispatch.h"

namespace reel::compile {

void eliminate_dead_code(Graph& g, PassStats& stats) {
  std::vector<bool> read_later(g.buffers.size(), false);
  for (const TensorRef& r : g.outputs) read_later[r.buffer] = true;
  std::vector<bool> keep(g.nodes.size(), true);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool dead = !n.outputs.empty();
    for (const TensorRef& r : n.outputs)
      dead = dead && g.buffers[r.buffer].kind == BufferKind::Internal && !read_later[r.buffer];
    if (dead) {
      keep[i] = false;
      ++stats.dead;
      continue;
    }
    for (const auto& r : n.inputs)
      if (r) read_later[r->buffer] = true;
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (keep[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

void fold_constants(Graph& g, PassStats& stats) {
  std::vector<int> writers(g.buffers.size(), 0);
  for (const Node& n : g.nodes)
    for (const TensorRef& r : n.outputs) writers[r.buffer] += 1;
  std::vector<bool> constant(g.buffers.size(), false);
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    bool foldable = !n.in_place && !n.kernel && !n.outputs.empty();
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
