// A stack's last layer norm in the backward (compile/passes/fuse_norm_backward_add.cpp, the residual
// absent): no residual's add follows it, yet its dx's 16-bit cast for the GEMMs before it and that
// copy's column sums (the bias gradient of the Linear whose output it normalised) join its kernel,
// as layer_norm_backward_add without a residual. On the CPU always, on the GPU where visible:
//   - one layer_norm_backward_add node, fused as layer_norm_backward, copy, sum; no cast or sum left;
//   - dx, dw, db and the GEMM on the copy equal eager's to the bit; the bias gradient within bf16's
//     rounding of the summands (it sums the 16-bit copy, as the bias pass does everywhere);
//   - with the pass off, the three kernels as before.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "compile_test_util.h"
#include "test_util.h"

namespace reel {
namespace {

void expect_last_norm_fused(Device device) {
  Generator gen(47);
  const int64_t C = 128;  // the row-in-registers kernels on CUDA
  Tensor w = randn({C}, {}, &gen).to(device), b = randn({C}, {}, &gen).to(device);
  Tensor Wh = to_dtype(randn({C, 32}, {}, &gen).to(device), DType::bf16);
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor &x = in[0], &g = in[1];
    std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, b}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
    std::vector<Tensor> d = dispatch(OpKind::LayerNormBackward, {g, x, w, f[1], f[2]});
    Tensor db = sum(d[0], {0, 1});  // the bias gradient of the Linear before
    Tensor g16 = to_dtype(d[0], DType::bf16);
    return {d[0], d[1], d[2], matmul(g16, Wh), db};
  };
  const std::vector<Tensor> in = {randn({3, 40, C}, {}, &gen).to(device), randn({3, 40, C}, {}, &gen).to(device)};
  const std::vector<Tensor> eager = fn(in);
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "pass on" : "pass off");
    compile::CompileOptions o(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
    if (!on) o.disabled_passes = {"norm_backward_add"};
    compile::CompiledFunction f = compile::compile(fn, o);
    std::vector<Tensor> out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    const compile::Plan& p = *f.last_plan();
    size_t fused = 0, casts = 0, sums = 0;
    for (const compile::Node& n : p.graph().nodes) {
      fused += testing_util::is_norm_backward_node(n) &&
               n.fused == std::vector<std::string>{"layer_norm_backward", "copy", "sum"} && !n.inputs[5];
      casts += n.op == OpKind::Copy;
      sums += n.op == OpKind::ColumnSums || n.op == OpKind::Sum;
    }
    EXPECT_EQ(fused, on ? 1u : 0u) << p.graph().str();
    EXPECT_EQ(casts + sums, on ? 0u : 2u) << p.graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < 4; ++k)
      EXPECT_EQ(out[k].to_vector<double>(), eager[k].to_vector<double>()) << "output " << k;
    EXPECT_LT(testing_util::max_rel_diff(out[4], eager[4]), 1e-2);  // summands rounded to bf16
  }
}

TEST(LastNormBackward, ItsCastAndColumnSumsJoinItOnTheCpu) { expect_last_norm_fused(Device::cpu()); }

TEST(LastNormBackward, ItsCastAndColumnSumsJoinItOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_last_norm_fused(Device::cuda(0));
}

}  // namespace
}  // namespace reel
