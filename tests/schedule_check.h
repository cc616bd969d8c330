// Whole training steps scheduled as a GPU's plan, and a check that the schedule keeps every
// dependency: shared by the tests of the schedule stage's passes (side_stream.h,
// overlap_micro_batches.h, split_norm_param_sums.h).
//   fused_step_on_gpu(model, precision)   the step's graph as the fusion passes leave it (traced on
//                                         the CPU, where the schedule passes do nothing), relabelled
//                                         as a GPU's, each node marked with its traced index;
//   expect_a_sound_schedule(g, nodes)     every pair of nodes that conflict on a buffer (or touch
//                                         bytes the memory plan gives two buffers) is ordered by the
//                                         streams' forks and joins, conflicting ones in traced order.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "compile/passes/memory_plan.h"
#include "compile/passes/pattern.h"
#include "compile/passes/side_stream.h"
#include "compile_test_util.h"

namespace reel::testing_util {

using compile::Graph;

// Node i of the traced order carries "#i" as its last `fused` name (the schedule passes keep it),
// so that the scheduled order can be compared with the traced one.
inline int traced_index(const compile::Node& n) { return std::stoi(n.fused.back().substr(1)); }

// The step graph of `model` as the fusion passes leave it (traced on the CPU with every pass; the
// schedule passes do nothing there), relabelled as a GPU's, each node marked with its index.
inline Graph fused_step_on_gpu(const std::string& model, const char* precision) {
  CompiledSteps r = compiled_steps(model, Device::cpu(), precision, {}, 0, 3);
  EXPECT_NE(r.plan(), nullptr);
  if (!r.plan()) return Graph();
  Graph g = r.plan()->graph();
  for (compile::Buffer& b : g.buffers) b.device = Device::cuda(0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    EXPECT_EQ(g.nodes[i].stream, 0);
    g.nodes[i].fused.push_back("#" + std::to_string(i));
  }
  return g;
}

// Whether node x's kernels are done before node y's start (x before y in graph order), by the plan's
// rules (compile/runtime/plan.cpp): a stream runs its nodes in order; a side node starts after the main
// stream's nodes before it; the main stream waits for side node x before node joins[x], whatever stream
// that node is on.
inline bool ordered(const Graph& g, const std::vector<int>& joins, size_t x, size_t y) {
  const int sx = g.nodes[x].stream, sy = g.nodes[y].stream;
  if (sx == sy || sx == 0) return true;
  return joins[x] <= int(y);
}

// The Internal buffers each node touches, with their bytes in the memory plan's arena.
struct Span {
  int buffer;
  size_t begin, end;
};
inline std::vector<std::vector<Span>> spans_of(const Graph& g) {
  std::vector<std::pair<size_t, size_t>> at(g.buffers.size(), {0, 0});
  for (const compile::Arena& a : compile::plan_memory(g).arenas)
    for (const compile::Placement& p : a.placements) at[size_t(p.buffer)] = {p.offset, p.offset + p.nbytes};
  std::vector<std::vector<Span>> out(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto add = [&](int b) {
      if (at[size_t(b)].second > 0) out[i].push_back({b, at[size_t(b)].first, at[size_t(b)].second});
    };
    for (const auto& r : g.nodes[i].inputs)
      if (r) add(r->buffer);
    for (const auto& r : g.nodes[i].outputs) add(r.buffer);
  }
  return out;
}

// Whether two nodes touch two buffers that the memory plan puts in overlapping bytes.
inline bool share_bytes(const std::vector<Span>& a, const std::vector<Span>& b) {
  for (const Span& x : a)
    for (const Span& y : b)
      if (x.buffer != y.buffer && x.begin < y.end && y.begin < x.end) return true;
  return false;
}

// Checks the scheduled graph: the same nodes; two that write, or read and write, one buffer keep the
// traced order and are ordered by the streams; two that touch bytes the memory plan gives two
// buffers are ordered too.
inline void expect_a_sound_schedule(const Graph& g, size_t traced_nodes) {
  ASSERT_EQ(g.nodes.size(), traced_nodes);
  const std::vector<int> joins = compile::side_joins(g);
  const std::vector<std::vector<Span>> spans = spans_of(g);
  size_t checked = 0;
  for (size_t x = 0; x < g.nodes.size(); ++x)
    for (size_t y = x + 1; y < g.nodes.size(); ++y) {
      const compile::Node &a = g.nodes[x], &b = g.nodes[y];
      const bool conflict = compile::writes_an_input_of(a, b) || compile::writes_an_input_of(b, a) ||
                            [&] {
                              for (const compile::TensorRef& o : a.outputs)
                                if (compile::refers_to(b, o.buffer)) return true;
                              for (const compile::TensorRef& o : b.outputs)
                                if (compile::refers_to(a, o.buffer)) return true;
                              return false;
                            }();
      if (conflict) {
        ++checked;
        EXPECT_LT(traced_index(a), traced_index(b))
            << "k" << x << " " << op_name(a.op) << " and k" << y << " " << op_name(b.op) << " swapped";
      }
      if (conflict || share_bytes(spans[x], spans[y])) {
        EXPECT_TRUE(ordered(g, joins, x, y)) << "k" << x << " " << op_name(a.op) << " (stream " << a.stream
                                             << ") may run beside k" << y << " " << op_name(b.op) << " (stream "
                                             << b.stream << "), which touches its memory";
      }
    }
  EXPECT_GT(checked, 0u);
}

}  // namespace reel::testing_util
