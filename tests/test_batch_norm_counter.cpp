// BatchNorm's num_batches_tracked (nn/norm_layers.h), as torch's _BatchNorm keeps it:
//   - a 0-dim i64 buffer from 0, += 1 at each forward in training, never in eval; it counts only
//     (momentum is always a number in reel: the running statistics move by momentum, not 1/count);
//     SyncBatchNorm2d counts too; to(dtype) leaves it i64 (torch casts floating buffers only);
//   - state_dict files hold it under torch's key (`bn.num_batches_tracked`, i64, shape ()): a round
//     trip keeps the count; a file without it (written before reel kept one) is refused strictly,
//     naming the key; one with a float count is refused naming the dtype;
//   - data parallel: the counts agree on every rank by themselves, so the per-step broadcast of
//     buffers leaves them out (one collective for the gradients, one for the running statistics).
// The compiled step's counts are in test_compile_sink_updates.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "nn/nn.h"
#include "nn/state_dict.h"
#include "nn/sync_batch_norm.h"
#include "optim/optim.h"
#include "parallel/data_parallel.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

namespace {

int64_t count_of(const nn::BatchNorm2d& bn) { return bn.num_batches_tracked().to_vector<int64_t>().at(0); }

std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "reel_bn_counter_" + name; }

// BatchNorm's state as files written before reel kept the count: the other four entries only.
struct OldBatchNorm : nn::Module {
  explicit OldBatchNorm(int64_t c) : nn::Module("OldBatchNorm") {
    register_parameter("weight", ones({c}));
    register_parameter("bias", zeros({c}));
    register_buffer("running_mean", zeros({c}));
    register_buffer("running_var", ones({c}));
  }
};

}  // namespace

TEST(NnBatchNormCounter, CountsTrainingForwardsOnly) {
  nn::BatchNorm2d bn(3);
  const Tensor& n = bn.num_batches_tracked();
  EXPECT_EQ(n.dtype(), DType::i64);
  EXPECT_EQ(n.shape(), Shape{});
  EXPECT_FALSE(n.requires_grad());
  EXPECT_EQ(count_of(bn), 0);
  Tensor x = randn({2, 3, 4, 4});
  for (int i = 0; i < 3; ++i) bn.forward(x);
  EXPECT_EQ(count_of(bn), 3);
  bn.eval();
  bn.forward(x);
  EXPECT_EQ(count_of(bn), 3) << "eval mode does not count";
  bn.train();
  sum(bn.forward(x)).backward();  // with autograd on: the count is no part of the graph
  EXPECT_EQ(count_of(bn), 4);
  EXPECT_TRUE(n.is_same(bn.named_buffers()[2].second)) << "registered after running_mean and running_var";
  EXPECT_EQ(bn.named_buffers()[2].first, "num_batches_tracked");
}

TEST(NnBatchNormCounter, MomentumStaysTheFactorWhateverTheCount) {
  // Channel mean 2 twice, momentum 0.5: 0.5 * 2 = 1, then 0.5 * 1 + 0.5 * 2 = 1.5 (a cumulative
  // average, torch's momentum=None, would give 2).
  nn::BatchNorm2d bn(1, 1e-5, 0.5);
  Tensor x = tensor({1.0, 3.0, 1.0, 3.0}, {2, 1, 1, 2});
  bn.forward(x);
  bn.forward(x);
  EXPECT_EQ(count_of(bn), 2);
  EXPECT_DOUBLE_EQ(bn.running_mean().item(), 1.5);
}

TEST(NnBatchNormCounter, SyncBatchNormCountsAndCastsLeaveItI64) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  nn::SyncBatchNorm2d synced(3, comm);
  synced.forward(randn({2, 3, 2, 2}));
  EXPECT_EQ(count_of(synced), 1);
  synced.to(DType::f64);
  EXPECT_EQ(synced.num_batches_tracked().dtype(), DType::i64);
  EXPECT_EQ(synced.running_mean().dtype(), DType::f64);
  synced.forward(randn({2, 3, 2, 2}, {DType::f64}));
  EXPECT_EQ(count_of(synced), 2);
}

TEST(NnBatchNormCounter, StateDictKeepsTheCountAsTorchsKey) {
  Generator gen(5);
  nn::Sequential a{std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, false, &gen), std::make_shared<nn::BatchNorm2d>(3)};
  for (int i = 0; i < 5; ++i) a.forward(randn({2, 2, 4, 4}, {}, &gen));
  const std::string path = tmp_path("roundtrip.sd");
  nn::save_state_dict(a, path);
  nn::Sequential b{std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, false, &gen), std::make_shared<nn::BatchNorm2d>(3)};
  nn::load_state_dict(b, path);
  auto sb = b.named_state();
  ASSERT_EQ(sb.back().first, "1.num_batches_tracked");
  EXPECT_EQ(sb.back().second.dtype(), DType::i64);
  EXPECT_EQ(sb.back().second.shape(), Shape{});
  EXPECT_EQ(sb.back().second.to_vector<int64_t>(), std::vector<int64_t>{5});
  EXPECT_EQ(a.named_state().size(), b.named_state().size());

  // A file without the count (written before reel kept one): strict loading names the key and
  // changes nothing.
  OldBatchNorm old(3);
  nn::save_state_dict(old, path);
  nn::BatchNorm2d fresh(3);
  add_(fresh.num_batches_tracked(), 7.0);
  expect_error([&] { nn::load_state_dict(fresh, path); }, {"lacks keys the module has: num_batches_tracked"});
  EXPECT_EQ(count_of(fresh), 7);
  // The other way: a file with the count is refused by a module without one.
  nn::save_state_dict(fresh, path);
  expect_error([&] { nn::load_state_dict(old, path); }, {"has keys the module lacks: num_batches_tracked"});
  // A float count (a converter's mistake) is refused, naming the dtype.
  struct FloatCount : nn::Module {
    FloatCount() : nn::Module("FloatCount") {
      register_parameter("weight", ones({3}));
      register_parameter("bias", zeros({3}));
      register_buffer("running_mean", zeros({3}));
      register_buffer("running_var", ones({3}));
      register_buffer("num_batches_tracked", zeros({}));
    }
  } float_count;
  nn::save_state_dict(float_count, path);
  expect_error([&] { nn::load_state_dict(fresh, path); }, {"'num_batches_tracked' has dtype f32", "expects i64"});
  std::remove(path.c_str());
}

TEST(NnBatchNormCounter, DataParallelLeavesTheCountsOutOfTheBufferBroadcast) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  Generator gen(6);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, false, &gen), std::make_shared<nn::BatchNorm2d>(3)});
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  auto sync = dist::make_data_parallel(*model, opt, comm);
  EXPECT_EQ(sync->collectives_per_step(), 2) << "the gradients and the running statistics (f32), no i64 pack";
  opt.scale_loss(mean(model->forward(randn({2, 2, 4, 4}, {}, &gen)))).backward();
  EXPECT_TRUE(opt.micro_step().stepped);
  auto* bn = dynamic_cast<nn::BatchNorm2d*>(model->named_modules()[1].second.get());
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(count_of(*bn), 1);
}
