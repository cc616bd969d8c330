// REEL_ARENA_OFFSET (compile/runtime/plan.h's arena_offset): the same plan with every arena buffer
// that many bytes into a larger block computes the same bits, on the CPU and (where visible) on a GPU
// in a captured graph; a bad value is an error that names the variable.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile_test_util.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

// A few kernels with Internal buffers between them (a GEMM, a norm, an elementwise chain), compiled
// and called three times; `offset` gets the last plan's arena_offset(), `block` the bytes of the
// arena block its plans share and `planned` the memory plan's.
struct Arena {
  size_t offset = 0, block = 0, planned = 0;
};
std::vector<Tensor> run_compiled(Device device, Arena* arena = nullptr) {
  Generator gen(7);
  Tensor w = randn({64, 64}, {}, &gen).to(device), g = randn({64}, {}, &gen).to(device);
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor h = relu(matmul(in[0], w));
    std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {h, g, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
    return {sum(f[0] * f[0], {1}), f[1]};
  };
  const std::vector<Tensor> in = {randn({32, 64}, {}, &gen).to(device)};
  compile::CompiledFunction f =
      compile::compile(fn, compile::CompileOptions(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default));
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) out = f(in);
  EXPECT_NE(f.last_plan(), nullptr);
  if (arena && f.last_plan()) {
    arena->offset = f.last_plan()->arena_offset();
    arena->block = f.arena_pool().bytes(device);
    for (const compile::Arena& a : f.last_plan()->memory().arenas)
      if (a.device == device) arena->planned = a.bytes;
  }
  return out;
}

void expect_same_bits_with_an_offset(Device device) {
  const std::vector<Tensor> plain = run_compiled(device);
  testing_util::ScopedEnv offset("REEL_ARENA_OFFSET", "34603008");  // 33 MiB
  Arena arena;
  const std::vector<Tensor> shifted = run_compiled(device, &arena);
  EXPECT_EQ(arena.offset, size_t(34603008));
  EXPECT_GT(arena.planned, 0u);
  EXPECT_EQ(arena.block, arena.planned + arena.offset) << "the block is the plan's arena and the offset";
  ASSERT_EQ(shifted.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(testing_util::same_bits(shifted[i].to_vector<double>(), plain[i].to_vector<double>())) << "output " << i;
}

TEST(ArenaOffset, TheSamePlanAtOtherAddressesComputesTheSameBits) { expect_same_bits_with_an_offset(Device::cpu()); }

TEST(ArenaOffset, BadValuesAreErrorsThatNameTheVariable) {
  for (const char* bad : {"100", "-256", "33MiB", "1e6"}) {
    SCOPED_TRACE(bad);
    testing_util::ScopedEnv offset("REEL_ARENA_OFFSET", bad);
    testing_util::expect_error([] { run_compiled(Device::cpu()); },
                               {"REEL_ARENA_OFFSET", "a multiple of 256", std::string("'") + bad + "'"});
  }
}

TEST(ArenaOffsetCuda, TheSamePlanAtOtherAddressesComputesTheSameBits) {
  REEL_REQUIRE_GPU();
  expect_same_bits_with_an_offset(Device::cuda(0));
}

}  // namespace
}  // namespace reel
