// Gradient-cast fusion: under autocast a convolution's weight gradient comes out of its backward in
// 16 bits (cuDNN writes dW in its operands' dtype, channels-last on the GPU), and each micro-batch
// adds it to the parameter's f32 gradient:
//   first micro-batch:   grad = copy(dW16) to f32             (results_into_grads' write)
//   later ones:          grad += copy(dW16) to f32            (AccumulateGrad's add, one fused_elementwise)
// one small kernel per convolution and micro-batch (cnn-small: 20 a step, resnet18-cifar: 80). The
// writes of one micro-batch touch different gradients and nothing reads a gradient before the next
// micro-batch's write of it (or the optimizer), so they can all run at the place of the last one:
// one multi_tensor_cast node there (attr accumulate for the adds), one launch for all (on the GPU the
// flat casts and the tiled transposes of kernels/cuda/memory.cu). Each gradient gets the bits its copy
// (and add) gave it.
// A gradient is a buffer the step's optimizer reads as one. A group gathers writes of one kind
// (create or add) in graph order while every earlier member may move down to the newest one: nothing
// in between touches its gradient or writes its dW16 (the next micro-batch's write of the same
// gradient ends the group). The dW16 buffers then live until the group's node, where they used to die
// at their cast, so a member joins only while the bytes the group holds longer keep every node's live
// bytes (passes/memory_plan.h's lifetimes) at or below the step's busiest node's; and since the
// planner packs buffers first-fit, a group is kept only where plan_memory's arena for its device, with
// the groups kept before it, does not grow: the step's planned memory stays where it was.
// Runs after elementwise fusion (whose cast-and-add kernels it gathers, and whose plan its live bytes
// are counted on) and before the optimizer's fusion (whose per-parameter steps name the gradients);
// off under a memory limit (Pass::under_memory_limit), where recomputation wants every buffer to die
// early.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "compile/passes/memory_plan.h"
#include "compile/passes/passes.h"
#include "kernels/fused_expr.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "grad_casts";

// Bytes of Internal buffers live at each node of g on one device (the planner's lifetimes), and the
// most at any node: what a group may not raise.
struct LiveBytes {
  std::vector<size_t> at;  // node index -> bytes live there
  size_t peak = 0;
  std::vector<Placement> life;  // by buffer id
};
LiveBytes live_bytes(const Graph& g, Device device) {
  LiveBytes l{std::vector<size_t>(g.nodes.size() + 1, 0), 0, buffer_lifetimes(g)};
  std::vector<int64_t> delta(g.nodes.size() + 2, 0);
  for (const Buffer& b : g.buffers) {
    const Placement& p = l.life[size_t(b.id)];
    if (b.kind != BufferKind::Internal || b.device != device || p.first < 0) continue;
    delta[size_t(p.first)] += int64_t(p.nbytes);
    delta[size_t(p.last) + 1] -= int64_t(p.nbytes);
  }
  int64_t run = 0;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    run += delta[k];
    l.at[k] = size_t(run);
    l.peak = std::max(l.peak, l.at[k]);
  }
  return l;
}

struct Write {
  size_t node;  // the copy (create) or the fused cast-and-add (accumulate)
  TensorRef x16, grad;
  bool add = false;
};

// The buffers the step's optimizer reads as gradients (input 1 of each adamw_step / sgd_step): what
// makes a write a gradient's, as the graph has no other mark of it.
std::vector<bool> gradient_buffers(const Graph& g) {
  std::vector<bool> grad(g.buffers.size(), false);
  for (const Node& n : g.nodes)
    if ((n.op == OpKind::AdamWStep || n.op == OpKind::SgdStep) && n.inputs.size() > 1 && n.inputs[1])
      grad[size_t(n.inputs[1]->buffer)] = true;
  return grad;
}

// Node n as elementwise fusion's grad += copy(x16) to f32: a fused_elementwise of two inputs, x16 and
// the gradient it writes in place, whose program loads both (a 16-bit load widens exactly, so the
// cast to f32 may be there or folded into it), adds them in float and stores the sum. The 16-bit
// input's index, or -1.
int cast_add_source(const Node& n) {
  if (n.op != OpKind::FusedElementwise || n.inputs.size() != 2 || !n.inputs[0] || !n.inputs[1] ||
      n.outputs.size() != 1 || n.attrs.b("column_sums", false))
    return -1;
  const int x = is_16bit(n.inputs[0]->dtype) ? 0 : 1;
  if (!is_16bit(n.inputs[size_t(x)]->dtype) || !same_ref(*n.inputs[size_t(1 - x)], n.outputs[0])) return -1;
  const FusedExpr e = fused_expr_of(n.attrs);
  int load_x = -1, load_g = -1, value_x = -1, add = -1, store = -1;
  for (int i = 0; i < int(e.code.size()); ++i) {
    const Instr& in = e.code[size_t(i)];
    if (in.kind == InstrKind::Load) {
      (in.index == x ? load_x : load_g) = i;
      if (in.index == x) value_x = i;
    } else if (in.kind == InstrKind::Cast && in.dtype == DType::f32 && in.args[0] == load_x && load_x >= 0) {
      value_x = i;
    } else if (in.kind == InstrKind::Op && in.op == OpKind::Add && in.type == ValueType::F32 && add < 0) {
      add = i;
    } else if (in.kind == InstrKind::Store && in.index == 0 && store < 0) {
      store = i;
    } else {
      return -1;  // anything else: not this pattern
    }
  }
  if (add < 0 || store < 0 || load_x < 0 || load_g < 0 || e.code[size_t(store)].args[0] != add) return -1;
  const Instr& a = e.code[size_t(add)];
  const bool operands = (a.args[0] == value_x && a.args[1] == load_g) || (a.args[0] == load_g && a.args[1] == value_x);
  return operands ? x : -1;
}

// Node k as a gradient write of a 16-bit result cast to f32 (see the file comment), or nothing.
std::optional<Write> grad_cast_write(const Graph& g, const BufferUses& u, const std::vector<bool>& is_grad, size_t k) {
  const Node& n = g.nodes[k];
  if (n.outputs.size() != 1 || n.outputs[0].dtype != DType::f32 || !is_grad[size_t(n.outputs[0].buffer)])
    return std::nullopt;
  Write out{k, {}, n.outputs[0], false};
  if (n.op == OpKind::Copy && !n.in_place && n.inputs.size() == 1 && n.inputs[0] &&
      u.touches[out.grad.buffer].front() == int(k)) {  // the copy that creates the gradient
    out.x16 = *n.inputs[0];
  } else if (const int x = cast_add_source(n); x >= 0) {
    out.x16 = *n.inputs[size_t(x)];
    out.add = true;
  } else {
    return std::nullopt;
  }
  const TensorRef& x = out.x16;
  if (!is_16bit(x.dtype) || x.shape != out.grad.shape || g.buffers[x.buffer].kind != BufferKind::Internal ||
      g.buffers[x.buffer].device != g.buffers[out.grad.buffer].device)
    return std::nullopt;
  return out;
}

// Whether write m may run at node `end` instead: nothing between touches its gradient or writes its
// 16-bit source.
bool may_move_to(const BufferUses& u, const Write& m, size_t end) {
  return !u.touched_between(m.grad.buffer, int(m.node), int(end)) &&
         !u.written_between(m.x16.buffer, int(m.node), int(end) + 1);
}

// A group as the node that replaces it (at its last member's index) and the members that go.
struct Rewrite {
  size_t at;
  Node node;
  std::vector<size_t> gone;
  Device device;
};

Graph with_rewrites(const Graph& g, const std::vector<const Rewrite*>& rewrites) {
  Graph h = g;
  std::vector<bool> drop(h.nodes.size(), false);
  for (const Rewrite* r : rewrites) {
    h.nodes[r->at] = r->node;
    for (size_t i : r->gone) drop[i] = true;
  }
  drop_nodes(h, drop);
  return h;
}

size_t arena_bytes(const Graph& g, Device d) {
  const MemoryPlan p = plan_memory(g);
  const Arena* a = p.arena_for(d);
  return a ? a->bytes : 0;
}

}  // namespace

void fuse_grad_casts(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  const std::vector<bool> is_grad = gradient_buffers(g);
  LiveBytes live;
  Device live_device;
  std::vector<Rewrite> rewrites;
  std::vector<Write> group;
  auto flush = [&] {
    if (group.size() >= 2) {
      const Write& last = group.back();
      Node fused{OpKind::MultiTensorCast, Attrs().set("dtype", DType::f32), {}, {}, last.add, {}};
      if (last.add) fused.attrs.set("accumulate", true);
      fused.phase = g.nodes[last.node].phase;
      for (const Write& m : group) fused.inputs.push_back(m.x16);
      for (const Write& m : group) {
        if (m.add) fused.inputs.push_back(m.grad);
        fused.outputs.push_back(m.grad);
        fused.fused.push_back(m.add ? "copy add" : "copy");
      }
      if (!call_supported(g, fused)) {
        why_not(kPass, g, last.node, "the other gradient casts",
                "the device's multi_tensor_cast does not take the call");
      } else {
        Rewrite r{last.node, std::move(fused), {}, g.buffers[last.grad.buffer].device};
        for (const Write& m : group)
          if (m.node != last.node) r.gone.push_back(m.node);
        rewrites.push_back(std::move(r));
      }
    }
    group.clear();
  };
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const std::optional<Write> w = grad_cast_write(g, u, is_grad, k);
    if (!w) continue;
    bool joins = !group.empty() && group.front().add == w->add &&
                 g.buffers[group.front().grad.buffer].device == g.buffers[w->grad.buffer].device;
    for (const Write& m : group) joins = joins && m.grad.buffer != w->grad.buffer && may_move_to(u, m, k);
    if (joins) {  // each member's source held from its last use to node k: not above the busiest node
      const Device d = g.buffers[w->grad.buffer].device;
      if (live.at.empty() || live_device != d) live = live_bytes(g, d), live_device = d;
      std::vector<size_t> held(g.nodes.size() + 1, 0);
      for (const Write& m : group)
        for (int j = live.life[size_t(m.x16.buffer)].last + 1; j <= int(k); ++j) held[size_t(j)] += m.x16.nbytes();
      for (size_t j = group.front().node; joins && j <= k; ++j) joins = live.at[j] + held[j] <= live.peak;
    }
    if (!joins) flush();
    group.push_back(*w);
  }
  flush();
  // The planner packs buffers first-fit, so a group that keeps the busiest node's bytes can still
  // move the arena's size: each group is kept only where the arena of its device, planned with the
  // groups kept so far, does not grow.
  std::vector<const Rewrite*> kept;
  std::vector<std::pair<Device, size_t>> arena;  // per device, with the groups kept so far
  for (const Rewrite& r : rewrites) {
    auto it = std::find_if(arena.begin(), arena.end(), [&](const auto& a) { return a.first == r.device; });
    if (it == arena.end()) it = arena.insert(arena.end(), {r.device, arena_bytes(with_rewrites(g, kept), r.device)});
    std::vector<const Rewrite*> trial = kept;
    trial.push_back(&r);
    const size_t bytes = arena_bytes(with_rewrites(g, trial), r.device);
    if (bytes > it->second) {
      why_not(kPass, g, r.at, "the other gradient casts",
              detail::cat("the planned arena would grow by ", bytes - it->second, " bytes"));
      continue;
    }
    it->second = bytes;
    kept = std::move(trial);
    stats.fused += r.gone.size();
  }
  g = with_rewrites(g, kept);
}

}  // namespace reel::compile
