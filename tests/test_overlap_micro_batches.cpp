// A micro-batch's first forward kernels on a third stream, under the backward before it
// (compile/passes/overlap_micro_batches.h):
//   - hand-made graphs (no GPU needed): which nodes move where, where the main stream waits for them,
//     a dependency or the planned peak that keeps them in place, a CPU plan left alone, the
//     environment's setting and its error;
//   - whole steps of a GPT and a CNN, traced on the CPU and scheduled as a GPU's plan: every pair of
//     nodes that touch the same buffer (or bytes the memory plan shares between two buffers) is ordered
//     by the streams' forks and joins, in the order the trace had them, and the planned peak stays;
//   - on a GPU, training steps that compute the same bits with the pass on and off, captured in a CUDA
//     graph and launched one by one.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "compile/passes/memory_plan.h"
#include "compile/passes/overlap_micro_batches.h"
#include "compile/passes/pattern.h"
#include "compile/passes/side_stream.h"
#include "compile_test_util.h"
#include "nn/nn.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

using compile::BufferKind;
using compile::Graph;
using testing_util::graph_floats;
using testing_util::graph_node;
using testing_util::graph_ref;

// Micro-batch 0's backward tail, then micro-batch 1's forward, on a GPU:
//   0: g   = fused_elementwise(x0)      micro-batch 0   (g: `g_floats`)
//   1: t   = fused_elementwise(g)       micro-batch 0
//   2: u   = fused_elementwise(t)       micro-batch 0   (a step output)
//   3: a   = fused_elementwise(x1[, t]) micro-batch 1   (a: `a_floats`; reads t with `reads_t`)
//   4: b   = gemm_epilogue(a, w)        micro-batch 1
//   5: out = fused_elementwise(b)       micro-batch 1   (a step output of `out_floats`: by default the
//                                                          step's peak is where it is written)
Graph boundary(int64_t g_floats, int64_t a_floats, bool reads_t = false, int64_t out_floats = 1024) {
  Graph g;
  const int x0 = graph_floats(g, BufferKind::Input, 64), x1 = graph_floats(g, BufferKind::Input, a_floats);
  const int w = graph_floats(g, BufferKind::External, 64);
  const int gb = graph_floats(g, BufferKind::Internal, g_floats), t = graph_floats(g, BufferKind::Internal, 64);
  const int u = graph_floats(g, BufferKind::Internal, 64), a = graph_floats(g, BufferKind::Internal, a_floats);
  const int b = graph_floats(g, BufferKind::Internal, a_floats), out = graph_floats(g, BufferKind::Internal, out_floats);
  for (compile::Buffer& buf : g.buffers) buf.device = Device::cuda(0);
  const int64_t rows = a_floats / 8;
  auto node = [&](OpKind op, std::vector<compile::TensorRef> in, compile::TensorRef o, int micro_batch) {
    g.nodes.push_back(graph_node(op, std::move(in), std::move(o)));
    g.nodes.back().phase = "micro-batch " + std::to_string(micro_batch);
  };
  node(OpKind::FusedElementwise, {graph_ref(x0, {64})}, graph_ref(gb, {g_floats}), 0);
  node(OpKind::FusedElementwise, {graph_ref(gb, {g_floats})}, graph_ref(t, {64}), 0);
  node(OpKind::FusedElementwise, {graph_ref(t, {64})}, graph_ref(u, {64}), 0);
  std::vector<compile::TensorRef> a_in{graph_ref(x1, {a_floats})};
  if (reads_t) a_in.push_back(graph_ref(t, {64}));
  node(OpKind::FusedElementwise, a_in, graph_ref(a, {a_floats}), 1);
  node(OpKind::GemmEpilogue, {graph_ref(a, {rows, 8}), graph_ref(w, {8, 8})}, graph_ref(b, {rows, 8}), 1);
  node(OpKind::FusedElementwise, {graph_ref(b, {a_floats})}, graph_ref(out, {out_floats}), 1);
  g.outputs.push_back(graph_ref(u, {64}));
  g.outputs.push_back(graph_ref(out, {out_floats}));
  return g;
}

std::vector<int> streams(const Graph& g) {
  std::vector<int> s;
  for (const compile::Node& n : g.nodes) s.push_back(n.stream);
  return s;
}

TEST(OverlapMicroBatchesPass, TheNextForwardsFirstKernelsRunUnderTheBackwardsLast) {
  Graph g = boundary(64, 64);
  const size_t before = compile::planned_peak(g);
  compile::PassStats stats;
  compile::overlap_micro_batches(g, stats, 2, 2);
  EXPECT_EQ(stats.ahead, 2u);
  // a and b's nodes now come first after g's, on stream 2; t and u's follow on the main stream.
  EXPECT_EQ(streams(g), (std::vector<int>{0, 2, 2, 0, 0, 0})) << g.str();
  EXPECT_EQ(g.nodes[1].phase, "micro-batch 1");
  EXPECT_EQ(g.nodes[2].op, OpKind::GemmEpilogue);
  EXPECT_EQ(g.nodes[3].phase, "micro-batch 0");
  // The main stream waits for both before out's node, the first that reads b; a's node is done once
  // b's is (the lane runs in order), so a's buffer is free from there too.
  EXPECT_EQ(compile::side_joins(g), (std::vector<int>{-1, 5, 5, -1, -1, -1}));
  EXPECT_EQ(compile::planned_peak(g), before);
  EXPECT_NE(g.str().find("(side stream 2)"), std::string::npos) << g.str();
}

TEST(OverlapMicroBatchesPass, AForwardKernelStartsAfterTheBackwardKernelItReads) {
  Graph g = boundary(64, 64, /*reads_t=*/true);
  compile::PassStats stats;
  compile::overlap_micro_batches(g, stats, 2, 2);
  // a reads t: the two move only above u's node.
  EXPECT_EQ(stats.ahead, 2u);
  EXPECT_EQ(streams(g), (std::vector<int>{0, 0, 2, 2, 0, 0})) << g.str();
  EXPECT_EQ(g.nodes[1].outputs[0].buffer, g.nodes[2].inputs[1]->buffer) << "t's node stays before a's";
}

TEST(OverlapMicroBatchesPass, NothingMovesWhereThePlannedPeakWouldGrow) {
  // g and a, both large, live at different times in the trace's order (the peak is g's): run ahead,
  // a would be live beside g, at their sum.
  Graph g = boundary(8192, 4096, false, 64);
  const Graph traced = g;
  const size_t before = compile::planned_peak(g);
  compile::PassStats stats;
  compile::overlap_micro_batches(g, stats, 2, 2);
  EXPECT_EQ(stats.ahead, 0u);
  EXPECT_EQ(streams(g), streams(traced));
  EXPECT_EQ(g.str(), traced.str());
  EXPECT_EQ(compile::planned_peak(g), before);
}

// The pass (2 ahead under 2) on g: how many nodes ran ahead, and every node's stream after it.
struct Ran {
  size_t ahead;
  std::vector<int> streams;
  std::string listing;
};
Ran run_pass(Graph g) {
  compile::PassStats stats;
  compile::overlap_micro_batches(g, stats, 2, 2);
  return {stats.ahead, streams(g), g.str()};
}

TEST(OverlapMicroBatchesPass, StaysWhereItCannotRunBeside) {
  const std::vector<int> none(6, 0), first_alone{0, 2, 0, 0, 0, 0};
  Graph g = boundary(64, 64);
  for (compile::Buffer& b : g.buffers) b.device = Device::cpu();  // a CPU plan runs one kernel at a time
  Ran r = run_pass(g);
  EXPECT_EQ(r.ahead, 0u);
  EXPECT_EQ(r.streams, none);

  // A loss's kernel counts blocks in the main stream's finish counters: not ahead, nor anything after it.
  g = boundary(64, 64);
  g.nodes[3].op = OpKind::CrossEntropyWithGrad;
  r = run_pass(g);
  EXPECT_EQ(r.ahead, 0u);
  EXPECT_EQ(r.streams, none);

  // A plain GEMM would want a cuBLAS workspace, which lane 2 does not have: the node before it runs ahead alone.
  g = boundary(64, 64);
  g.nodes[4].op = OpKind::Matmul;
  r = run_pass(g);
  EXPECT_EQ(r.ahead, 1u);
  EXPECT_EQ(r.streams, first_alone) << r.listing;

  // Nor a loss there.
  g = boundary(64, 64);
  g.nodes[4].op = OpKind::LinearCrossEntropyWithGrad;
  r = run_pass(g);
  EXPECT_EQ(r.ahead, 1u);
  EXPECT_EQ(r.streams, first_alone) << r.listing;

  // A kernel that fills the GPU by itself (an input of more than 4 MiB; here a weight, which the
  // planned peak does not count) stays, and so does everything after it.
  g = boundary(64, 64);
  const int big = graph_floats(g, BufferKind::External, 6 << 18);  // 6 MiB
  g.buffers[size_t(big)].device = Device::cuda(0);
  g.nodes[3].inputs.push_back(graph_ref(big, {6 << 18}));
  r = run_pass(g);
  EXPECT_EQ(r.ahead, 0u);
  EXPECT_EQ(r.streams, none);

  // No phase labels: one piece, nothing to overlap.
  g = boundary(64, 64);
  for (compile::Node& n : g.nodes) n.phase = "";
  EXPECT_EQ(run_pass(g).ahead, 0u);
}

// REEL_OVERLAP_KERNELS for a scope.
class OverlapEnv {
 public:
  explicit OverlapEnv(const char* value) {
    if (const char* old = std::getenv("REEL_OVERLAP_KERNELS")) old_ = old, had_ = true;
    setenv("REEL_OVERLAP_KERNELS", value, 1);
  }
  ~OverlapEnv() {
    if (had_) {
      setenv("REEL_OVERLAP_KERNELS", old_.c_str(), 1);
    } else {
      unsetenv("REEL_OVERLAP_KERNELS");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(OverlapMicroBatchesPass, TheEnvironmentSetsHowManyAndABadValueIsAnError) {
  {
    OverlapEnv env("1,2");
    Graph g = boundary(64, 64);
    compile::PassStats stats;
    compile::overlap_micro_batches(g, stats);
    EXPECT_EQ(stats.ahead, 1u);
    EXPECT_EQ(streams(g), (std::vector<int>{0, 2, 0, 0, 0, 0})) << g.str();
  }
  {
    OverlapEnv env("0,8");  // off
    Graph g = boundary(64, 64);
    compile::PassStats stats;
    compile::overlap_micro_batches(g, stats);
    EXPECT_EQ(stats.ahead, 0u);
  }
  for (const char* bad : {"8", "8,", "a,b", "8,8,8", "-1,4", "8,8x"}) {
    OverlapEnv env(bad);
    Graph g = boundary(64, 64);
    compile::PassStats stats;
    testing_util::expect_error([&] { compile::overlap_micro_batches(g, stats); },
                               {"REEL_OVERLAP_KERNELS", "ahead,under", std::string("'") + bad + "'"});
  }
}

// ---- whole steps, scheduled as a GPU's plan ----

// Node i of the traced order carries "#i" as its last `fused` name (the schedule passes keep it),
// so that the scheduled order can be compared with the traced one.
int traced_index(const compile::Node& n) { return std::stoi(n.fused.back().substr(1)); }

// The step graph of `model` as the fusion passes leave it (traced on the CPU with every pass; the
// schedule passes do nothing there), relabelled as a GPU's, each node marked with its index.
Graph fused_step_on_gpu(const std::string& model, const char* precision) {
  testing_util::CompiledSteps r = testing_util::compiled_steps(model, Device::cpu(), precision, {}, 0, 3);
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
bool ordered(const Graph& g, const std::vector<int>& joins, size_t x, size_t y) {
  const int sx = g.nodes[x].stream, sy = g.nodes[y].stream;
  if (sx == sy || sx == 0) return true;
  return joins[x] <= int(y);
}

// The Internal buffers each node touches, with their bytes in the memory plan's arena.
struct Span {
  int buffer;
  size_t begin, end;
};
std::vector<std::vector<Span>> spans_of(const Graph& g) {
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
bool share_bytes(const std::vector<Span>& a, const std::vector<Span>& b) {
  for (const Span& x : a)
    for (const Span& y : b)
      if (x.buffer != y.buffer && x.begin < y.end && y.begin < x.end) return true;
  return false;
}

// Checks the scheduled graph: the same nodes; two that write, or read and write, one buffer keep the
// traced order and are ordered by the streams; two that touch bytes the memory plan gives two
// buffers are ordered too.
void expect_a_sound_schedule(const Graph& g, size_t traced_nodes) {
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

TEST(OverlapMicroBatchesPass, TheScheduleCheckSeesTwoDependentNodesSwapped) {
  Graph g = boundary(64, 64);
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].fused.push_back("#" + std::to_string(i));
  expect_a_sound_schedule(g, 6);
  std::swap(g.nodes[1], g.nodes[2]);  // u's node before t's, which writes what it reads
  EXPECT_NONFATAL_FAILURE(expect_a_sound_schedule(g, 6), "swapped");
}

TEST(OverlapMicroBatchesPass, WholeStepsKeepEveryDependencyAndThePlannedPeak) {
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(model) + " " + precision);
      Graph g = fused_step_on_gpu(model, precision);
      const size_t nodes = g.nodes.size();
      compile::PassStats stats;
      compile::assign_side_stream(g, stats);
      compile::cast_inputs_early(g, stats);
      compile::run_side_nodes_late(g, stats);
      const size_t peak = compile::planned_peak(g);
      const size_t beside = stats.beside;
      compile::overlap_micro_batches(g, stats, 8, 8);
      EXPECT_GT(stats.ahead, 0u) << "nothing ran ahead";
      EXPECT_EQ(stats.beside, beside);
      EXPECT_LE(compile::planned_peak(g), peak);
      expect_a_sound_schedule(g, nodes);
    }
}

// ---- on a GPU ----

TEST(OverlapMicroBatchesCuda, TrainingStepsComputeTheSameBitsWithTheForwardAheadOrNot) {
  REEL_REQUIRE_GPU();
  testing_util::for_each_stream_test_config([](const char* model, compile::Mode mode, const char* precision) {
    const testing_util::CompiledSteps off = testing_util::compiled_steps(
        model, Device::cuda(0), precision, {"overlap_micro_batches"}, 0, 3, {}, false, mode);
    const testing_util::CompiledSteps on =
        testing_util::compiled_steps(model, Device::cuda(0), precision, {}, 0, 3, {}, false, mode);
    ASSERT_NE(off.plan(), nullptr);
    ASSERT_NE(on.plan(), nullptr);
    EXPECT_EQ(off.plan()->stats().ahead, 0u);
    EXPECT_GT(on.plan()->stats().ahead, 0u) << "no node ran ahead";
    EXPECT_TRUE(testing_util::same_training(on, off));
  });
}

}  // namespace
}  // namespace reel
