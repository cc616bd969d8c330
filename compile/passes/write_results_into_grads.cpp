// Results written into gradients: a parameter's gradient is a copy of what its backward computed in
// the first micro-batch (AccumulateGrad's grad = result) and that result added in the later ones:
//   i: ..., r, ... = op(...)       (a norm backward's dweight and dbias, say)
//   j: grad = copy(r)              (grad made here: no node touched it before)
//   j: grad += r                   (a later micro-batch)
// For a copy, node i writes r straight into the gradient's memory and j goes: one kernel fewer per
// such parameter and step, the same bits (a copy of r is r). For the adds, a group or batch norm's
// backward whose dweight and dbias both go into gradients so adds them itself (attr accumulate: the
// gradients become its last two inputs and its dw, db outputs; each sum added as the add op adds
// it, the same bits); other producers' adds stay for elementwise fusion, which gathers them by shape
// (a column sum's are sums_into_grads'). Applies when r is an Internal buffer written by i alone
// (not in place) and read by j alone, wholly, with the gradient's dtype and element count, both
// contiguous, and nothing touches the gradient between i and j. Runs after the fusion passes that
// rewrite the producers (a norm's backward joined with its residual's add, its relu, its pool), before
// elementwise fusion would take the copy or the add into a kernel of its own.
#include <array>
#include <map>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "results_into_grads";

// r's geometry in the gradient z's memory.
TensorRef in_gradient(const TensorRef& r, const TensorRef& z) {
  return TensorRef{z.buffer, r.shape, r.strides, z.offset, r.dtype};
}

bool is_group_or_batch_norm_backward(const Node& n) {
  return (n.op == OpKind::GroupNormBackward || n.op == OpKind::BatchNormBackward) && n.outputs.size() == 3 &&
         !n.attrs.b("accumulate", false);
}

}  // namespace

void write_results_into_grads(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  std::map<int, std::array<int, 2>> norm_adds;  // a norm backward -> the adds of its dw and db (or -1)
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    Why why;
    const std::optional<ResultWrite> w = whole_result_written_to_grad(g, u, j, why);
    if (!w) {
      if (!why.reason().empty()) why_not(kPass, g, j, "the node that makes what it copies", why.reason());
      continue;
    }
    if (drop[size_t(w->producer)]) continue;
    if (w->add) {
      if (is_group_or_batch_norm_backward(g.nodes[size_t(w->producer)]) && (w->output == 1 || w->output == 2))
        norm_adds.try_emplace(w->producer, std::array<int, 2>{-1, -1}).first->second[w->output - 1] = int(j);
      continue;  // other producers would have to add, which only sums_into_grads teaches
    }
    TensorRef& out = g.nodes[size_t(w->producer)].outputs[w->output];
    out = in_gradient(out, g.nodes[j].outputs[0]);
    drop[j] = true;
    ++stats.fused;
  }
  for (const auto& [i, adds] : norm_adds) {
    if (adds[0] < 0 || adds[1] < 0) {
      why_not(kPass, g, size_t(i), "the adds of its parameter gradients", "only one of dw and db goes into a gradient");
      continue;
    }
    Node m = g.nodes[size_t(i)];
    if (m.fused.empty()) m.fused.push_back(op_name(m.op));
    for (int k : {0, 1}) {
      const TensorRef& z = g.nodes[size_t(adds[k])].outputs[0];
      m.outputs[size_t(k) + 1] = in_gradient(m.outputs[size_t(k) + 1], z);
      m.inputs.push_back(m.outputs[size_t(k) + 1]);
      m.fused.push_back("add");
    }
    m.attrs.set("accumulate", true);
    if (!call_supported(g, m)) {
      why_not(kPass, g, size_t(i), "the adds of its parameter gradients", "the device's kernel does not take the call");
      continue;
    }
    g.nodes[size_t(i)] = std::move(m);
    drop[size_t(adds[0])] = drop[size_t(adds[1])] = true;
    stats.fused += 2;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
