// Elementwise fusion: runs of consecutive elementwise nodes become one kernel that computes the whole
// chain per element, reading each input once and writing only what is read after the chain.
//
//   k1: t = add(x, bias)   k2: u = gelu(t)   k3: v = mul(u, s)    ->   k: v = [add gelu mul](x, bias, s)
//
// First, an elementwise node over contiguous tensors of one size that reads a fusable producer's
// output traced in another shape (a reshape between them) is rewritten in the producer's shape (same
// bytes, same linear order). Then each fusable node moves up (at most 1024 places) to just after the
// last writer of its inputs when that writer is a fusable node of its shape and nothing in between
// touches its outputs: a chain split by unrelated nodes (attention scales q, copies k, then casts q)
// becomes consecutive. Then a node that reads its operands contiguously and writes memory that
// exists already moves up to the nearest earlier fusable node of its shape that reads contiguously
// too, when independent of what lies between: the gradient updates of norms of several widths,
// interleaved, group by width. Last, a small node (a scalar, a short vector) whose one reader is a
// later fusable node of its shape moves down to it: the micro-batches' loss adds join the mean.
// A group is a maximal run of consecutive nodes (graph order; consecutive is what makes the rewrite
// safe: nothing runs between its members) where every node
//   - is an op of kernels/ops.def's elementwise family, clamp_scalar, a copy between two tensors
//     of one device (a cast or a layout copy), or a dropout_mask (drawn in the kernel: a random
//     instruction), with no pass-made kernel yet;
//   - iterates the group's shape (its output's shape) and writes a contiguous ref;
//   - touches tensors of the group's one device only;
// and where every buffer the group writes is referenced, by every node of the group, with exactly
// one geometry (buffer, shape, strides, offset, dtype). So element e of the group's loop reads and
// writes the written buffers only at element e: a value produced inside the group is taken from the
// register, not memory, and no element can see another's write. Inputs the group does not write may
// be broadcast or strided arbitrarily.
//
// A group of k >= 2 nodes becomes one fused_elementwise node: fused = the op names, attrs = the chain
// as a program (kernels/fused_expr.h) that its CPU kernel interprets and its CUDA kernel compiles
// through NVRTC (kernels/jit/);
// inputs = the refs it reads from memory, outputs = the refs it writes. A value is not written at
// all when its buffer is Internal, not a graph output and read by no node outside the group.
// stats.fused grows by k - 1. Results: for f32/f64 the same formulas in the same types as the
// unfused kernels (bit for bit on the CPU); f16/bf16 intermediates stay in float.
#include "compile/passes/passes.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "compile/codegen/lower_elementwise.h"
#include "kernels/dispatch.h"
#include "kernels/fused_expr.h"

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

// A dropout_mask node (redraw_dropout_masks.cpp): no loaded input, only its optional Philox state,
// which the group's kernel reads whole; it becomes a random instruction of the program.
bool fusable_mask(const Graph& g, const Node& n) {
  const TensorRef& out = n.outputs[0];
  const Device device = g.buffers[out.buffer].device;
  if (numel_of(out.shape) == 0 || !is_contiguous(out) || !supports(OpKind::FusedElementwise, device.type)) return false;
  for (const auto& r : n.inputs)
    if (!r || !(g.buffers[r->buffer].device == device)) return false;
  return n.inputs.size() <= 1;
}

// Could `n` be a member of a group at all? (Membership also needs GroupState::accepts.)
bool fusable_node(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1) return false;
  if (n.op == OpKind::DropoutMask) return !n.in_place && fusable_mask(g, n);
  const int arity = n.op == OpKind::Copy ? 1 : fusable_arity(n.op);
  if (arity == 0 || int(n.inputs.size()) != arity) return false;
  const TensorRef& out = n.outputs[0];
  if (numel_of(out.shape) == 0 || !is_contiguous(out)) return false;
  const Device device = g.buffers[out.buffer].device;
  if (!supports(OpKind::FusedElementwise, device.type)) return false;
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

// How far back a node may be moved to join its producer's group. Far enough for a gradient's
// accumulation to reach the cast that makes it: a convolution's 16-bit weight gradient is widened in
// the backward and added into the f32 gradient (or copied into it, in the first micro-batch) only at
// the micro-batch's end, a few hundred nodes later in a ResNet; moved up, cast and add are one kernel
// and the f32 temporary is never stored (resnet18-cifar bf16: 971 -> 883 kernels, arena 231.9 ->
// 208.1 MiB on the CPU). The window bounds the pass's cost (each move rescans the nodes before it).
constexpr size_t kMaxHoist = 1024;

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

// Whether every operand of n is read in its own contiguous layout (or broadcast from one): the nodes
// hoist_siblings gathers. A transposed read (autocast's cast of a weight through W^T) keeps its own
// kernel, whose tiles read and write both sides coalesced.
bool reads_contiguously(const Node& n) {
  for (const auto& r : n.inputs)
    if (r && !is_contiguous(*r) && numel_of(r->shape) == numel_of(n.outputs[0].shape)) return false;
  return true;
}

// Whether a node in [from, to) reads or writes the buffer.
bool referred_to(const Graph& g, int buffer, size_t from, size_t to) {
  for (size_t k = from; k < to; ++k)
    if (refers_to(g.nodes[k], buffer)) return true;
  return false;
}

bool is_step_output(const Graph& g, int buffer) {
  for (const TensorRef& r : g.outputs)
    if (r.buffer == buffer) return true;
  return false;
}

// Moves each fusable node that reads contiguously and writes memory that already exists (an in-place
// update, a parameter's state) up to just after the nearest earlier fusable node of its shape on its
// device that reads contiguously too, when nothing in between writes its inputs or touches its
// outputs: the independent small updates a micro-batch ends with (each norm's weight and bias
// gradients added into the accumulated ones, in the order autograd reached them, their shapes
// interleaved) become one kernel per shape instead of one per run. Legal for the same reason as hoist_consumers; a chain
// follows its first node (the next link's last writer is then the moved node, of its shape).
void hoist_siblings(Graph& g) {
  for (size_t j = 1; j < g.nodes.size(); ++j) {
    const Node& n = g.nodes[j];
    if (!fusable_node(g, n) || !reads_contiguously(n)) continue;
    const Device device = g.buffers[n.outputs[0].buffer].device;
    int p = -1;
    for (size_t k = j; k-- > 0 && j - k <= kMaxHoist;) {
      const Node& m = g.nodes[k];
      bool barrier = writes_an_input_of(m, n);
      for (const TensorRef& out : n.outputs) barrier = barrier || refers_to(m, out.buffer);
      if (barrier) break;
      if (fusable_node(g, m) && reads_contiguously(m) && m.outputs[0].shape == n.outputs[0].shape &&
          g.buffers[m.outputs[0].buffer].device == device) {
        p = int(k);
        break;
      }
    }
    if (p < 0 || size_t(p) + 1 >= j) continue;
    // Only into memory that exists there already: making an Internal buffer earlier would lengthen
    // its life, and with it, maybe, the step's peak.
    bool exists = true;
    for (const TensorRef& out : n.outputs)
      exists = exists &&
               (g.buffers[out.buffer].kind != BufferKind::Internal || referred_to(g, out.buffer, 0, size_t(p) + 1));
    if (exists) std::rotate(g.nodes.begin() + p + 1, g.nodes.begin() + int64_t(j), g.nodes.begin() + int64_t(j) + 1);
  }
}

// Nodes of at most this many output bytes sink_producers moves: scalars and short vectors, whose
// later making cannot change how the planner packs the step's large buffers.
constexpr size_t kMaxSunkBytes = 4096;

// Moves each small fusable node whose result only one later fusable node of its shape reads down to
// just before that reader, when nothing in between writes its inputs or touches its result: a chain
// spread over the step (the micro-batches' losses added up, one add after each micro-batch, to the
// mean at the end) becomes one kernel at its end. The result is made later and its inputs are read
// later: the node moves only when those it was the last to read are small too (kMaxSunkBytes).
void sink_producers(Graph& g) {
  for (size_t j = g.nodes.size(); j-- > 0;) {
    const Node& n = g.nodes[j];
    if (!fusable_node(g, n) || !reads_contiguously(n) || n.in_place) continue;
    const TensorRef& out = n.outputs[0];
    if (g.buffers[out.buffer].kind != BufferKind::Internal || out.nbytes() > kMaxSunkBytes) continue;
    size_t reader = 0, readers = 0;
    for (size_t k = j + 1; k < g.nodes.size(); ++k)
      if (refers_to(g.nodes[k], out.buffer)) {
        reader = k;
        ++readers;
      }
    if (readers != 1 || is_step_output(g, out.buffer) || reader <= j + 1 || reader - j > kMaxHoist) continue;
    const Node& q = g.nodes[reader];
    if (!fusable_node(g, q) || q.outputs[0].shape != out.shape || !reads_contiguously(q)) continue;
    bool clear = true;
    for (size_t k = j + 1; clear && k < reader; ++k) clear = !writes_an_input_of(g.nodes[k], n);
    size_t held_longer = 0;
    for (const auto& r : n.inputs)
      if (r && g.buffers[r->buffer].kind == BufferKind::Internal && !referred_to(g, r->buffer, j + 1, g.nodes.size()) &&
          !is_step_output(g, r->buffer))
        held_longer += g.buffers[r->buffer].nbytes;
    if (clear && held_longer <= std::max(g.buffers[out.buffer].nbytes, kMaxSunkBytes))
      std::rotate(g.nodes.begin() + int64_t(j), g.nodes.begin() + int64_t(j) + 1, g.nodes.begin() + int64_t(reader));
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

}  // namespace

void fuse_elementwise(Graph& g, PassStats& stats) {
  reshape_to_producers(g);
  hoist_consumers(g);
  hoist_siblings(g);
  sink_producers(g);
  const BufferReaders readers(g);
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size();) {
    const size_t j = group_end(g, i);
    if (j - i >= 2) {
      out.push_back(lower_elementwise_group(g, i, j, readers));
      stats.fused += j - i - 1;
    } else {
      out.push_back(std::move(g.nodes[i]));
    }
    i = j;
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
