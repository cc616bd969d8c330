// A layer norm backward's parameter sums as a node of their own (compile/passes/split_norm_param_sums.h):
//   - whole GPT steps traced on the CPU and split as a GPU's plan would be (a fixed count of parts):
//     every layer_norm_backward_add becomes layer_norm_backward_partials and layer_norm_param_sums
//     over the same buffers; the side stream then takes sums nodes (where their partials held past the
//     next nodes leave the planned peak within their bytes), and the schedule keeps every dependency;
//   - where no kernel answers (a CPU plan, rows the GPU's kernel does not take) nothing splits, and the
//     two ops refuse bad calls with errors that name them;
//   - on a GPU: the parts the kernel answers (its one wave), and training steps that compute the same
//     bits with the pass on (asked for: it is off by default) and off, captured in a CUDA graph and
//     launched one by one.
// The two ops' values, on every backend against plain loops and the CPU, are op-harness cases
// (tests/op_harness/cases_fused.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/passes/overlap_micro_batches.h"
#include "compile/passes/side_stream.h"
#include "compile/passes/split_norm_param_sums.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "schedule_check.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

using compile::Graph;
using compile::Node;

// Every node's last `fused` name becomes "#i", i its index now (the traced order the schedule check
// compares with).
void relabel(Graph& g) {
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].fused.back() = "#" + std::to_string(i);
}

TEST(SplitNormParamSumsPass, EveryNormBackwardOfAGptStepSplitsOverItsOwnBuffers) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    Graph g = testing_util::fused_step_on_gpu("gpt-tiny", precision);
    std::vector<Node> before;
    for (const Node& n : g.nodes)
      if (n.op == OpKind::LayerNormBackwardAdd) before.push_back(n);
    ASSERT_GT(before.size(), 0u);
    const size_t nodes = g.nodes.size();
    compile::PassStats stats;
    stats.fused = 1000;
    compile::split_norm_param_sums(g, stats, [](const Graph&, const Node&) { return int64_t(5); });
    EXPECT_EQ(g.nodes.size(), nodes + before.size());
    EXPECT_EQ(stats.fused, 1000 - before.size()) << "each split takes one node back from the fused count";
    EXPECT_EQ(testing_util::count_op(g, OpKind::LayerNormBackwardAdd), 0u);
    size_t k = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.op != OpKind::LayerNormBackwardPartials) continue;
      ASSERT_LT(k, before.size());
      ASSERT_LT(i + 1, g.nodes.size());
      const Node &was = before[k++], &sums = g.nodes[i + 1];
      const bool copy16 = was.attrs.has("dtype"), column_sums = was.attrs.b("column_sums", false);
      ASSERT_EQ(sums.op, OpKind::LayerNormParamSums);
      // The backward: the inputs but the sums to add to, out (and out16) where they were, the partials new.
      EXPECT_EQ(n.attrs.i("parts"), 5);
      ASSERT_EQ(n.outputs.size(), 2u + copy16);
      EXPECT_TRUE(compile::same_ref(n.outputs[0], was.outputs[0]));
      if (copy16) {
        EXPECT_TRUE(compile::same_ref(n.outputs[2], was.outputs[3]));
      }
      const compile::TensorRef& part = n.outputs[1];
      EXPECT_EQ(part.shape, (Shape{5, column_sums ? 3 : 2, was.outputs[1].shape[0]}));
      EXPECT_EQ(part.dtype, DType::f32);
      EXPECT_EQ(g.buffers[size_t(part.buffer)].kind, compile::BufferKind::Internal);
      for (size_t in = 0; in < 6; ++in) {
        ASSERT_EQ(bool(n.inputs[in]), bool(was.inputs[in]));
        if (was.inputs[in]) {
          EXPECT_TRUE(compile::same_ref(*n.inputs[in], *was.inputs[in]));
        }
      }
      // The sums: read the partials (and the sums to add to), write dw, db (and the sums) where they were.
      ASSERT_GE(sums.inputs.size(), 1u);
      EXPECT_TRUE(compile::same_ref(*sums.inputs[0], part));
      EXPECT_EQ(sums.attrs.b("accumulate", false), was.attrs.b("accumulate", false));
      ASSERT_EQ(sums.outputs.size(), 2u + column_sums);
      EXPECT_TRUE(compile::same_ref(sums.outputs[0], was.outputs[1]));
      EXPECT_TRUE(compile::same_ref(sums.outputs[1], was.outputs[2]));
      if (column_sums) {
        EXPECT_TRUE(compile::same_ref(sums.outputs[2], was.outputs[3 + copy16]));
      }
      EXPECT_EQ(n.phase, was.phase);
      EXPECT_EQ(sums.phase, was.phase);
    }
    EXPECT_EQ(k, before.size());

    // Scheduled as the pipeline does after it: the side stream takes sums nodes (those whose partials
    // held past the next nodes would leave the planned peak where it was), and every dependency holds.
    relabel(g);
    const size_t split_nodes = g.nodes.size();
    compile::assign_side_stream(g, stats);
    compile::cast_inputs_early(g, stats);
    compile::run_side_nodes_late(g, stats);
    compile::overlap_micro_batches(g, stats, 8, 16);
    size_t beside = 0;
    for (const Node& n : g.nodes)
      if (n.op == OpKind::LayerNormParamSums) beside += n.stream == 1;
    EXPECT_GT(beside, 0u) << "every layer_norm_param_sums node stayed on the main stream";
    testing_util::expect_a_sound_schedule(g, split_nodes);
  }
}

TEST(SplitNormParamSumsPass, NothingSplitsWhereNoKernelLeavesPartials) {
  Graph g = testing_util::fused_step_on_gpu("gpt-tiny", "bf16");
  const size_t nodes = g.nodes.size();
  compile::PassStats stats;
  compile::split_norm_param_sums(g, stats, [](const Graph&, const Node&) { return int64_t(0); });
  EXPECT_EQ(g.nodes.size(), nodes);
  EXPECT_EQ(testing_util::count_op(g, OpKind::LayerNormBackwardPartials), 0u);

  // A CPU plan: no CPU kernel answers kernel_parts, so the pipeline's pass leaves it whole.
  const testing_util::CompiledSteps cpu = testing_util::compiled_steps("gpt-tiny", Device::cpu(), "bf16", {});
  ASSERT_NE(cpu.plan(), nullptr);
  EXPECT_GT(testing_util::count_op(*cpu.plan(), OpKind::LayerNormBackwardAdd), 0u);
  EXPECT_EQ(testing_util::count_op(*cpu.plan(), OpKind::LayerNormBackwardPartials), 0u);
  EXPECT_EQ(testing_util::count_op(*cpu.plan(), OpKind::LayerNormParamSums), 0u);
}

// The inputs of a layer norm backward over (rows, cols) f32 rows with a 16-bit g.
std::vector<Tensor> norm_backward_inputs(int64_t rows, int64_t cols, Device device) {
  const TensorOptions on = TensorOptions().with_device(device);
  Tensor x = randn({rows, cols}, on), w = ones({cols}, on);
  std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                   Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
  return {randn({rows, cols}, on).to(DType::bf16), x, w, f[1], f[2], Tensor()};
}

TEST(SplitNormParamSumsOps, BadCallsAreErrorsThatNameTheOp) {
  std::vector<Tensor> in = norm_backward_inputs(16, 128, Device::cpu());
  testing_util::expect_error(
      [&] { infer_outputs(OpKind::LayerNormBackwardPartials, in, Attrs().set("parts", int64_t(0))); },
      {"layer_norm_backward_partials", "parts must be >= 1, got 0"});
  testing_util::expect_error(
      [&] {
        infer_outputs(OpKind::LayerNormBackwardPartials, in,
                      Attrs().set("parts", int64_t(2)).set("dtype", DType::bf16).set("column_sums", true).set("accumulate", true));
      },
      {"layer_norm_backward_partials", "accumulate belongs to layer_norm_param_sums"});
  testing_util::expect_error(
      [&] { infer_outputs(OpKind::LayerNormParamSums, {zeros({4, 5, 8})}); },
      {"layer_norm_param_sums", "(4, 5, 8) f32", "(parts, 2 or 3, cols)"});
  testing_util::expect_error(
      [&] {
        infer_outputs(OpKind::LayerNormParamSums, {zeros({4, 2, 8}), zeros({8})},
                      Attrs().set("accumulate", true));
      },
      {"layer_norm_param_sums", "accumulate adds to the column sums", "(4, 2, 8) f32"});
  std::vector<Tensor> wrong_g = in;
  wrong_g[0] = randn({16, 64});
  testing_util::expect_error(
      [&] { infer_outputs(OpKind::LayerNormBackwardPartials, wrong_g, Attrs().set("parts", int64_t(2))); },
      {"layer_norm_backward_partials", "(16, 64)", "(16, 128)"});
  testing_util::expect_error(
      [&] {
        infer_outputs(OpKind::LayerNormBackwardPartials, std::vector<Tensor>(in.begin(), in.begin() + 5),
                      Attrs().set("parts", int64_t(2)));
      },
      {"layer_norm_backward_partials takes 6 inputs", "got 5"});
  EXPECT_EQ(kernel_parts(OpKind::LayerNormBackwardPartials, in, Attrs()), 0) << "the CPU leaves no partials";
}

// ---- on a GPU ----

TEST(SplitNormParamSumsCuda, PartsAreTheBackwardKernelsOneWave) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (int64_t cols : {256, 512}) {
    const int64_t parts = kernel_parts(OpKind::LayerNormBackwardPartials, norm_backward_inputs(4096, cols, gpu),
                                       Attrs().set("dtype", DType::bf16).set("column_sums", true));
    EXPECT_GT(parts, 0) << cols << " columns";
    EXPECT_LE(parts, 4096 / 8) << cols << " columns";  // at most a block for each eight rows
  }
  // Few rows: a block for each eight.
  EXPECT_EQ(kernel_parts(OpKind::LayerNormBackwardPartials, norm_backward_inputs(40, 256, gpu), Attrs()), 5);
  // Rows the row-in-registers kernel does not take.
  EXPECT_EQ(kernel_parts(OpKind::LayerNormBackwardPartials, norm_backward_inputs(64, 40, gpu), Attrs()), 0);
}

TEST(SplitNormParamSumsCuda, TrainingStepsComputeTheSameBitsSplitOrNot) {
  REEL_REQUIRE_GPU();
  testing_util::for_each_stream_test_config([](const char* model, compile::Mode mode, const char* precision) {
    // The pass is off by default (pipeline.cpp): on is asking for it.
    const testing_util::CompiledSteps off =
        testing_util::compiled_steps(model, Device::cuda(0), precision, {}, 0, 3, {}, false, mode);
    const testing_util::CompiledSteps on = testing_util::compiled_steps(
        model, Device::cuda(0), precision, {}, 0, 3, {"split_norm_param_sums"}, false, mode);
    ASSERT_NE(off.plan(), nullptr);
    ASSERT_NE(on.plan(), nullptr);
    const size_t norms = testing_util::count_op(*off.plan(), OpKind::LayerNormBackwardAdd);
    EXPECT_EQ(testing_util::count_op(*on.plan(), OpKind::LayerNormParamSums), norms);
    EXPECT_EQ(testing_util::count_op(*on.plan(), OpKind::LayerNormBackwardAdd), 0u);
    if (std::string(model) == "gpt-tiny") {
      EXPECT_GT(norms, 0u);
      size_t beside = 0;
      for (const Node& n : on.plan()->graph().nodes) beside += n.op == OpKind::LayerNormParamSums && n.stream == 1;
      if (mode == compile::Mode::ReduceOverhead) {
        EXPECT_GT(beside, 0u) << "no sums node on the side stream";
      }
    }
    EXPECT_TRUE(testing_util::same_training(on, off));
  });
}

}  // namespace
}  // namespace reel
