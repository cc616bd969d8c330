// Embedding backward on the GPU against the CPU, to the bit in f32 (both sum each row's positions in
// ascending order): short index lists take the one-launch scan (kernels/cuda/pool.cu), long ones the
// radix-sort path; with repeated rows, rows no position uses, widths that are not a multiple of a
// warp, and tables wider than one block's 1024 (scan) or 128 (sort) columns. Skips without a GPU.
#include <gtest/gtest.h>

#include "kernels/dispatch.h"
#include "test_util.h"

using namespace reel;

TEST(EmbeddingCuda, BackwardEqualsTheCpuOnBothPaths) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Generator gen(51);
  struct Case {
    int64_t n, V, width;
    const char* path;
  };
  for (Case c : {Case{2048, 256, 64, "scan"}, Case{300, 40, 200, "scan"}, Case{4096, 256, 512, "scan"},
                 Case{500, 30, 1100, "scan"}, Case{77, 9, 33, "scan"}, Case{20000, 300, 70, "sort"},
                 Case{9000, 5000, 16, "sort"}}) {
    SCOPED_TRACE(std::string(c.path) + ": n " + std::to_string(c.n) + ", V " + std::to_string(c.V));
    // Ids over [0, V - V/8): the top rows get no position and must come out zero.
    std::vector<int64_t> values(size_t(c.n));
    for (int64_t i = 0; i < c.n; ++i) values[size_t(i)] = (i * 7919 + (i * i) % 131) % (c.V - c.V / 8);
    Tensor ids = tensor_i64(values, {c.n});
    Tensor g = randn({c.n, c.width}, {}, &gen);
    Attrs a = Attrs().set("num_weights", c.V);
    Tensor cpu = dispatch(OpKind::EmbeddingBackward, {g, ids}, a)[0];
    Tensor dev = dispatch(OpKind::EmbeddingBackward, {g.to(gpu), ids.to(gpu)}, a)[0];
    EXPECT_EQ(dev.to_vector<float>(), cpu.to_vector<float>());
  }
}
