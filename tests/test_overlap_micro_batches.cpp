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
#include "schedule_check.h"
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
using testing_util::expect_a_sound_schedule;
using testing_util::fused_step_on_gpu;

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
