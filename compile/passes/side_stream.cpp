// Column sums on a second stream beside the main one (see side_stream.h).
#include "compile/passes/side_stream.h"

#include <algorithm>

#include "compile/passes/pattern.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "side_stream";

// Under REEL_LOG=fusion, why node i stays on the main stream.
void stays(size_t i, const char* reason) {
  if (log_enabled("fusion")) log_line("fusion", detail::cat(kPass, ": column_sums k", i, " stays on the main stream: ", reason));
}

bool writes(const Node& n, int buffer) {
  for (const TensorRef& r : n.outputs)
    if (r.buffer == buffer) return true;
  return false;
}

// The join of side node i: the first later main-stream node that touches one of its outputs or
// writes one of its inputs, and at the latest the node after the main stream's last reader of its
// inputs (so that they live no longer than they would on one stream: a gradient's sum is otherwise
// read by nothing until the optimizer, and holding the gradient till then would hold the step's
// memory); nodes.size() when neither comes.
int join_of(const Graph& g, size_t i) {
  const Node& side = g.nodes[i];
  int last_reader = int(i);
  for (size_t k = i + 1; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (n.stream != 0) continue;
    for (const TensorRef& out : side.outputs)
      if (refers_to(n, out.buffer)) return std::min(int(k), last_reader + 1);
    for (const auto& in : side.inputs) {
      if (!in) continue;
      if (writes(n, in->buffer)) return std::min(int(k), last_reader + 1);
      if (refers_to(n, in->buffer)) last_reader = int(k);
    }
  }
  bool output_of_graph = false;
  for (const auto& in : side.inputs)
    for (const TensorRef& o : g.outputs) output_of_graph = output_of_graph || (in && o.buffer == in->buffer);
  return output_of_graph ? int(g.nodes.size()) : std::min(int(g.nodes.size()), last_reader + 1);
}

}  // namespace

std::vector<int> side_joins(const Graph& g) {
  std::vector<int> joins(g.nodes.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].stream != 0) joins[i] = join_of(g, i);
  return joins;
}

void run_column_sums_beside(Graph& g, PassStats& stats) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.op != OpKind::ColumnSums || n.outputs.empty()) continue;
    if (!g.buffers[size_t(n.outputs[0].buffer)].device.is_cuda()) {
      stays(i, "it is not on a GPU (a CPU plan runs one kernel at a time)");
      continue;
    }
    n.stream = 1;
    if (join_of(g, i) == int(i) + 1) {
      n.stream = 0;
      stays(i, "the node right after it reads its sums or writes what it reads");
      continue;
    }
    ++stats.beside;
  }
}

}  // namespace reel::compile
