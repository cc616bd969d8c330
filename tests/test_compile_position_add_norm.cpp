// The first block's residual add joining its layer norm (compile/passes/fuse_norm_cast.cpp): a GPT's
// x = token embedding + position table, the table (T, C) or a ViT's (1, T, C) broadcast over the batch,
// is computed by the norm's kernel (layer_norm_cast with a broadcast addend), which writes the sum for
// the residual stream and normalises it. On the CPU always, on the GPU where visible:
//   - one layer_norm_cast node reading the table itself, no add node; every output equal to eager's to
//     the bit (the kernel adds and rounds as the add op does);
//   - with norm_cast off, the add (in an elementwise kernel) and the norm as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

void expect_position_add_in_the_norm(Device device, const Shape& table_shape) {
  Generator gen(61);
  const int64_t C = table_shape.back();
  Tensor table = randn(table_shape, {}, &gen).to(device);
  Tensor w = randn({C}, {}, &gen).to(device), b = randn({C}, {}, &gen).to(device);
  Tensor W = to_dtype(randn({C, 32}, {}, &gen).to(device), DType::bf16);
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor x = in[0] + table;  // the embedding's output plus the position table
    std::vector<Tensor> f =
        dispatch(OpKind::LayerNorm, {x, w, b}, Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
    return {matmul(to_dtype(f[0], DType::bf16), W), f[1], f[2], x * 2.0};
  };
  const std::vector<Tensor> in = {randn({3, table_shape[table_shape.size() - 2], C}, {}, &gen).to(device)};
  const std::vector<Tensor> eager = fn(in);
  for (bool on : {true, false}) {
    SCOPED_TRACE(std::string(on ? "pass on, " : "pass off, ") + shape_str(table_shape) + ", " + device.str());
    compile::CompileOptions o(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
    if (!on) o.disabled_passes = {"norm_cast"};
    compile::CompiledFunction f = compile::compile(fn, o);
    std::vector<Tensor> out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    size_t fused = 0, adds = 0;
    for (const compile::Node& n : f.last_plan()->graph().nodes) {
      const bool norm = n.op == OpKind::LayerNormCast;
      fused += norm && n.inputs.size() == 4 && n.inputs[3]->shape == table_shape;
      adds += !norm && (n.op == OpKind::Add || std::count(n.fused.begin(), n.fused.end(), "add") > 0);
    }
    EXPECT_EQ(fused, on ? 1u : 0u) << f.last_plan()->graph().str();
    EXPECT_EQ(adds, on ? 0u : 1u) << f.last_plan()->graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_EQ(out[k].to_vector<double>(), eager[k].to_vector<double>()) << "output " << k;
  }
}

TEST(PositionAddNorm, TheTableJoinsTheNormsKernelWithEagersBitsOnTheCpu) {
  for (int64_t C : {48, 256}) {
    expect_position_add_in_the_norm(Device::cpu(), {10, C});
    expect_position_add_in_the_norm(Device::cpu(), {1, 10, C});
  }
}

TEST(PositionAddNorm, TheTableJoinsTheNormsKernelWithEagersBitsOnTheGpu) {
  REEL_REQUIRE_GPU();
  for (int64_t C : {48, 256}) {
    expect_position_add_in_the_norm(Device::cuda(0), {10, C});
    expect_position_add_in_the_norm(Device::cuda(0), {1, 10, C});
  }
}

}  // namespace
}  // namespace reel
