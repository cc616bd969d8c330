// Horizontal (multi-tensor) fusion of the optimizer step.
//
// A traced optimizer step is one adamw_step (or sgd_step) node per parameter, each a tiny kernel; a
// GPT of 12 layers has 101 of them. They are independent updates that read the same step-wide
// tensors (found_inf, lr, and AdamW's step count), so a run of consecutive such nodes with the same
// attrs and the same step-wide refs becomes ONE multi_tensor_adamw (multi_tensor_sgd) node that
// updates every (param, grad, state) of the run: on the GPU a single multi-tensor launch (one per
// dtype and per 128 tensors), on the CPU one OpenMP loop over chunks of every tensor.
//
// The fused node, for tensors 0..k-1 of the run:
//   adamw_step  inputs  p0 g0 m0 v0  p1 g1 m1 v1 ...  found_inf? lr step   outputs  p0 m0 v0  p1 m1 v1 ...
//   sgd_step    inputs  p0 g0 b0?    p1 g1 b1?    ...  found_inf? lr        outputs  p0 b0?    p1 b1?    ...
// (b: the momentum buffer, present in every node of a run or in none). `fused` lists the k ops, the
// node is in_place, and stats.fused grows by k - 1. Every ref read or written stays on the node, so
// memory planning and dead-code elimination see the same lifetimes as before.
//
// Math: kernels/optim_math.h, the formula of the per-tensor kernels, with the same per-step
// coefficients: a fused plan is bit-identical to an unfused one. Nodes join a run only when their
// memory is disjoint from what the rest of the run writes (updating them at once cannot change what
// any of them reads). CUDA nodes fuse only in a build with the CUDA backend.
#include "compile/passes/passes.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/multi_tensor.h"

namespace reel::compile {
namespace {

// The per-tensor op of a run, and the multi-tensor op it becomes.
OpKind multi_tensor_op(OpKind single) {
  return single == OpKind::AdamWStep ? OpKind::MultiTensorAdamW : single == OpKind::SgdStep ? OpKind::MultiTensorSgd
                                                                                             : OpKind::Count_;
}

const MultiTensorLayout* layout_of(OpKind single) {
  const OpKind multi = multi_tensor_op(single);
  return multi == OpKind::Count_ ? nullptr : &multi_tensor_layout(multi);
}

bool same_ref(const std::optional<TensorRef>& a, const std::optional<TensorRef>& b) {
  return a.has_value() == b.has_value() && (!a || same_ref(*a, *b));
}

// The bytes a ref spans in its buffer (optimizer tensors are contiguous: the schema checks it).
struct Span {
  int buffer;
  size_t begin, end;
};

Span span_of(const TensorRef& r) {
  const size_t begin = size_t(r.offset) * dtype_size(r.dtype);
  return {r.buffer, begin, begin + r.nbytes()};
}

bool overlaps(const Span& a, const Span& b) { return a.buffer == b.buffer && a.begin < b.end && b.begin < a.end; }

bool overlaps_any(const Span& s, const std::vector<Span>& set) {
  return std::any_of(set.begin(), set.end(), [&](const Span& t) { return overlaps(s, t); });
}

// The one device every ref of node n lives on, or nullopt if they differ.
std::optional<Device> device_of(const Graph& g, const Node& n) {
  std::optional<Device> d;
  auto see = [&](const TensorRef& r) {
    const Device& b = g.buffers[r.buffer].device;
    if (!d) d = b;
    return *d == b;
  };
  for (const auto& r : n.inputs)
    if (r && !see(*r)) return std::nullopt;
  for (const TensorRef& r : n.outputs)
    if (!see(r)) return std::nullopt;
  return d;
}

// A node the pass can take: a per-tensor optimizer op, on a device with the multi-tensor op.
bool candidate(const Graph& g, const Node& n) {
  const MultiTensorLayout* l = layout_of(n.op);
  if (!l || n.inputs.size() != l->per_tensor + l->shared || n.outputs.empty()) return false;
  if (!n.inputs[0] || !n.inputs[1]) return false;
  std::optional<Device> d = device_of(g, n);
  return d && supports(multi_tensor_op(n.op), d->type);
}

// A run being grown: its first node and the memory its members touch.
struct Run {
  const Node* first = nullptr;
  std::optional<Device> device;
  std::vector<Span> written, touched, shared;
};

// Whether n (a candidate) may join `run`: the same op, attrs, step-wide refs, device and optional
// inputs, and memory that cannot see the other members' updates (nor change what they read).
bool joins(const Graph& g, const Run& run, const Node& n) {
  const Node& f = *run.first;
  const MultiTensorLayout& l = *layout_of(f.op);
  if (n.op != f.op || n.attrs.items() != f.attrs.items() || n.outputs.size() != f.outputs.size()) return false;
  if (device_of(g, n) != run.device) return false;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i >= l.per_tensor && !same_ref(n.inputs[i], f.inputs[i])) return false;
    if (i < l.per_tensor && n.inputs[i].has_value() != f.inputs[i].has_value()) return false;
  }
  for (size_t i = 0; i < l.per_tensor; ++i)
    if (n.inputs[i] && overlaps_any(span_of(*n.inputs[i]), run.written)) return false;
  for (const TensorRef& r : n.outputs) {
    const Span s = span_of(r);
    if (overlaps_any(s, run.touched) || overlaps_any(s, run.shared)) return false;
  }
  return true;
}

void add_to_run(const Graph& g, Run& run, const Node& n) {
  const MultiTensorLayout& l = *layout_of(n.op);
  if (!run.first) {
    run.first = &n;
    run.device = device_of(g, n);
    for (size_t i = l.per_tensor; i < n.inputs.size(); ++i)
      if (n.inputs[i]) run.shared.push_back(span_of(*n.inputs[i]));
  }
  for (size_t i = 0; i < l.per_tensor; ++i)
    if (n.inputs[i]) run.touched.push_back(span_of(*n.inputs[i]));
  for (const TensorRef& r : n.outputs) {
    run.written.push_back(span_of(r));
    run.touched.push_back(span_of(r));
  }
}

// The one node that replaces nodes [begin, end) (at least two, all of one run).
Node fuse_run(const std::vector<Node>& nodes, size_t begin, size_t end) {
  const Node& f = nodes[begin];
  const MultiTensorLayout& l = *layout_of(f.op);
  Node fused{multi_tensor_op(f.op), Attrs(f.attrs).set("tensors", int64_t(end - begin)), {}, {}, true, {}};
  for (size_t i = begin; i < end; ++i) {
    const Node& n = nodes[i];
    fused.inputs.insert(fused.inputs.end(), n.inputs.begin(), n.inputs.begin() + long(l.per_tensor));
    fused.outputs.insert(fused.outputs.end(), n.outputs.begin(), n.outputs.end());
    fused.fused.push_back(op_name(n.op));
  }
  fused.inputs.insert(fused.inputs.end(), f.inputs.begin() + long(l.per_tensor), f.inputs.end());
  return fused;
}

}  // namespace

void fuse_optimizer(Graph& g, PassStats& stats) {
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  size_t i = 0;
  while (i < g.nodes.size()) {
    if (!candidate(g, g.nodes[i])) {
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    Run run;
    add_to_run(g, run, g.nodes[i]);
    size_t j = i + 1;
    while (j < g.nodes.size() && candidate(g, g.nodes[j]) && joins(g, run, g.nodes[j]))
      add_to_run(g, run, g.nodes[j++]);
    if (j < g.nodes.size() && candidate(g, g.nodes[j]))
      why_not("optimizer", g, j, "the run before it",
              "another op or attrs, other step-wide inputs, or memory the run updates");
    if (j - i == 1) {
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    out.push_back(fuse_run(g.nodes, i, j));
    stats.fused += j - i - 1;
    i = j;
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
