// The grad_casts pass (compile/passes/fuse_grad_casts.cpp): a micro-batch's 16-bit convolution weight
// gradients are cast into (first micro-batch) or added to (the others) the f32 parameter gradients by
// one multi_tensor_cast node instead of a kernel each. On the CPU always, on the GPU where visible
// (where the sources are channels-last and the casts tiled transposes):
//   - cnn-small and resnet18-cifar (ACCUM 2, micro-batches of 2), bf16 and fp16: the same losses and
//     parameters to the bit with the pass on and off; the weight gradients gathered into nodes
//     (cnn-small: all five of each micro-batch; resnet18-cifar: the groups whose held sources leave
//     its planned arena as it was), the plan that many kernels shorter, its arena no larger;
//   - fp32: no 16-bit weight gradients, the plan untouched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

struct Census {
  size_t creating = 0, accumulating = 0;  // multi_tensor_cast nodes into f32 gradients
  size_t gathered = 0;                    // weight gradients in them
};
Census census(const compile::Plan& p) {
  Census c;
  for (const compile::Node& n : p.graph().nodes) {
    if (n.op != OpKind::MultiTensorCast || n.outputs.empty() || n.outputs[0].dtype != DType::f32) continue;
    const bool add = n.attrs.b("accumulate", false);
    (add ? c.accumulating : c.creating) += 1;
    c.gathered += n.outputs.size();
  }
  return c;
}

void expect_same_training_fewer_kernels(const std::string& model, Device device, size_t min_gathered) {
  for (const char* precision : {"bf16", "fp16", "fp32"}) {
    SCOPED_TRACE(model + ", " + precision + ", " + device.str());
    const bool autocast = std::string(precision) != "fp32";
    // norm_relu off in both: at two samples a micro-batch its smaller plan leaves the arena guard a
    // KiB's difference to turn a group down on (cnn-small's second micro-batch); the pass is tested
    // with it in tests/test_compile_norm_relu.cpp and on the benchmark models' plans.
    const testing_util::CompiledSteps on = testing_util::compiled_steps(model, device, precision, {"norm_relu"}),
                                      off = testing_util::compiled_steps(model, device, precision,
                                                                         {"grad_casts", "norm_relu"});
    ASSERT_NE(on.plan(), nullptr);
    ASSERT_NE(off.plan(), nullptr);
    EXPECT_TRUE(testing_util::same_training(on, off)) << "the copies' and adds' bits";
    const Census c = census(*on.plan());
    EXPECT_EQ(census(*off.plan()).gathered, 0u);
    if (!autocast) {
      EXPECT_EQ(c.gathered, 0u);
      EXPECT_EQ(on.plan()->kernels(), off.plan()->kernels());
      continue;
    }
    EXPECT_GE(c.creating + c.accumulating, 1u);
    EXPECT_GE(c.gathered, min_gathered);
    // Each node replaces its members' casts (and, for the adds, the adds: elementwise fusion had made
    // one kernel of each cast and add).
    EXPECT_EQ(on.plan()->kernels() + c.gathered - (c.creating + c.accumulating), off.plan()->kernels());
    const auto arena = [&](const testing_util::CompiledSteps& s) {
      return s.plan()->memory().arena_for(device)->bytes;
    };
    EXPECT_LE(arena(on), arena(off));
  }
}

TEST(GradCastsPass, CnnSmallTrainsToTheSameBitsWithFewerKernelsOnTheCpu) {
  expect_same_training_fewer_kernels("cnn-small", Device::cpu(), 10);  // 5 convolutions x 2 micro-batches
}
TEST(GradCastsPass, Resnet18CifarTrainsToTheSameBitsWithFewerKernelsOnTheCpu) {
  expect_same_training_fewer_kernels("resnet18-cifar", Device::cpu(), 2);
}
TEST(GradCastsPass, CnnSmallTrainsToTheSameBitsWithFewerKernelsOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_same_training_fewer_kernels("cnn-small", Device::cuda(0), 10);
}

// The accumulating multi_tensor_cast's bad calls: a clear error naming the op and the tensors.
TEST(GradCastsPass, AccumulatingCastErrorsNameTheTensors) {
  const Attrs acc = Attrs().set("dtype", DType::f32).set("accumulate", true);
  const Tensor x = zeros({4, 3}, {DType::bf16}), y = zeros({4, 3});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::MultiTensorCast, {x, x, y}, acc);
      },
      {"multi_tensor_cast", "accumulate", "3 inputs"});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::MultiTensorCast, {x, zeros({3, 4})}, acc);
      },
      {"multi_tensor_cast", "accumulated tensor 0", "(3, 4) f32", "(4, 3) bf16"});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::MultiTensorCast, {x, zeros({4, 3}, {DType::f64})}, acc);
      },
      {"multi_tensor_cast", "(4, 3) f64", "cast to f32"});
}

}  // namespace
}  // namespace reel
