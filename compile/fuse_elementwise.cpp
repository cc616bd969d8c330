// Elementwise fusion (see fuse_elementwise.h).
#include "compile/fuse_elementwise.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "compile/fused_expr.h"
#include "compile/log.h"
#include "compile/nvrtc.h"
#include "tensor/cuda.h"

namespace reel::compile {

namespace {

// Long chains spill registers on the GPU and gain little more; 32 nodes is far beyond the chains a
// training step has (bias + activation, residual adds, gradient accumulations, scalar updates).
constexpr size_t kMaxGroupNodes = 32;

// `in` broadcasts to `out` (NumPy rules).
bool broadcasts_to(const Shape& in, const Shape& out) {
  if (in.size() > out.size()) return false;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t s = in[in.size() - 1 - d], t = out[out.size() - 1 - d];
    if (s != t && s != 1) return false;
  }
  return true;
}

// Could `n` be a member of a group at all? (Membership also needs GroupState::accepts.)
bool fusable_node(const Graph& g, const Node& n) {
  if (n.kernel || n.outputs.size() != 1) return false;
  const int arity = n.op == OpKind::Copy ? 1 : fusable_arity(n.op);
  if (arity == 0 || int(n.inputs.size()) != arity) return false;
  const TensorRef& out = n.outputs[0];
  if (numel_of(out.shape) == 0 || !is_contiguous(out)) return false;
  const Device device = g.buffers[out.buffer].device;
  if (device.is_cuda() && !cuda::is_built()) return false;
  for (const auto& r : n.inputs) {
    if (!r || !(g.buffers[r->buffer].device == device) || !broadcasts_to(r->shape, out.shape)) return false;
    // Elementwise ops compute in their output's dtype (the schemas do not promote); only a copy casts.
    if (n.op != OpKind::Copy && r->dtype != out.dtype) return false;
  }
  return true;
}

// The buffers a group touches: the distinct refs of each, and whether the group writes it.
class GroupState {
 public:
  GroupState(const Graph& g, const Node& first)
      : shape_(first.outputs[0].shape), device_(g.buffers[first.outputs[0].buffer].device) {}

  // Same shape and device, room left, and every written buffer still seen through one ref.
  bool accepts(const Graph& g, const Node& n) const {
    if (nodes_ >= kMaxGroupNodes || n.outputs[0].shape != shape_ || !(g.buffers[n.outputs[0].buffer].device == device_))
      return false;
    std::unordered_map<int, Use> touched;  // the node's buffers as they would be after adding it
    auto note = [&](const TensorRef& r, bool write) {
      auto it = touched.find(r.buffer);
      if (it == touched.end()) {
        auto known = uses_.find(r.buffer);
        it = touched.emplace(r.buffer, known == uses_.end() ? Use{} : known->second).first;
      }
      it->second.add(r, write);
    };
    for (const auto& r : n.inputs) note(*r, false);
    note(n.outputs[0], true);
    for (const auto& [buffer, use] : touched)
      if (use.written && use.refs.size() > 1) return false;
    return true;
  }

  void add(const Node& n) {
    for (const auto& r : n.inputs) uses_[r->buffer].add(*r, false);
    uses_[n.outputs[0].buffer].add(n.outputs[0], true);
    ++nodes_;
  }

 private:
  struct Use {
    std::vector<TensorRef> refs;  // distinct
    bool written = false;
    void add(const TensorRef& r, bool write) {
      written = written || write;
      for (const TensorRef& q : refs)
        if (same_ref(q, r)) return;
      refs.push_back(r);
    }
  };
  Shape shape_;
  Device device_;
  size_t nodes_ = 0;
  std::unordered_map<int, Use> uses_;
};

// How far back a node may be moved to join its producer's group (a window keeps the pass linear).
constexpr size_t kMaxHoist = 16;

bool refers_to(const Node& n, int buffer) {
  for (const auto& r : n.inputs)
    if (r && r->buffer == buffer) return true;
  for (const TensorRef& r : n.outputs)
    if (r.buffer == buffer) return true;
  return false;
}

// A contiguous ref of `r`'s buffer, offset and dtype in `shape`.
TensorRef reshaped(const TensorRef& r, const Shape& shape) {
  return TensorRef{r.buffer, shape, contiguous_strides(shape), r.offset, r.dtype};
}

// An elementwise node over contiguous tensors of one size (no broadcast) computes element e from
// element e in linear order, whatever shape it is written in. When it reads the contiguous output of
// a fusable producer traced in another shape (heads merged by a reshape: (B, T, H, hd) then
// (B, T, H hd)), it is rewritten in the producer's shape, so that the two can form one group.
void reshape_to_producers(Graph& g) {
  std::vector<int> last_writer(g.buffers.size(), -1);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    Node& n = g.nodes[j];
    if (fusable_node(g, n) && !n.in_place) {
      const TensorRef& out = n.outputs[0];
      bool dense = true;
      for (const auto& r : n.inputs) dense = dense && is_contiguous(*r) && numel_of(r->shape) == numel_of(out.shape);
      for (const auto& r : n.inputs) {
        const int p = last_writer[size_t(r->buffer)];
        if (!dense || p < 0 || !fusable_node(g, g.nodes[size_t(p)])) continue;
        const TensorRef& made = g.nodes[size_t(p)].outputs[0];
        if (made.buffer != r->buffer || made.offset != r->offset || made.dtype != r->dtype || made.shape == out.shape ||
            numel_of(made.shape) != numel_of(out.shape))
          continue;
        for (auto& in : n.inputs) in = reshaped(*in, made.shape);
        n.outputs[0] = reshaped(out, made.shape);
        break;
      }
    }
    for (const TensorRef& r : n.outputs) last_writer[size_t(r.buffer)] = int(j);
  }
}

// Moves each fusable node up to just after the last writer of its inputs when that writer is a
// fusable node of the same shape, so that a chain split by unrelated nodes (attention scales q, then
// copies k, then casts q) becomes consecutive and one group. Legal because nothing between the two
// positions writes the node's inputs (the writer is their last) or touches its outputs.
void hoist_consumers(Graph& g) {
  std::vector<int> last_writer(g.buffers.size(), -1);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    Node& n = g.nodes[j];
    int q = -1;  // the last writer of any input of n, before n
    for (const auto& r : n.inputs)
      if (r) q = std::max(q, last_writer[size_t(r->buffer)]);
    const bool movable = q >= 0 && size_t(q) + 1 < j && j - size_t(q) <= kMaxHoist && fusable_node(g, n) &&
                         fusable_node(g, g.nodes[size_t(q)]) &&
                         g.nodes[size_t(q)].outputs[0].shape == n.outputs[0].shape;
    bool clear = movable;
    for (size_t k = size_t(q) + 1; clear && k < j; ++k)
      for (const TensorRef& out : n.outputs) clear = clear && !refers_to(g.nodes[k], out.buffer);
    if (clear) std::rotate(g.nodes.begin() + q + 1, g.nodes.begin() + int64_t(j), g.nodes.begin() + int64_t(j) + 1);
    // Writers by position after the move: the moved node now sits at q + 1, the others one later.
    if (clear) {
      std::fill(last_writer.begin(), last_writer.end(), -1);
      for (size_t k = 0; k <= j; ++k)
        for (const TensorRef& r : g.nodes[k].outputs) last_writer[size_t(r.buffer)] = int(k);
    } else {
      for (const TensorRef& r : n.outputs) last_writer[size_t(r.buffer)] = int(j);
    }
  }
}

// One past the last node of the group that starts at node i (i + 1: no group).
size_t group_end(const Graph& g, size_t i) {
  if (!fusable_node(g, g.nodes[i])) return i + 1;
  GroupState s(g, g.nodes[i]);
  if (!s.accepts(g, g.nodes[i])) return i + 1;  // an in-place update through another view of its buffer
  s.add(g.nodes[i]);
  size_t j = i + 1;
  while (j < g.nodes.size() && fusable_node(g, g.nodes[j]) && s.accepts(g, g.nodes[j])) s.add(g.nodes[j++]);
  return j;
}

// The op's scalar attrs as the instruction's p0, p1.
std::pair<double, double> scalar_attrs(const Node& n) {
  switch (n.op) {
    case OpKind::PowScalar: return {n.attrs.f("exponent"), 0.0};
    case OpKind::AddScalar: case OpKind::MulScalar: case OpKind::MaskedFill: return {n.attrs.f("value"), 0.0};
    case OpKind::ClampScalar: return {n.attrs.f("min", -INFINITY), n.attrs.f("max", INFINITY)};
    default: return {0.0, 0.0};
  }
}

// Who reads each buffer, so that a group knows which of its values anyone after it needs.
struct Readers {
  std::vector<int> count;         // reading refs per buffer, over the whole graph
  std::vector<bool> graph_output;
  explicit Readers(const Graph& g) : count(g.buffers.size(), 0), graph_output(g.buffers.size(), false) {
    for (const Node& n : g.nodes)
      for (const auto& r : n.inputs)
        if (r) count[size_t(r->buffer)] += 1;
    for (const TensorRef& r : g.outputs) graph_output[size_t(r.buffer)] = true;
  }
};

struct Fused {
  FusedExpr expr;
  std::vector<TensorRef> inputs, outputs;
};

// The expression of nodes [i, j): loads of every ref first read from memory, the ops in order (a
// ref written earlier in the group is its register), stores of the written refs someone else needs.
Fused build_expr(const Graph& g, size_t i, size_t j, const Readers& readers) {
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
    for (const auto& r : n.inputs) {
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
    const int reg = n.op == OpKind::Copy ? f.expr.cast(args[0], w.dtype) : f.expr.op(n.op, args, w.dtype, p0, p1);
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

class CpuFusedKernel : public FusedKernel {
 public:
  CpuFusedKernel(FusedExpr expr, FusedLoop loop, std::string label)
      : expr_(std::move(expr)), loop_(std::move(loop)), label_(std::move(label)) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override { run_fused_cpu(expr_, loop_, in, out); }
  std::string name() const override { return "fused elementwise (cpu): " + label_; }

 private:
  FusedExpr expr_;
  FusedLoop loop_;
  std::string label_;
};

// The kernel of a fused node in a graph that is planned, never run (PassOptions::build_kernels).
class UnbuiltFusedKernel : public FusedKernel {
 public:
  explicit UnbuiltFusedKernel(std::string label) : label_(std::move(label)) {}
  void run(const std::vector<Tensor>&, const std::vector<Tensor>&) override {
    throw Error("compile: fused kernel '" + label_ + "' was planned without being built; it cannot run");
  }
  std::string name() const override { return "fused elementwise (planned only): " + label_; }

 private:
  std::string label_;
};

Node fuse_group(const Graph& g, size_t i, size_t j, const Readers& readers, bool build_kernels) {
  Fused f = build_expr(g, i, j, readers);
  const Node& last = g.nodes[j - 1];
  const Shape& shape = last.outputs[0].shape;
  Node n{last.op, last.attrs, {}, f.outputs, false, {}, nullptr};
  std::string label;
  for (size_t k = i; k < j; ++k) {
    n.fused.push_back(op_name(g.nodes[k].op));
    label += (k > i ? " " : "") + n.fused.back();
    n.in_place = n.in_place || g.nodes[k].in_place;
  }
  std::vector<std::vector<int64_t>> strides;
  for (const TensorRef& r : f.inputs) {
    n.inputs.emplace_back(r);
    strides.push_back(broadcast_strides(r.shape, r.strides, shape));
  }
  FusedLoop loop = make_fused_loop(shape, strides);
  const Device device = g.buffers[last.outputs[0].buffer].device;
  if (!build_kernels) n.kernel = std::make_shared<UnbuiltFusedKernel>(label);
  else if (device.is_cuda()) n.kernel = make_cuda_fused_kernel(f.expr, loop, device, label);
  else n.kernel = std::make_shared<CpuFusedKernel>(f.expr, std::move(loop), label);
  if (log_enabled("fusion"))
    log("fusion", detail::cat("fused ", label, " over ", shape_str(shape), " on ", device.str(), ": ", f.inputs.size(),
                              " inputs, ", f.outputs.size(), " outputs\n", f.expr.str()));
  return n;
}

}  // namespace

void fuse_elementwise(Graph& g, PassStats& stats, bool build_kernels) {
  reshape_to_producers(g);
  hoist_consumers(g);
  const Readers readers(g);
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size();) {
    const size_t j = group_end(g, i);
    if (j - i >= 2) {
      out.push_back(fuse_group(g, i, j, readers, build_kernels));
      stats.fused += j - i - 1;
    } else {
      out.push_back(std::move(g.nodes[i]));
    }
    i = j;
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
