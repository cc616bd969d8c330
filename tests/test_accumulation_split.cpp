// Tests of optim/accumulation.h: the split of an optimizer step's N items into ACCUM micro-batches of
// m (the last one N - m (ACCUM - 1)), against values worked out by hand; its errors; its arithmetic
// at the edge of int64; and Optimizer::set_effective_batch, which counts by micro-batches when m
// divides N and by items otherwise.
#include <cstdint>
#include <limits>

#include "optim/optim.h"
#include "tests/test_util.h"

namespace reel {
namespace {

using namespace reel::optim;
using testing_util::expect_error;

TEST(AccumulationSplit, UnevenSplitEndsWithTheRemainder) {
  const AccumulationSplit s = split_accumulation(10, 4);  // 4 + 4 + 2
  EXPECT_EQ(s.micro_batch, 4);
  EXPECT_EQ(s.accum, 3);
  EXPECT_EQ(s.last_micro_batch, 2);
  EXPECT_TRUE(s.uneven());
  EXPECT_EQ(s.effective_batch(), 10);
  EXPECT_EQ(s.micro_batch_size(0), 4);
  EXPECT_EQ(s.micro_batch_size(1), 4);
  EXPECT_EQ(s.micro_batch_size(2), 2);
}

TEST(AccumulationSplit, EvenSplitHasEqualMicroBatches) {
  const AccumulationSplit s = split_accumulation(8, 4);  // 4 + 4
  EXPECT_EQ(s.accum, 2);
  EXPECT_EQ(s.last_micro_batch, 4);
  EXPECT_FALSE(s.uneven());
  EXPECT_EQ(s.effective_batch(), 8);
  EXPECT_EQ(s.micro_batch_size(1), 4);
}

TEST(AccumulationSplit, EndsOfTheRange) {
  const AccumulationSplit whole = split_accumulation(7, 7);  // one micro-batch: no accumulation
  EXPECT_EQ(whole.accum, 1);
  EXPECT_EQ(whole.last_micro_batch, 7);
  EXPECT_FALSE(whole.uneven());
  const AccumulationSplit ones = split_accumulation(7, 1);  // seven micro-batches of one item
  EXPECT_EQ(ones.accum, 7);
  EXPECT_EQ(ones.last_micro_batch, 1);
  EXPECT_FALSE(ones.uneven());
  const AccumulationSplit one_short = split_accumulation(7, 6);  // 6 + 1
  EXPECT_EQ(one_short.accum, 2);
  EXPECT_EQ(one_short.last_micro_batch, 1);
}

// ceil(N / m) as (N + m - 1) / m would overflow here.
TEST(AccumulationSplit, NoOverflowNearInt64Max) {
  const int64_t n = std::numeric_limits<int64_t>::max();  // 2^63 - 1
  const AccumulationSplit halves = split_accumulation(n, n - 1);
  EXPECT_EQ(halves.accum, 2);
  EXPECT_EQ(halves.last_micro_batch, 1);
  const AccumulationSplit pairs = split_accumulation(n, 2);  // 2^62 - 1 pairs, then one item
  EXPECT_EQ(pairs.accum, int64_t(1) << 62);
  EXPECT_EQ(pairs.last_micro_batch, 1);
  EXPECT_EQ(pairs.effective_batch(), n);
  const AccumulationSplit whole = split_accumulation(n, n);
  EXPECT_EQ(whole.accum, 1);
  EXPECT_EQ(whole.last_micro_batch, n);
}

TEST(AccumulationSplit, ErrorsNameTheBadValue) {
  expect_error([] { split_accumulation(0, 4); }, {"split_accumulation", "effective batch must be positive", "0"});
  expect_error([] { split_accumulation(-8, 4); }, {"split_accumulation", "effective batch", "-8"});
  expect_error([] { split_accumulation(8, 0); }, {"split_accumulation", "micro-batch must be positive", "0"});
  expect_error([] { split_accumulation(8, -2); }, {"split_accumulation", "micro-batch", "-2"});
  expect_error([] { split_accumulation(8, 9); },
               {"split_accumulation", "micro-batch 9", "larger than the effective batch 8"});
}

TEST(AccumulationSplit, OptimizerCountsMicroBatchesOrItems) {
  Tensor p = zeros({3}, TensorOptions().with_dtype(DType::f64)).set_requires_grad();
  SGD even({p});
  even.set_effective_batch(8, 4);
  EXPECT_EQ(even.accum_steps(), 2);
  EXPECT_EQ(even.items_per_step(), 0);
  EXPECT_EQ(even.effective_batch(), 8);
  SGD uneven({p});
  uneven.set_effective_batch(10, 4);
  EXPECT_EQ(uneven.accum_steps(), 1);  // counting items replaces the count
  EXPECT_EQ(uneven.items_per_step(), 10);
  EXPECT_EQ(uneven.effective_batch(), 10);
  expect_error([&] { uneven.set_effective_batch(4, 8); }, {"split_accumulation", "micro-batch 8"});
}

}  // namespace
}  // namespace reel
