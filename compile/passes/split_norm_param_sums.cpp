// A layer norm backward's parameter sums as a node of their own (split_norm_param_sums.h).
#include "compile/passes/split_norm_param_sums.h"

#include <string>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "split_norm_param_sums";

// layer_norm_backward_add's inputs: g, x, w?, mean, rstd, residual?[, sums_in][, state].
constexpr size_t kNormInputs = 6;

// The partials node's inputs and attrs for node n: n's without the sums to add to, accumulate off.
std::vector<std::optional<TensorRef>> partials_inputs(const Node& n) {
  std::vector<std::optional<TensorRef>> in(n.inputs.begin(), n.inputs.begin() + kNormInputs);
  if (n.attrs.b("dropout_state", false)) in.push_back(n.inputs.back());
  return in;
}
Attrs partials_attrs(const Node& n, int64_t parts) { return Attrs(n.attrs).set("accumulate", false).set("parts", parts); }

// The device's answer: how many blocks its backward runs for n's call (0: none takes it).
int64_t device_parts(const Graph& g, const Node& n) {
  std::vector<Tensor> in;
  for (const auto& r : partials_inputs(n)) in.push_back(r ? traced(g, *r) : Tensor());
  return kernel_parts(OpKind::LayerNormBackwardPartials, in, partials_attrs(n, 1));
}

// The two nodes that stand for layer_norm_backward_add node n, or none with the reason in `why`; with
// `check_calls`, only where the device's kernels take both calls.
std::optional<std::pair<Node, Node>> split(Graph& g, const Node& n, const NormPartsFn& parts_of, bool check_calls,
                                           Why& why) {
  const bool copy16 = n.attrs.has("dtype"), sums = n.attrs.b("column_sums", false);
  const bool accumulate = n.attrs.b("accumulate", false);
  if (!why(n.inputs.size() >= kNormInputs && n.inputs[1] && n.inputs[1]->dtype == DType::f32 &&
               n.outputs.size() == size_t(3 + copy16 + sums) && n.outputs[1].shape.size() == 1,
           "its x is not f32 or its dw not one dim"))
    return std::nullopt;
  const int64_t parts = parts_of(g, n);
  if (!why(parts > 0, "the device's kernel leaves no partial sums for it (not f32 rows of 128 to 1024 columns)"))
    return std::nullopt;
  const int64_t cols = n.outputs[1].shape[0];
  const Device device = g.buffers[size_t(n.outputs[0].buffer)].device;
  const TensorRef part = new_internal_buffer(g, {parts, sums ? 3 : 2, cols}, DType::f32, device);

  Node backward = n;
  backward.op = OpKind::LayerNormBackwardPartials;
  backward.attrs = partials_attrs(n, parts);
  backward.inputs = partials_inputs(n);
  backward.outputs = {n.outputs[0], part};
  if (copy16) backward.outputs.push_back(n.outputs[3]);
  backward.in_place = false;

  Node finish = n;
  finish.op = OpKind::LayerNormParamSums;
  finish.attrs = Attrs().set("accumulate", accumulate);
  finish.inputs = {part};
  if (accumulate) finish.inputs.push_back(n.inputs[kNormInputs]);
  finish.outputs = {n.outputs[1], n.outputs[2]};
  if (sums) finish.outputs.push_back(n.outputs[3 + copy16]);
  finish.fused = {"sum"};
  finish.in_place = accumulate && n.in_place;
  if (check_calls && !why(call_supported(g, backward) && call_supported(g, finish),
                          "the device's kernels do not take the two calls")) {
    g.buffers.pop_back();  // the partials' buffer, which nothing refers to
    return std::nullopt;
  }
  return std::make_pair(std::move(backward), std::move(finish));
}

void split_each(Graph& g, PassStats& stats, const NormPartsFn& parts, bool check_calls) {
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    Why why;
    std::optional<std::pair<Node, Node>> two;
    if (n.op == OpKind::LayerNormBackwardAdd) {
      two = split(g, n, parts, check_calls, why);
      if (!two) why_not(kPass, g, i, "a node of its own for its sums", why.reason());
    }
    if (!two) {
      nodes.push_back(std::move(n));
      continue;
    }
    nodes.push_back(std::move(two->first));
    nodes.push_back(std::move(two->second));
  }
  stats.fused -= std::min(stats.fused, nodes.size() - g.nodes.size());
  g.nodes = std::move(nodes);
}

}  // namespace

void split_norm_param_sums(Graph& g, PassStats& stats) { split_each(g, stats, device_parts, true); }

void split_norm_param_sums(Graph& g, PassStats& stats, const NormPartsFn& parts) { split_each(g, stats, parts, false); }

}  // namespace reel::compile
