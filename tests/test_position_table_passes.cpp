// The embedding tables' kernels dropped by two passes (compile/passes/identity_gathers.cpp reads the
// position table's rows in place and makes its gradient the batch sum; compile/passes/write_sums_into_grads.cpp
// has that sum, every bias's and the token table's scatter write the gradient itself), on every device:
//   - gpt-tiny's compiled step (ACCUM 2) with the two passes on follows the step with them off to
//     the bit, in fp32, bf16 and fp16, with fewer kernels (the CPU always; the GPU where visible);
//   - on the GPU, the column_sums kernel over the (rows, columns) view of an f32 tensor, written or
//     added into a gradient, equals the sum op over its leading dims and then the add, to the bit:
//     what the second pass's rewrite rests on.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/cuda/column_sums.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::same_bits;

// Embedding backwards that write their gradient (the first micro-batch) and add to it (the later ones).
struct Scatters {
  size_t written = 0, added = 0;
};
Scatters scatters(const compile::Plan& p) {
  Scatters c;
  for (const compile::Node& n : p.graph().nodes) {
    const bool into_grad = n.op == OpKind::EmbeddingBackward && n.fused.size() == 2;
    c.written += into_grad && n.fused[1] == "copy";
    c.added += into_grad && n.fused[1] == "add" && n.attrs.b("accumulate");
  }
  return c;
}

void expect_passes_keep_the_bits(Device device) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const testing_util::CompiledSteps off = testing_util::compiled_steps("gpt-tiny", device, precision,
                                                                         {"identity_gathers", "sums_into_grads"}),
                                      on = testing_util::compiled_steps("gpt-tiny", device, precision, {});
    ASSERT_NE(off.plan(), nullptr);
    ASSERT_NE(on.plan(), nullptr);
    // Per micro-batch at least the position lookup, its scatter and the gradient's add, and the
    // token table's copy or add: the tokens' scatter writes the gradient (the first micro-batch) and
    // adds to it (the second).
    EXPECT_LE(on.plan()->kernels() + 4 * 2, off.plan()->kernels());
    const Scatters s_on = scatters(*on.plan()), s_off = scatters(*off.plan());
    EXPECT_EQ(s_on.written, 1u);
    EXPECT_EQ(s_on.added, 1u);
    EXPECT_EQ(s_off.written + s_off.added, 0u);
    EXPECT_TRUE(testing_util::same_training(on, off));
  }
}

TEST(PositionTablePasses, GptTinyFollowsTheStepWithoutThemToTheBitOnTheCpu) {
  expect_passes_keep_the_bits(Device::cpu());
}

TEST(PositionTablePasses, GptTinyFollowsTheStepWithoutThemToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_passes_keep_the_bits(Device::cuda(0));
}

#ifdef REEL_CUDA
TEST(PositionTablePasses, ColumnSumsIntoAGradientAreTheSumAndTheAddOnTheGpu) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Generator gen(61);
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // gpt-small's and gpt-tiny's position gradients, vit-tiny's, a bias's (dims 0 and 1), columns that
  // are no multiple of 4 (not the wide loads), few columns of many rows.
  for (const Case& c :
       {Case{{16, 256, 512}, {0}}, Case{{16, 128, 256}, {0}}, Case{{32, 65, 192}, {0}}, Case{{4, 50, 96}, {0, 1}},
        Case{{3, 7, 5}, {0}}, Case{{2, 3, 600}, {0, 1}}, Case{{4096, 2, 4}, {0}}}) {
    SCOPED_TRACE(shape_str(c.shape));
    Tensor x = randn(c.shape, {}, &gen).to(gpu);
    int64_t rows = 1;
    for (int64_t d : c.dims) rows *= c.shape[size_t(d)];
    const int64_t cols = x.numel() / rows;
    const Tensor start = randn({cols}, {}, &gen).to(gpu);
    const Tensor s = sum(x, c.dims).reshape({cols});
    const Tensor added = start + s;
    Tensor written = Tensor::empty({cols}, DType::f32, gpu), accumulated = clone(start);
    cuda::column_sums_into(x.reshape({rows, cols}), written);
    cuda::column_sums_into(x.reshape({rows, cols}), accumulated, true);
    EXPECT_TRUE(same_bits(written.to_vector<double>(), s.to_vector<double>()));
    EXPECT_TRUE(same_bits(accumulated.to_vector<double>(), added.to_vector<double>()));
  }
}
#endif  // REEL_CUDA

}  // namespace
}  // namespace reel
