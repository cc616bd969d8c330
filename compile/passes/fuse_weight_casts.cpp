// Weight-cast fusion: under autocast a step casts each parameter it multiplies to 16 bits once
// (common subexpressions leave one cast per weight and layout), in kernels of their own spread over
// the first micro-batch's forward:
//   w16_0 = copy(W0^T) to bf16 ... w16_k = copy(b_k) to bf16      (W^T: a tiled transpose; b: flat)
// Their inputs are parameters no node writes before the optimizer, their outputs fresh buffers, so
// every cast can run at the place of the first: they become one multi_tensor_cast node there, one
// launch for all (gpt-tiny: 25 casts, gpt-small: 49). Each output is written as its copy writes it:
// the same bits.
//
// The outputs then live from the step's first cast: memory that the plan holds a little longer in the
// first forward, where the step's peak is not (the arenas of the benchmark models do not change).
// Under a memory limit the pass does not run (Pass::under_memory_limit): recomputation places weight
// casts before their backward readers to lower the peak, and moving them back up would undo it.
#include <map>
#include <tuple>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "weight_casts";

// Node k as a cast of a parameter (an External buffer nothing writes before k) into a fresh buffer of
// its own on the same device, first touched here.
bool is_weight_cast(const Graph& g, const BufferUses& u, size_t k) {
  const Node& c = g.nodes[k];
  if (c.op != OpKind::Copy || c.in_place || c.recomputed || c.inputs.size() != 1 || !c.inputs[0] ||
      c.outputs.size() != 1)
    return false;
  const TensorRef &in = *c.inputs[0], &out = c.outputs[0];
  const Buffer &from = g.buffers[in.buffer], &to = g.buffers[out.buffer];
  if (from.kind != BufferKind::External || !is_floating(in.dtype) || !is_floating(out.dtype) || in.dtype == out.dtype ||
      from.device != to.device || in.shape != out.shape)
    return false;
  return !u.written_between(in.buffer, -1, int(k)) && internal_once(g, u, out) &&
         u.touches[out.buffer].front() == int(k);
}

}  // namespace

void fuse_weight_casts(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  // The casts of one (input dtype, output dtype, device), in graph order.
  std::map<std::tuple<int, int, int, int>, std::vector<size_t>> groups;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    if (!is_weight_cast(g, u, k)) continue;
    const Node& c = g.nodes[k];
    const Device d = g.buffers[c.outputs[0].buffer].device;
    groups[{int(c.inputs[0]->dtype), int(c.outputs[0].dtype), int(d.type), d.index}].push_back(k);
  }
  std::vector<bool> drop(g.nodes.size(), false);
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    const Node& first = g.nodes[members[0]];
    if (!device_supports(g, first.outputs[0], OpKind::MultiTensorCast)) {
      why_not(kPass, g, members[0], "the other weight casts", "the device has no multi_tensor_cast");
      continue;
    }
    Node fused{OpKind::MultiTensorCast, Attrs().set("dtype", first.outputs[0].dtype), {}, {}, false, {}};
    fused.phase = first.phase;
    for (size_t k : members) {
      fused.inputs.push_back(g.nodes[k].inputs[0]);
      fused.outputs.push_back(g.nodes[k].outputs[0]);
      fused.fused.push_back("copy");
    }
    if (!call_supported(g, fused)) {
      why_not(kPass, g, members[0], "the other weight casts", "the device's kernel does not take the call");
      continue;
    }
    g.nodes[members[0]] = std::move(fused);
    for (size_t i = 1; i < members.size(); ++i) drop[members[i]] = true;
    stats.fused += members.size() - 1;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
