// Dead-code elimination: a node whose every output is an Internal buffer that nothing later reads
// (and that is not a graph output) is dropped; one walk from the last node back, so a chain of dead
// nodes goes at once. Nodes that write External memory (parameters, optimizer state) always stay.
#include "compile/passes/passes.h"

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


}  // namespace reel::compile
