// Lowering an elementwise group to a fused_elementwise node (see lower_elementwise.h).
#include "compile/codegen/lower_elementwise.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "kernels/fused_expr.h"
#include "tensor/log.h"

namespace reel::compile {

BufferReaders::BufferReaders(const Graph& g) : count(g.buffers.size(), 0), graph_output(g.buffers.size(), false) {
  for (const Node& n : g.nodes)
    for (const auto& r : n.inputs)
      if (r) count[size_t(r->buffer)] += 1;
  for (const TensorRef& r : g.outputs) graph_output[size_t(r.buffer)] = true;
}

namespace {

// The op's scalar attrs as the instruction's p0, p1.
std::pair<double, double> scalar_attrs(const Node& n) {
  switch (n.op) {
    case OpKind::PowScalar: return {n.attrs.f("exponent"), 0.0};
    case OpKind::AddScalar: case OpKind::MulScalar: case OpKind::MaskedFill: return {n.attrs.f("value"), 0.0};
    case OpKind::ClampScalar: return {n.attrs.f("min", -INFINITY), n.attrs.f("max", INFINITY)};
    default: return {0.0, 0.0};
  }
}

struct Fused {
  FusedExpr expr;
  std::vector<TensorRef> inputs, outputs;
  std::vector<TensorRef> states;  // the Philox states its dropout masks read, after the inputs
};

// A dropout_mask node's random instruction, reading its Philox state (if any) as one of f's states.
int random_instr(Fused& f, const Node& n) {
  int state = -1;
  if (!n.inputs.empty() && n.inputs[0]) {
    for (size_t k = 0; k < f.states.size() && state < 0; ++k)
      if (same_ref(f.states[k], *n.inputs[0])) state = int(k);
    if (state < 0) {
      f.states.push_back(*n.inputs[0]);
      state = int(f.states.size()) - 1;
    }
  }
  return f.expr.random(state, n.outputs[0].dtype, n.attrs.f("p"), uint64_t(n.attrs.i("seed")),
                       uint64_t(n.attrs.i("offset")));
}

// The expression of nodes [i, j): loads of every ref first read from memory, the ops in order (a
// ref written earlier in the group is its register), stores of the written refs someone else needs.
Fused build_expr(const Graph& g, size_t i, size_t j, const BufferReaders& readers) {
  Fused f;
  std::vector<std::pair<TensorRef, int>> value;  // the register holding each ref's current value
  auto find = [&](const TensorRef& r) {
    for (auto& v : value)
      if (same_ref(v.first, r)) return &v;
    return static_cast<std::pair<TensorRef, int>*>(nullptr);
  };
  std::vector<TensorRef> written;
  std::vector<int> reads_inside(g.buffers.size(), 0);
  for (size_t k = i; k < j; ++k) {
    const Node& n = g.nodes[k];
    std::vector<int> args;
    const bool mask = n.op == OpKind::DropoutMask;
    for (const auto& r : n.inputs) {
      if (mask) break;  // its state is not loaded per element
      reads_inside[size_t(r->buffer)] += 1;
      auto* v = find(*r);
      if (!v) {
        f.inputs.push_back(*r);
        value.emplace_back(*r, f.expr.load(int(f.inputs.size()) - 1, r->dtype));
        v = &value.back();
      }
      args.push_back(v->second);
    }
    const TensorRef& w = n.outputs[0];
    auto [p0, p1] = scalar_attrs(n);
    const int reg = mask                   ? random_instr(f, n)
                    : n.op == OpKind::Copy ? f.expr.cast(args[0], w.dtype)
                                           : f.expr.op(n.op, args, w.dtype, p0, p1);
    if (auto* v = find(w)) v->second = reg;
    else value.emplace_back(w, reg);
    if (std::none_of(written.begin(), written.end(), [&](const TensorRef& q) { return same_ref(q, w); }))
      written.push_back(w);
  }
  auto needed = [&](const TensorRef& w) {
    const size_t b = size_t(w.buffer);
    return g.buffers[b].kind != BufferKind::Internal || readers.graph_output[b] || readers.count[b] > reads_inside[b];
  };
  for (const TensorRef& w : written) {
    // Dead-code elimination ran first, so the last value is always needed; keep one output regardless.
    if (!needed(w) && !(&w == &written.back() && f.outputs.empty())) continue;
    f.outputs.push_back(w);
    f.expr.store(int(f.outputs.size()) - 1, find(w)->second, w.dtype);
  }
  return f;
}

}  // namespace

Node lower_elementwise_group(const Graph& g, size_t i, size_t j, const BufferReaders& readers) {
  Fused f = build_expr(g, i, j, readers);
  const Node& last = g.nodes[j - 1];
  const Shape& shape = last.outputs[0].shape;
  const Device device = g.buffers[last.outputs[0].buffer].device;
  Node n{OpKind::FusedElementwise, fused_elementwise_attrs(f.expr, shape, device), {}, f.outputs, false, {}};
  std::string label;
  for (size_t k = i; k < j; ++k) {
    n.fused.push_back(op_name(g.nodes[k].op));
    label += (k > i ? " " : "") + n.fused.back();
    n.in_place = n.in_place || g.nodes[k].in_place;
  }
  for (const TensorRef& r : f.inputs) n.inputs.emplace_back(r);
  for (const TensorRef& r : f.states) n.inputs.emplace_back(r);
  if (log_enabled("fusion"))
    log_line("fusion", detail::cat("fused ", label, " over ", shape_str(shape), " on ", device.str(), ": ", f.inputs.size(),
                              " inputs, ", f.outputs.size(), " outputs\n", f.expr.str()));
  return n;
}


}  // namespace reel::compile
