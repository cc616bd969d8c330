// Sinking state updates: an in-place elementwise update of state that outlives the step, reading
// nothing but its own buffer, moves to the end of the graph when no later node reads or writes that
// buffer. Its candidates are counters: BatchNorm's num_batches_tracked (+= 1 at each forward, so
// once per BatchNorm per micro-batch) and the optimizer's step count.
//
//   k12: nbt1 += 1   k13: conv   k40: nbt2 += 1   k41: conv   k90: nbt1 += 1   k91: conv
//     ->   k12: conv   k13: conv   k14: conv   k15: nbt1 += 2   k16: nbt2 += 1
//
// Traced, they lie between the convolutions, one kernel of one element each (ResNet-18's 20
// BatchNorms at ACCUM 4: 80 launches). At the end they are consecutive elementwise nodes of one shape
// (the 0-dim), which the elementwise pass after this one (fuse_elementwise.cpp) fuses, up to its
// group size, into one kernel.
//
// A candidate node: in_place, an op the elementwise fusion computes (kernels/fused_expr.h) with one
// input, that input the very ref it writes, of an External buffer (an Internal one would stay alive
// to the end for nothing) on a device with fused_elementwise. It moves when every later node that
// touches its buffer is a candidate that moves too: the graph is walked from its end, and a buffer is
// held by the first node (from the end) that stays and touches it. So no node it passes reads or
// writes its buffer, and the step's outputs are read after the last node. At the end the moved nodes
// go buffer by buffer (updates of different buffers commute: each touches its own buffer only), a
// buffer's in traced order, and a run of integer add_scalar on one ref becomes one add_scalar of the
// sum (exact in i64: nothing reads the buffer between them any more), so a counter is updated once
// per step, by ACCUM. The results are the traced ones, to the bit; stats.fused grows by the additions
// merged. Under REEL_LOG=fusion the pass says what it moved and merged and, for each candidate that
// stays, which later node holds its buffer.
#include "compile/passes/passes.h"

#include <cmath>
#include <iterator>
#include <unordered_map>
#include <vector>

#include "kernels/fused_expr.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "sink_updates";

bool is_state_update(const Graph& g, const Node& n) {
  if (!n.in_place || n.inputs.size() != 1 || n.outputs.size() != 1 || !n.inputs[0]) return false;
  if (!is_fusable_op(n.op) || fusable_arity(n.op) != 1 || !same_ref(*n.inputs[0], n.outputs[0])) return false;
  const TensorRef& r = n.outputs[0];
  return g.buffers[r.buffer].kind == BufferKind::External && device_supports(g, r, OpKind::FusedElementwise);
}

// b += a then b += c, with b an integer: b += a + c. Values stay below 2^53, where doubles hold
// integers exactly (a counter adds 1 per micro-batch).
bool merges_into(const Node& prev, const Node& n) {
  if (prev.op != OpKind::AddScalar || n.op != OpKind::AddScalar || !same_ref(prev.outputs[0], n.outputs[0]) ||
      is_floating(n.outputs[0].dtype))
    return false;
  const double a = prev.attrs.f("value"), c = n.attrs.f("value");
  return a == std::trunc(a) && c == std::trunc(c) && std::abs(a) + std::abs(c) < 9007199254740992.0;
}

// The moved nodes buffer by buffer, each buffer's in traced order, runs of integer additions merged.
std::vector<Node> by_buffer(std::vector<Node> sunk, size_t& merged) {
  std::unordered_map<int, size_t> slot;  // buffer -> its list in `lists`
  std::vector<std::vector<Node>> lists;
  for (Node& n : sunk) {
    auto [it, fresh] = slot.emplace(n.outputs[0].buffer, lists.size());
    if (fresh) lists.emplace_back();
    std::vector<Node>& list = lists[it->second];
    if (!list.empty() && merges_into(list.back(), n)) {
      Node& prev = list.back();
      prev.attrs.set("value", prev.attrs.f("value") + n.attrs.f("value"));
      if (prev.fused.empty()) prev.fused.push_back(op_name(prev.op));
      prev.fused.push_back(op_name(n.op));
      ++merged;
      continue;
    }
    list.push_back(std::move(n));
  }
  std::vector<Node> out;
  for (std::vector<Node>& list : lists)
    for (Node& n : list) out.push_back(std::move(n));
  return out;
}

}  // namespace

void sink_state_updates(Graph& g, PassStats& stats) {
  // held_by[b]: the first node after the walk's position that stays and touches buffer b (-1: none).
  std::vector<int> held_by(g.buffers.size(), -1);
  std::vector<bool> sink(g.nodes.size(), false);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    if (is_state_update(g, n)) {
      const int b = n.outputs[0].buffer;
      const int k = held_by[size_t(b)];
      if (k < 0) {
        sink[i] = true;
        continue;
      }
      if (log_enabled("fusion"))
        log_line("fusion", detail::cat(kPass, ": ", op_name(n.op), " k", i, " of b", b, " stays: k", k, " (",
                                       op_name(g.nodes[size_t(k)].op), ") touches b", b, " after it"));
    }
    for (const auto& r : n.inputs)
      if (r) held_by[size_t(r->buffer)] = int(i);
    for (const TensorRef& r : n.outputs) held_by[size_t(r.buffer)] = int(i);
  }
  size_t last_kept = 0, moved = 0, merged = 0;  // those behind the last node that stays do not move
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!sink[i]) last_kept = i;
  std::vector<Node> kept, sunk;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    moved += sink[i] && i < last_kept;
    (sink[i] ? sunk : kept).push_back(std::move(g.nodes[i]));
  }
  const size_t candidates = sunk.size();
  sunk = by_buffer(std::move(sunk), merged);
  stats.fused += merged;
  if (candidates > 0 && log_enabled("fusion"))
    log_line("fusion", detail::cat(kPass, ": ", candidates, " in-place update", candidates == 1 ? "" : "s",
                                   " of step state at the end of the step (", moved, " moved there), as ",
                                   sunk.size(), " (", merged, " integer additions merged)"));
  kept.insert(kept.end(), std::make_move_iterator(sunk.begin()), std::make_move_iterator(sunk.end()));
  g.nodes = std::move(kept);
}

}  // namespace reel::compile
