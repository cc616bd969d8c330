// A layer norm backward's parameter sums as a node of their own (split_norm_param_sums.h).
#include "compile/passes/split_norm_param_sums.h"

#include <string>
#include <utility>
#include <vector>

#include "compile/passes/memory_plan.h"
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

// A fresh contiguous f32 Internal buffer of `shape` on `device`.
TensorRef new_f32_buffer(Graph& g, const Shape& shape, const Device& device) {
  Buffer b;
  b.id = int(g.buffers.size());
  b.kind = BufferKind::Internal;
  b.nbytes = size_t(numel_of(shape)) * sizeof(float);
  b.device = device;
  g.buffers.push_back(std::move(b));
  return TensorRef{int(g.buffers.size()) - 1, shape, contiguous_strides(shape), 0, DType::f32};
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
  const TensorRef part = new_f32_buffer(g, {parts, sums ? 3 : 2, cols}, device);

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

// Whether node n reads or writes a buffer that sums node s reads (but its partials) or writes.
bool touches_sums_of(const Node& n, const Node& s) {
  for (const TensorRef& o : s.outputs)
    if (refers_to(n, o.buffer)) return true;
  return s.inputs.size() > 1 && s.inputs[1] && refers_to(n, s.inputs[1]->buffer);
}

// Sums node s folded into the norm backward `into` (layer_norm_backward_partials, no finish yet): its
// inputs before the state, its outputs after the norm's, attrs finish and finish_accumulate.
Node with_sums_of(const Node& into, const Node& s) {
  Node n = into;
  n.inputs.insert(n.inputs.begin() + long(kNormInputs), s.inputs.begin(), s.inputs.end());  // the state stays last
  n.outputs.insert(n.outputs.end(), s.outputs.begin(), s.outputs.end());
  n.attrs.set("finish", s.inputs[0]->shape[1]).set("finish_accumulate", s.attrs.b("accumulate", false));
  n.in_place = n.in_place || s.in_place;
  n.fused.insert(n.fused.end(), s.fused.begin(), s.fused.end());
  return n;
}

// Each layer_norm_backward_add the device leaves partials for, as its two nodes, the sums right after.
void split_each(Graph& g, PassStats& stats, const NormPartsFn& parts, bool check_calls) {
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + g.nodes.size() / 8);
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
    stats.fused -= std::min<size_t>(stats.fused, 1);
  }
  g.nodes = std::move(nodes);
}

// The next norm backward after sums node s (at i) that may add its partials up: in s's micro-batch,
// with none yet, and no node between them touching what s writes or adds to; -1 if none.
int next_to_fold_into(const Graph& g, size_t i) {
  const Node& s = g.nodes[i];
  for (size_t j = i + 1; j < g.nodes.size(); ++j) {
    const Node& n = g.nodes[j];
    if (n.phase != s.phase) return -1;
    if (n.op == OpKind::LayerNormBackwardPartials && !n.attrs.has("finish") && !touches_sums_of(n, s)) return int(j);
    if (touches_sums_of(n, s)) return -1;
  }
  return -1;
}

// Each sums node folded into the next norm backward that may add its partials up, where the planned
// peak stays where it was (the partials then live until that node) and the device takes the call.
void fold_each(Graph& g, PassStats& stats, bool check_calls) {
  size_t peak = 0;
  for (size_t i = 0; i < g.nodes.size();) {
    if (g.nodes[i].op != OpKind::LayerNormParamSums) {
      ++i;
      continue;
    }
    const int j = next_to_fold_into(g, i);
    if (j < 0) {
      why_not(kPass, g, i, "the next norm backward of its micro-batch", "none may add its partials up");
      ++i;
      continue;
    }
    Node folded = with_sums_of(g.nodes[size_t(j)], g.nodes[i]);
    if (check_calls && !call_supported(g, folded)) {
      why_not(kPass, g, i, "the next norm backward", "the device's kernel does not take the call");
      ++i;
      continue;
    }
    if (peak == 0) peak = planned_peak(g);
    Graph trial = g;
    trial.nodes[size_t(j)] = std::move(folded);
    trial.nodes.erase(trial.nodes.begin() + long(i));
    if (planned_peak(trial) > peak) {
      why_not(kPass, g, i, "the next norm backward", "its partials held until there would raise the planned peak");
      ++i;
      continue;
    }
    g.nodes = std::move(trial.nodes);
    stats.fused += 1;  // i now holds the node after the folded one
  }
}

}  // namespace

void split_norm_param_sums(Graph& g, PassStats& stats) {
  split_each(g, stats, device_parts, true);
  fold_each(g, stats, true);
}

void split_norm_param_sums(Graph& g, PassStats& stats, const NormPartsFn& parts) {
  split_each(g, stats, parts, false);
  fold_each(g, stats, false);
}

}  // namespace reel::compile
