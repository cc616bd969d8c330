// The side stream (compile/passes/side_stream.h): which nodes the pass puts beside the main stream,
// where the main stream waits for them, and the memory plan that keeps their buffers until then,
// without raising the step's peak (hand-made graphs, no GPU needed); and, on a GPU, training steps that compute the
// same bits with the pass on and off, captured in a CUDA graph and launched one by one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/passes/memory_plan.h"
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

// A backward's tail as the passes leave it, its buffers on `device`:
//   0: g    = fused_elementwise(x)          (the gradient, internal)
//   1: db  += column_sums(g)                (the bias gradient, external)
//   2: dx   = matmul(g, w)                  (reads g)
//   3: t    = fused_elementwise(dx)         (a new internal buffer between fork and join)
//   4: dw   = matmul(g, x)                  (reads g; a GEMM kept on the main stream here: the
//                                             weight gradients' matmul_into may go beside too, below)
//   5: db2  = fused_elementwise(db)         (the first reader of db: the join)
struct Tail {
  Graph g;
  int x, g_buf, db, dx, t, dw, w, db2;
};

Tail tail(Device device) {
  Tail s;
  Graph& g = s.g;
  s.x = graph_floats(g, BufferKind::Input, 64 * 32);
  s.g_buf = graph_floats(g, BufferKind::Internal, 64 * 32);
  s.db = graph_floats(g, BufferKind::External, 32);
  s.dx = graph_floats(g, BufferKind::Internal, 64 * 32);
  s.t = graph_floats(g, BufferKind::Internal, 64 * 32);
  s.dw = graph_floats(g, BufferKind::External, 32 * 32);
  s.w = graph_floats(g, BufferKind::External, 32 * 32);
  s.db2 = graph_floats(g, BufferKind::Internal, 32);
  for (compile::Buffer& b : g.buffers) b.device = device;
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(s.x, {64, 32})}, graph_ref(s.g_buf, {64, 32})));
  g.nodes.push_back(graph_node(OpKind::ColumnSums, {graph_ref(s.g_buf, {64, 32})}, graph_ref(s.db, {32}), true));
  g.nodes.push_back(graph_node(OpKind::Matmul, {graph_ref(s.g_buf, {64, 32}), graph_ref(s.w, {32, 32})},
                               graph_ref(s.dx, {64, 32})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(s.dx, {64, 32})}, graph_ref(s.t, {64, 32})));
  g.nodes.push_back(
      graph_node(OpKind::Matmul, {graph_ref(s.g_buf, {64, 32}), graph_ref(s.x, {64, 32})}, graph_ref(s.dw, {32, 32})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(s.db, {32})}, graph_ref(s.db2, {32})));
  g.outputs.push_back(graph_ref(s.t, {64, 32}));
  g.outputs.push_back(graph_ref(s.db2, {32}));
  return s;
}

TEST(SideStreamPass, ColumnSumsRunBesideTheGemmsUntilTheirSumsAreRead) {
  Tail s = tail(Device::cuda(0));
  compile::PassStats stats;
  compile::assign_side_stream(s.g, stats);
  EXPECT_EQ(stats.beside, 1u);
  EXPECT_EQ(s.g.nodes[1].stream, 1);
  for (size_t i : {0, 2, 3, 4, 5}) EXPECT_EQ(s.g.nodes[i].stream, 0) << "node " << i;
  const std::vector<int> joins = compile::side_joins(s.g);
  EXPECT_EQ(joins, (std::vector<int>{-1, 5, -1, -1, -1, -1})) << "the main stream waits before db's first reader";
  EXPECT_NE(s.g.str().find("1: column_sums (in place) (side stream)"), std::string::npos) << s.g.str();

  // g's last reader is node 4, but the side node may still read it until the join: g lives to node 4
  // at least, and so does the bias gradient's buffer; t, made at node 3, never shares g's bytes.
  const std::vector<compile::Placement> life = compile::buffer_lifetimes(s.g);
  EXPECT_EQ(life[size_t(s.g_buf)].last, 4);
  EXPECT_EQ(life[size_t(s.db)].last, 5);
  const compile::MemoryPlan plan = compile::plan_memory(s.g);
  const compile::Arena* arena = plan.arena_for(Device::cuda(0));
  ASSERT_NE(arena, nullptr);
  const compile::Placement *pg = nullptr, *pt = nullptr;
  for (const compile::Placement& p : arena->placements) {
    if (p.buffer == s.g_buf) pg = &p;
    if (p.buffer == s.t) pt = &p;
  }
  ASSERT_TRUE(pg && pt);
  EXPECT_TRUE(pg->offset + pg->nbytes <= pt->offset || pt->offset + pt->nbytes <= pg->offset)
      << "g at " << pg->offset << ", t at " << pt->offset;
}

TEST(SideStreamPass, LateMovesItBesideItsInputsLastReaderAlone) {
  // side_stream_late: the sums move to just before dW's GEMM (g's last reader), past dX's GEMM and
  // the node after it; the main stream waits for them before db's reader as before.
  Tail s = tail(Device::cuda(0));
  compile::PassStats stats;
  compile::assign_side_stream(s.g, stats);
  compile::run_side_nodes_late(s.g, stats);
  std::vector<OpKind> ops;
  for (const compile::Node& n : s.g.nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<OpKind>{OpKind::FusedElementwise, OpKind::Matmul, OpKind::FusedElementwise,
                                      OpKind::ColumnSums, OpKind::Matmul, OpKind::FusedElementwise}));
  EXPECT_EQ(s.g.nodes[3].stream, 1);
  EXPECT_EQ(compile::side_joins(s.g), (std::vector<int>{-1, -1, -1, 5, -1, -1}));
  // A write of g before dW's GEMM is a conflict: the node is then left where it was.
  Tail w = tail(Device::cuda(0));
  w.g.nodes[3] = graph_node(OpKind::FusedElementwise, {graph_ref(w.dx, {64, 32})}, graph_ref(w.g_buf, {64, 32}));
  compile::assign_side_stream(w.g, stats);
  compile::run_side_nodes_late(w.g, stats);
  EXPECT_EQ(w.g.nodes[1].op, OpKind::ColumnSums);
  EXPECT_EQ(compile::side_joins(w.g)[1], 3);
}

TEST(SideStreamPass, AWriteOfItsInputIsAJoinToo) {
  Tail s = tail(Device::cuda(0));
  // Node 3 now overwrites g in place: the side node must have read g by then.
  s.g.nodes[3] = graph_node(OpKind::FusedElementwise, {graph_ref(s.dx, {64, 32})}, graph_ref(s.g_buf, {64, 32}));
  compile::PassStats stats;
  compile::assign_side_stream(s.g, stats);
  EXPECT_EQ(compile::side_joins(s.g)[1], 3);
}

TEST(SideStreamPass, JoinsWhereItsInputsWouldDieWhenNothingReadsItsSumsSooner) {
  // Nothing reads db in the step (the optimizer's read comes in another plan): the join is the node
  // after g's last reader, not the end, so g lives as long as on one stream.
  Tail s = tail(Device::cuda(0));
  s.g.nodes[5] = graph_node(OpKind::FusedElementwise, {graph_ref(s.dx, {64, 32})}, graph_ref(s.db2, {32}));
  compile::PassStats stats;
  compile::assign_side_stream(s.g, stats);
  EXPECT_EQ(compile::side_joins(s.g)[1], 5);
  EXPECT_EQ(compile::buffer_lifetimes(s.g)[size_t(s.g_buf)].last, 4);
}

TEST(SideStreamPass, StaysOnTheMainStreamWhereNothingCouldRunBesideIt) {
  {
    Tail s = tail(Device::cpu());  // a CPU plan runs one kernel at a time
    compile::PassStats stats;
    compile::assign_side_stream(s.g, stats);
    EXPECT_EQ(stats.beside, 0u);
    EXPECT_EQ(s.g.nodes[1].stream, 0);
    EXPECT_EQ(compile::side_joins(s.g), std::vector<int>(6, -1));
  }
  {
    // gpt-small's fc gradient, (4096, 2048): the GEMMs after its sums fill the GPU by themselves.
    Tail s = tail(Device::cuda(0));
    s.g.nodes[1].inputs[0]->shape = {4096, 2048};
    s.g.nodes[1].inputs[0]->strides = contiguous_strides({4096, 2048});
    compile::PassStats stats;
    compile::assign_side_stream(s.g, stats);
    EXPECT_EQ(stats.beside, 0u);
    EXPECT_EQ(s.g.nodes[1].stream, 0);
  }
  {
    Tail s = tail(Device::cuda(0));
    // The very next node reads the sums: no node could overlap them.
    std::swap(s.g.nodes[2], s.g.nodes[5]);
    compile::PassStats stats;
    compile::assign_side_stream(s.g, stats);
    EXPECT_EQ(stats.beside, 0u);
    EXPECT_EQ(s.g.nodes[1].stream, 0);
  }
}

// A micro-batch's last kernel whose input nothing reads after it (an embedding's gradient), then the
// next micro-batch's first kernels, a and b small, c large: the step's planned peak is at c.
Graph boundary(int64_t a_floats) {
  Graph g;
  const int x = graph_floats(g, BufferKind::Input, 1024), grad = graph_floats(g, BufferKind::Internal, 1024);
  const int table = graph_floats(g, BufferKind::External, 1024), a = graph_floats(g, BufferKind::Internal, a_floats);
  const int b = graph_floats(g, BufferKind::Internal, 256), c = graph_floats(g, BufferKind::Internal, 4096);
  const int out = graph_floats(g, BufferKind::Internal, 4096);
  for (compile::Buffer& buf : g.buffers) buf.device = Device::cuda(0);
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(x, {1024})}, graph_ref(grad, {1024})));
  g.nodes.push_back(graph_node(OpKind::EmbeddingBackward, {graph_ref(grad, {1024})}, graph_ref(table, {1024}), true));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(x, {1024})}, graph_ref(a, {a_floats})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(a, {a_floats})}, graph_ref(b, {256})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(b, {256})}, graph_ref(c, {4096})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(c, {4096})}, graph_ref(out, {4096})));
  g.outputs.push_back(graph_ref(out, {4096}));
  return g;
}

size_t arena_bytes(const Graph& g) { return compile::plan_memory(g).arena_for(Device::cuda(0))->bytes; }

TEST(SideStreamPass, HoldsInputsWithoutALaterReaderOnlyWhereThePeakStays) {
  {
    Graph g = boundary(256);
    const size_t before = arena_bytes(g);
    compile::PassStats stats;
    compile::assign_side_stream(g, stats);
    // Four nodes' hold would keep grad alive beside c, at the peak; two keep it beside a and b.
    EXPECT_EQ(stats.beside, 1u);
    EXPECT_EQ(g.nodes[1].stream, 1);
    EXPECT_EQ(g.nodes[1].hold, 2);
    EXPECT_EQ(compile::side_joins(g)[1], 4);
    EXPECT_EQ(arena_bytes(g), before);
  }
  {
    Graph g = boundary(8192);  // the peak is now at a, right after the embedding's gradient
    compile::PassStats stats;
    compile::assign_side_stream(g, stats);
    EXPECT_EQ(stats.beside, 0u);
    EXPECT_EQ(g.nodes[1].stream, 0);
    EXPECT_EQ(g.nodes[1].hold, 0);
  }
}

// A layer's backward as the passes leave it, its buffers on a GPU (the step's peak at node 1, where the
// layer above's larger gradient is still live):
//   0: up  = fused_elementwise(x)          (the layer above's gradient)
//   1: g   = fused_elementwise(up)         (the layer's output gradient)
//   2: dx  = data_op(g, w)                 (the data gradient: the layer below waits for it)
//   3: dw  = weight_op(g, act)             (the weight gradient: nothing reads it again in the micro-batch,
//                                           unless a cast into the f32 gradient follows)
//  [4: dwf += multi_tensor_cast(dw)]       (with `cast`: the weight gradient is a 16-bit internal buffer)
//   then t = fused_elementwise(dx), out = fused_elementwise(t): the layer below, on the main stream.
struct LayerBackward {
  Graph g;
  int grad;
};
LayerBackward layer_backward(OpKind data_op, OpKind weight_op, bool cast) {
  LayerBackward l;
  Graph& g = l.g;
  const int x = graph_floats(g, BufferKind::Input, 1024), up = graph_floats(g, BufferKind::Internal, 4096);
  l.grad = graph_floats(g, BufferKind::Internal, 1024);
  const int w = graph_floats(g, BufferKind::External, 1024), act = graph_floats(g, BufferKind::Input, 1024);
  const int dx = graph_floats(g, BufferKind::Internal, 1024);
  const int dw = graph_floats(g, cast ? BufferKind::Internal : BufferKind::External, 1024);
  const int dwf = graph_floats(g, BufferKind::External, 1024), t = graph_floats(g, BufferKind::Internal, 1024);
  const int out = graph_floats(g, BufferKind::Internal, 1024);
  for (compile::Buffer& b : g.buffers) b.device = Device::cuda(0);
  const Shape m{32, 32};
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(x, {1024})}, graph_ref(up, {4096})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(up, {4096})}, graph_ref(l.grad, m)));
  g.nodes.push_back(graph_node(data_op, {graph_ref(l.grad, m), graph_ref(w, m)}, graph_ref(dx, m)));
  g.nodes.push_back(graph_node(weight_op, {graph_ref(act, m), graph_ref(l.grad, m)}, graph_ref(dw, m), !cast));
  if (cast) g.nodes.push_back(graph_node(OpKind::MultiTensorCast, {graph_ref(dw, m)}, graph_ref(dwf, m), true));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(dx, m)}, graph_ref(t, m)));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(t, m)}, graph_ref(out, m)));
  g.outputs.push_back(graph_ref(out, m));
  return l;
}

TEST(SideStreamPass, AWeightGradientAndTheCastThatReadsItBothGoBeside) {
  LayerBackward l = layer_backward(OpKind::Conv2dBackwardInput, OpKind::Conv2dBackwardWeight, true);
  const size_t before = arena_bytes(l.g);
  compile::PassStats stats;
  compile::assign_side_stream(l.g, stats);
  // The weight gradient's next node reads its result; once that cast has gone beside (the first
  // sweep), the gradient goes too (the second), and the side stream runs the two in order.
  EXPECT_EQ(stats.beside, 2u);
  EXPECT_EQ(l.g.nodes[3].stream, 1);
  EXPECT_EQ(l.g.nodes[4].stream, 1);
  EXPECT_GT(l.g.nodes[3].hold, 0);
  const std::vector<int> joins = compile::side_joins(l.g);
  EXPECT_GT(joins[3], 5);  // beside the layer below's node at least
  EXPECT_GT(joins[4], 5);
  EXPECT_EQ(arena_bytes(l.g), before);
}

// A Linear's weight gradient adds into the f32 gradient (matmul_into, in place): it runs beside the
// layer below's first nodes, with the output gradient it reads held for them, the planned arena as before.
TEST(SideStreamPass, AWeightGradientGemmRunsBesideTheLayerBelow) {
  LayerBackward l = layer_backward(OpKind::Matmul, OpKind::MatmulInto, false);
  const size_t before = arena_bytes(l.g);
  compile::PassStats stats;
  compile::assign_side_stream(l.g, stats);
  EXPECT_EQ(stats.beside, 1u);
  EXPECT_EQ(l.g.nodes[3].stream, 1);
  EXPECT_GT(l.g.nodes[3].hold, 0);
  EXPECT_GT(compile::side_joins(l.g)[3], 4);                          // beside the layer below's node at least
  EXPECT_GE(compile::buffer_lifetimes(l.g)[size_t(l.grad)].last, 4);  // g is held while the GEMM may read it
  EXPECT_EQ(arena_bytes(l.g), before);
}

// A micro-batch's start: three nodes of other work, then the cast of a step input x and its reader.
//   0: a = fused_elementwise(e)      1: b = fused_elementwise(a)      2: c = fused_elementwise(b)
//   3: x16 = copy(x) to bf16         4: y = fused_elementwise(x16, c)
// b has `b_floats` floats: large, it makes the step's peak where b lives (nodes 1 and 2).
struct InputCast {
  Graph g;
  int x16;
};
InputCast input_cast(int64_t b_floats) {
  InputCast s;
  Graph& g = s.g;
  const int e = graph_floats(g, BufferKind::Input, 1000), x = graph_floats(g, BufferKind::Input, 1000);
  const int a = graph_floats(g, BufferKind::Internal, 1000), b = graph_floats(g, BufferKind::Internal, b_floats);
  const int c = graph_floats(g, BufferKind::Internal, 1000), y = graph_floats(g, BufferKind::Internal, 8000);
  s.x16 = testing_util::graph_buffer(g, BufferKind::Internal, 1000 * 2);
  for (compile::Buffer& buf : g.buffers) buf.device = Device::cuda(0);
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(e, {1000})}, graph_ref(a, {1000})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(a, {1000})}, graph_ref(b, {b_floats})));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(b, {b_floats})}, graph_ref(c, {1000})));
  g.nodes.push_back(graph_node(OpKind::Copy, {graph_ref(x, {1000})}, graph_ref(s.x16, {1000}, DType::bf16)));
  g.nodes.push_back(graph_node(OpKind::FusedElementwise, {graph_ref(s.x16, {1000}, DType::bf16), graph_ref(c, {1000})},
                               graph_ref(y, {8000})));
  g.outputs.push_back(graph_ref(y, {8000}));
  return s;
}

TEST(SideStreamPass, AStepInputsCastStartsEarlierBesideTheMainStream) {
  InputCast s = input_cast(1000);  // the peak at the reader (y), where x16 is live anyway
  const size_t before = arena_bytes(s.g);
  compile::PassStats stats;
  compile::cast_inputs_early(s.g, stats);
  ASSERT_EQ(s.g.nodes[0].op, OpKind::Copy) << s.g.str();
  EXPECT_EQ(s.g.nodes[0].stream, 1);
  EXPECT_EQ(stats.beside, 1u);
  EXPECT_EQ(compile::side_joins(s.g)[0], 4);  // the main stream waits for it at its reader
  EXPECT_EQ(arena_bytes(s.g), before);
}

TEST(SideStreamPass, AStepInputsCastStaysWhereStartingItEarlierRaisesThePeak) {
  InputCast s = input_cast(20000);  // the peak where b lives: x16 live there too would add to it
  const size_t before = arena_bytes(s.g);
  compile::PassStats stats;
  compile::cast_inputs_early(s.g, stats);
  // It may pass c's node alone (b is dead once c is written), never b's.
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(s.g.nodes[i].op, OpKind::Copy) << s.g.str();
  EXPECT_EQ(arena_bytes(s.g), before);
  compile::Graph cpu = input_cast(1000).g;
  for (compile::Buffer& buf : cpu.buffers) buf.device = Device::cpu();
  compile::cast_inputs_early(cpu, stats);
  EXPECT_EQ(cpu.nodes[3].op, OpKind::Copy) << "a CPU plan runs one kernel at a time";
  EXPECT_EQ(cpu.nodes[3].stream, 0);
}

TEST(SideStreamCuda, TrainingStepsComputeTheSameBitsOnOneStreamAndTwo) {
  REEL_REQUIRE_GPU();
  testing_util::for_each_stream_test_config([](const char* model, compile::Mode mode, const char* precision) {
    const testing_util::CompiledSteps one = testing_util::compiled_steps(
        model, Device::cuda(0), precision, {"side_stream", "input_casts_early", "overlap_micro_batches"}, 0, 3, {},
        false, mode);
    const testing_util::CompiledSteps two = testing_util::compiled_steps(
        model, Device::cuda(0), precision, {"overlap_micro_batches"}, 0, 3, {}, false, mode);
    ASSERT_NE(one.plan(), nullptr);
    ASSERT_NE(two.plan(), nullptr);
    EXPECT_EQ(one.plan()->stats().beside, 0u);
    EXPECT_GT(two.plan()->stats().beside, 0u) << "no node went to the side stream";
    EXPECT_TRUE(testing_util::same_training(two, one));
  });
}

}  // namespace
}  // namespace reel
