// Length buckets (CompileOptions::buckets): calls of many lengths share one plan per bucket, the
// padding leaves a causal GPT's loss over the real positions as it was, and a length above the largest
// bucket, or a malformed spec, is a reel::Error that says so.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "data/text_lines.h"
#include "nn/nn.h"
#include "reel.h"
#include "test_util.h"

namespace reel {
namespace {

compile::LengthBuckets token_buckets(std::vector<int64_t> sizes) {
  // (token ids, targets): ids padded with the pad token, targets with cross_entropy's ignore_index.
  return {{0, 1}, 1, std::move(sizes), {double(data::kPadToken), double(data::kIgnoreIndex)}};
}

TEST(CompileBuckets, OnePlanPerBucketAndTheLossOfTheUnpaddedSequences) {
  Generator gen(5);
  auto gpt = nn::gpt(nn::GptConfig{256, 32, 16, 2, 2}, &gen);
  gpt->to(DType::f64);
  NoGradGuard no_grad;
  auto loss = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {nn::model_loss(*gpt, in[0], in[1])};
  };
  compile::CompileOptions options(compile::Mode::Default);
  options.buckets = token_buckets({8, 16, 32});
  compile::CompiledFunction f = compile::compile(loss, options);
  const std::vector<std::string> lines = {"short", "a line of some length", "another line, a longer one, near 32!",
                                          "mid-sized line", "x!", "eight ch", "nine char"};
  data::LineSampler sampler(lines, 32, 2);
  std::vector<int64_t> lengths;
  for (int call = 0; call < 24; ++call) {
    data::LineBatch b = sampler.next(2);
    lengths.push_back(b.inputs.size(1));
    const double eager = nn::model_loss(*gpt, b.inputs, b.targets).item();
    const double compiled = f({b.inputs, b.targets})[0].item();
    EXPECT_NEAR(compiled, eager, 1e-12 * std::abs(eager)) << "call " << call << ", length " << b.inputs.size(1);
  }
  // Every call's length fell in one of the three buckets: three plans however many lengths.
  std::sort(lengths.begin(), lengths.end());
  EXPECT_GT(std::unique(lengths.begin(), lengths.end()) - lengths.begin(), 3) << "too few lengths to test buckets";
  int64_t calls = 0;
  for (const auto& [size, n] : f.bucket_calls()) {
    EXPECT_TRUE(size == 8 || size == 16 || size == 32) << size;
    calls += n;
  }
  EXPECT_EQ(calls, 24);
  EXPECT_EQ(f.traces(), int(f.bucket_calls().size()));
  EXPECT_GE(f.replays(), 24 - 3 * int(f.bucket_calls().size()));
}

// The buckets' plans share one arena (compile/runtime/arena_pool.h): it is as large as the largest
// plan's, not their sum. Visited smallest first, it grows once per new largest, each plan binding to
// the new block at its next call; the results stay those of the unpadded sequences throughout.
TEST(CompileBuckets, PlansShareOneArenaAsLargeAsTheLargest) {
  Generator gen(5);
  auto gpt = nn::gpt(nn::GptConfig{256, 32, 16, 2, 2}, &gen);
  gpt->to(DType::f64);
  auto loss = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor l = nn::model_loss(*gpt, in[0], in[1]);
    l.backward();  // a training-like step: the backward's buffers are in the arena too
    return {l};
  };
  compile::CompileOptions options(compile::Mode::Default);
  options.buckets = token_buckets({8, 16, 32});
  compile::CompiledFunction f = compile::compile(loss, options);
  auto tokens = [](int64_t n, int64_t salt) {
    std::vector<int64_t> v(size_t(2 * n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 7 + size_t(salt)) % 200) + 1;
    return tensor_i64(v, {2, n});
  };
  size_t largest = 0, summed = 0;
  std::map<int64_t, size_t> arena_of;  // by bucket
  const std::vector<int64_t> lengths{5, 5, 12, 12, 30, 30, 6, 13, 31, 7};
  for (size_t call = 0; call < lengths.size(); ++call) {
    const int64_t n = lengths[call];
    const Tensor x = tokens(n, int64_t(call)), y = tokens(n, int64_t(call) + 3);
    for (Tensor& p : gpt->parameters()) p.set_grad(Tensor());
    const double eager = nn::model_loss(*gpt, x, y).item();
    for (Tensor& p : gpt->parameters()) p.set_grad(Tensor());
    const double compiled = f({x, y})[0].item();
    EXPECT_NEAR(compiled, eager, 1e-12 * std::abs(eager)) << "call " << call << ", length " << n;
    if (const compile::Plan* plan = f.last_plan()) {
      const int64_t bucket = n <= 8 ? 8 : n <= 16 ? 16 : 32;
      const size_t bytes = plan->memory().arena_for(Device::cpu())->bytes;
      if (!arena_of.count(bucket)) summed += bytes;
      arena_of[bucket] = bytes;
      largest = std::max(largest, bytes);
    }
  }
  ASSERT_EQ(arena_of.size(), 3u);
  EXPECT_LT(arena_of[8], arena_of[16]);
  EXPECT_LT(arena_of[16], arena_of[32]);
  EXPECT_EQ(f.arena_pool().bytes(Device::cpu()), largest);
  EXPECT_LT(largest, summed);
  EXPECT_EQ(f.arena_pool().growths(), 2);  // 8 -> 16 -> 32; the later calls fit
}

TEST(CompileBuckets, PowersOfTwoEndAtTheLargest) {
  EXPECT_EQ(compile::LengthBuckets::powers_of_two(32, 256), (std::vector<int64_t>{32, 64, 128, 256}));
  EXPECT_EQ(compile::LengthBuckets::powers_of_two(16, 100), (std::vector<int64_t>{16, 32, 64, 100}));
  EXPECT_EQ(compile::LengthBuckets::powers_of_two(7, 7), (std::vector<int64_t>{7}));
  testing_util::expect_error([] { compile::LengthBuckets::powers_of_two(0, 8); }, {"powers_of_two(0, 8)"});
}

TEST(CompileBuckets, BadSpecsAndTooLongCallsAreRefused) {
  auto identity = [](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {in[0] * 2.0}; };
  compile::CompileOptions options;
  options.buckets = compile::LengthBuckets{{0}, 1, {4, 8}, {}};
  testing_util::expect_error([&] { compile::compile(identity, options); }, {"one pad value per bucketed input", "1 inputs", "0 pad"});
  options.buckets = compile::LengthBuckets{{0}, 1, {8, 4}, {0.0}};
  testing_util::expect_error([&] { compile::compile(identity, options); }, {"ascending", "4 at position 1"});
  options.buckets = compile::LengthBuckets{{0}, 1, {4, 8}, {0.0}};
  compile::CompiledFunction f = compile::compile(identity, options);
  testing_util::expect_error([&] { f({zeros({2, 9})}); }, {"length 9", "largest bucket, 8"});
  testing_util::expect_error([&] { f({zeros({9})}); }, {"dim 1 of input 0", "(9,)"});
  options.buckets = compile::LengthBuckets{{3}, 1, {4, 8}, {0.0}};
  compile::CompiledFunction g = compile::compile(identity, options);
  testing_util::expect_error([&] { g({zeros({2, 3})}); }, {"input 3 of a call with 1 inputs"});
  // A call within the buckets is padded: the result has the bucket's length.
  EXPECT_EQ(f({ones({2, 3})})[0].shape(), (Shape{2, 4}));
}

}  // namespace
}  // namespace reel
