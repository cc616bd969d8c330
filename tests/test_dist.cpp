// Data parallel in one process: the single-process communicator, the optimizer's gradient-sync hook
// with GradientBuckets over it (one collective per step whatever ACCUM), the distributed sampler's
// shards, SyncBatchNorm2d at world size 1, and the errors a missing MPI plugin gives. The collectives
// across processes are tested under mpirun by build/reel_dist_tests (tests/dist/).
#include <algorithm>
#include <numeric>
#include <set>

#include "data/distributed.h"
#include "data/loader.h"
#include "distributed/mpi_communicator.h"
#include "distributed/nccl.h"
#include "kernels/dispatch.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "parallel/data_parallel.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::expect_error;

TEST(DistSingle, CollectivesAreIdentitiesAndCounted) {
  dist::SingleProcessCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  Tensor t = tensor({1, -2, 3, 4.5}, {2, 2}, TensorOptions().with_dtype(DType::f64));
  const std::vector<double> before = t.to_vector<double>();
  for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::mean, dist::ReduceOp::max, dist::ReduceOp::min}) {
    comm.all_reduce(t, op);
    EXPECT_EQ(t.to_vector<double>(), before) << dist::reduce_op_name(op);
  }
  comm.broadcast(t, 0);
  EXPECT_EQ(t.to_vector<double>(), before);
  Tensor g = comm.all_gather(t);
  EXPECT_EQ(g.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(g.to_vector<double>(), before);
  comm.barrier();
  EXPECT_EQ(comm.collective_count(), 7u);
}

TEST(DistSingle, ViewsHalfTypesAndIntegers) {
  dist::SingleProcessCommunicator comm;
  Tensor base = arange(12, TensorOptions().with_dtype(DType::f32)).reshape({3, 4});
  Tensor view = base.transpose(0, 1);  // not contiguous: reduced through a copy and written back
  comm.all_reduce(view, dist::ReduceOp::mean);
  EXPECT_EQ(base.to_vector<float>(), arange(12).to_vector<float>());
  Tensor h = tensor({0.5, 1.5}, {2}).to(DType::f16);
  comm.all_reduce(h, dist::ReduceOp::sum);
  EXPECT_EQ(h.to(DType::f32).to_vector<float>(), (std::vector<float>{0.5f, 1.5f}));
  Tensor i = tensor_i64({3, 4}, {2});
  comm.all_reduce(i, dist::ReduceOp::max);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  expect_error([&] { comm.all_reduce(i, dist::ReduceOp::mean); }, {"all_reduce", "mean of an i64 tensor", "(2,)"});
  expect_error([&] { comm.broadcast(i, 1); }, {"broadcast", "root 1", "world of size 1"});
  expect_error([&] { comm.all_reduce(Tensor()); }, {"all_reduce", "undefined"});
  expect_error([&] { comm.set_timeout_seconds(0); }, {"timeout", "positive"});
}

TEST(DistSingle, MetaModeRunsNoCollective) {
  dist::SingleProcessCommunicator comm;
  Tensor t = zeros({4});
  {
    MetaModeGuard meta;
    comm.all_reduce(t);
    comm.barrier();
  }
  EXPECT_EQ(comm.collective_count(), 0u);
}

TEST(DistSingle, DefaultCommunicatorWithoutMpirunIsSingle) {
  if (dist::launched_by_mpirun()) GTEST_SKIP() << "running under mpirun";
  EXPECT_EQ(dist::world().world_size(), 1);
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::local_rank(), 0);
  EXPECT_EQ(dist::world().describe(), "single process");
  // A second init asking for the same backend returns it; asking for MPI now is refused.
  EXPECT_EQ(&dist::init(dist::Backend::single), &dist::world());
  expect_error([] { dist::init(dist::Backend::mpi); }, {"dist::init(mpi)", "already exists", "single"});
  // The train hooks leave a single process alone.
  EXPECT_EQ(dist::setup_training(Device::cpu(), "reduce-overhead"), Device::cpu());
}

TEST(DistSingle, MissingPluginIsAClearError) {
  expect_error([] { dist::open_mpi_plugin("/nonexistent/libreel_mpi.so"); },
               {"cannot load the MPI plugin", "/nonexistent/libreel_mpi.so"});
  // A shared object that is not the plugin (no entry point).
  expect_error([] { dist::open_mpi_plugin("libz.so.1"); }, {"libz.so.1", "is not reel's MPI plugin", "reel_mpi_plugin_v1"});
}

// NCCL is dlopen()ed: where libnccl.so.2 is found its symbols bind and its version reads (no GPU
// needed); elsewhere the reason names what was tried.
TEST(DistSingle, NcclLibraryLoadsOrSaysWhy) {
  std::string why;
  std::string lib = dist::nccl_library(&why);
  if (lib.empty()) {
    EXPECT_NE(why.find("libnccl.so.2"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  EXPECT_EQ(lib.rfind("NCCL 2.", 0), 0u) << lib;
}

// ---- the optimizer's hook over one process ----

// Runs `steps` steps of ACCUM micro-batches of 4 items; returns the parameters' values.
std::vector<double> train_mlp(int64_t accum, int steps, std::shared_ptr<dist::Communicator> comm,
                              size_t bucket_bytes = size_t(25) << 20, uint64_t* collectives_per_step = nullptr) {
  auto model = testing_util::f64_mlp(3);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-2));
  opt.set_accum_steps(accum).set_max_grad_norm(0.5);
  std::shared_ptr<dist::GradientBuckets> sync;
  if (comm) sync = dist::make_data_parallel(*model, opt, comm, dist::DataParallelOptions().with_bucket_bytes(bucket_bytes));
  Generator data(11);
  for (int s = 0; s < steps; ++s) {
    const uint64_t before = comm ? comm->collective_count() : 0;
    for (int64_t i = 0; i < accum; ++i) {
      Tensor x = randn({4, 6}, TensorOptions().with_dtype(DType::f64), &data);
      Tensor y = tensor_i64({0, 1, 2, 1}, {4});
      opt.scale_loss(cross_entropy(model->forward(x), y)).backward();
      optim::StepResult r = opt.micro_step();
      EXPECT_EQ(r.stepped, i == accum - 1);
    }
    if (comm && collectives_per_step) *collectives_per_step = comm->collective_count() - before;
  }
  std::vector<double> out;
  for (const Tensor& p : model->parameters())
    for (double v : p.to_vector<double>()) out.push_back(v);
  return out;
}

TEST(DistSingle, OneCollectivePerStepWhateverAccumAndNoChange) {
  for (int64_t accum : {1, 4}) {
    auto comm = std::make_shared<dist::SingleProcessCommunicator>();
    uint64_t per_step = 0;
    std::vector<double> synced = train_mlp(accum, 3, comm, size_t(25) << 20, &per_step);
    EXPECT_EQ(per_step, 1u) << "ACCUM " << accum;
    // World size 1: sum_r w_r g_r / sum_r w_r = g, to the bit.
    EXPECT_EQ(synced, train_mlp(accum, 3, nullptr)) << "ACCUM " << accum;
  }
}

TEST(DistSingle, SmallBucketsSplitTheGradients) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  uint64_t per_step = 0;
  // Parameters of 48, 8, 24 and 3 f64 elements with 256-byte buckets: [48] [8, 24] [3].
  std::vector<double> synced = train_mlp(2, 2, comm, 256, &per_step);
  EXPECT_EQ(per_step, 3u);
  EXPECT_EQ(synced, train_mlp(2, 2, nullptr));
  auto model = testing_util::f64_mlp(1);
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  auto sync = dist::make_data_parallel(*model, opt, comm, dist::DataParallelOptions().with_bucket_bytes(256));
  EXPECT_EQ(sync->num_buckets(), 3);
  EXPECT_EQ(sync->collectives_per_step(), 3);
  std::ostringstream os;
  opt.print_setup(os);
  EXPECT_NE(os.str().find("gradients all-reduced once per optimizer step, 3 buckets"), std::string::npos) << os.str();
}

TEST(DistSingle, LibtorchStyleStepSyncsToo) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  auto model = testing_util::f64_mlp(2);
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  dist::make_data_parallel(*model, opt, comm);
  sum(model->forward(randn({2, 6}, TensorOptions().with_dtype(DType::f64)))).backward();
  const uint64_t before = comm->collective_count();
  opt.step();
  EXPECT_EQ(comm->collective_count() - before, 1u);
}

TEST(DistSingle, UnusedParameterGetsAZeroGradient) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  Tensor used = ones({2}, TensorOptions().with_dtype(DType::f64).with_requires_grad());
  Tensor unused = ones({3}, TensorOptions().with_dtype(DType::f64).with_requires_grad());
  dist::GradientBuckets sync(comm, {used, unused}, 1024);
  optim::SGD opt({used, unused}, optim::SGDOptions(0.5));
  opt.set_grad_sync(std::shared_ptr<dist::GradientBuckets>(&sync, [](dist::GradientBuckets*) {}));
  sum(used * 3.0).backward();
  optim::StepResult r = opt.micro_step();
  ASSERT_TRUE(r.stepped);
  EXPECT_EQ(used.to_vector<double>(), (std::vector<double>{-0.5, -0.5}));
  EXPECT_EQ(unused.to_vector<double>(), (std::vector<double>{1, 1, 1}));  // its gradient was zero
}

TEST(DistSingle, GradientBucketsRefuseOtherParameters) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  Tensor a = ones({2}, TensorOptions().with_requires_grad()), b = ones({2}, TensorOptions().with_requires_grad());
  dist::GradientBuckets sync(comm, {a}, 1024);
  expect_error([&] { sync.sync({b}, 1.0); }, {"data parallel", "parameter 0", "(2,)", "not the one"});
  auto model = testing_util::f64_mlp(1);
  optim::SGD other({a}, optim::SGDOptions(0.1));
  expect_error([&] { dist::make_data_parallel(*model, other, comm); },
               {"make_data_parallel", "holds 1 parameters", "model has 4"});
}

TEST(DistSingle, SyncBatchNormAtWorldSizeOneIsBatchNorm) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  nn::BatchNorm2d plain(3);
  nn::SyncBatchNorm2d synced(3, comm);
  EXPECT_EQ(synced.type_name(), "SyncBatchNorm2d");
  plain.to(DType::f64);
  synced.to(DType::f64);
  Tensor x = randn({4, 3, 2, 2}, TensorOptions().with_dtype(DType::f64));
  EXPECT_EQ(plain.forward(x).to_vector<double>(), synced.forward(x).to_vector<double>());
  EXPECT_EQ(plain.running_var().to_vector<double>(), synced.running_var().to_vector<double>());
  EXPECT_EQ(comm->collective_count(), 0u);
}

TEST(DistSingle, ConvertSyncBatchNormReachesEveryBatchNorm) {
  auto comm = std::make_shared<dist::SingleProcessCommunicator>();
  auto model = nn::cnn_small();
  EXPECT_EQ(nn::convert_sync_batchnorm(*model, comm), 3);
  int64_t synced = 0;
  for (const auto& [name, m] : model->named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m.get())) synced += bn->communicator() == comm;
  EXPECT_EQ(synced, 3);
}

// ---- the distributed sampler ----

TEST(DistSampler, ShardsFollowPyTorchsStridedSplit) {
  std::vector<int64_t> order(10);
  std::iota(order.begin(), order.end(), 0);
  // Padded to 12 with the order's first two entries, as torch's DistributedSampler(shuffle=False).
  EXPECT_EQ(data::shard_indices(order, 3, 0, false), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(data::shard_indices(order, 3, 1, false), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(data::shard_indices(order, 3, 2, false), (std::vector<int64_t>{2, 5, 8, 1}));
  // Cut to 9.
  EXPECT_EQ(data::shard_indices(order, 3, 0, true), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(data::shard_indices(order, 3, 2, true), (std::vector<int64_t>{2, 5, 8}));
  // Padding longer than the order repeats it.
  EXPECT_EQ(data::shard_indices({7, 8}, 5, 4, false), (std::vector<int64_t>{7}));  // [7, 8, 7, 8, 7]
  expect_error([&] { data::shard_indices(order, 3, 3, false); }, {"shard_indices", "rank 3", "[0, 3)"});
  expect_error([&] { data::shard_indices(order, 11, 0, true); }, {"shard_indices", "10 items over 11 ranks"});
}

TEST(DistSampler, ShuffledShardsAreDisjointAndCover) {
  for (bool drop : {false, true}) {
    for (int64_t epoch : {0, 1}) {
      std::multiset<int64_t> seen;
      for (int64_t r = 0; r < 4; ++r) {
        data::DistributedSampler s(102, 4, r, true, 5, drop);
        s.set_epoch(epoch);
        EXPECT_EQ(s.size(), drop ? 25 : 26);
        seen.insert(s.indices().begin(), s.indices().end());
      }
      std::set<int64_t> distinct(seen.begin(), seen.end());
      if (drop) {
        EXPECT_EQ(distinct.size(), seen.size());  // disjoint; 2 items skipped this epoch
        EXPECT_EQ(distinct.size(), 100u);
      } else {
        EXPECT_EQ(distinct.size(), 102u);  // covered; 2 items seen twice (the padding)
        EXPECT_EQ(seen.size(), 104u);
      }
    }
  }
  data::DistributedSampler a(50, 2, 0, true, 1), b(50, 2, 0, true, 1);
  b.set_epoch(1);
  EXPECT_NE(a.indices(), b.indices());  // epochs reshuffle
}

TEST(DistSampler, DataLoaderYieldsItsShard) {
  Tensor x = arange(11, TensorOptions().with_dtype(DType::f32)).reshape({11, 1});
  Tensor y = arange(11, TensorOptions().with_dtype(DType::i64));
  std::set<int64_t> all;
  for (int64_t r = 0; r < 2; ++r) {
    data::DataLoader loader(x, y, data::DataLoaderOptions().with_batch_size(4).with_seed(3).with_shard(r, 2));
    EXPECT_EQ(loader.dataset_size(), 11);
    EXPECT_EQ(loader.shard_size(), 6);
    EXPECT_EQ(loader.num_batches(), 2);
    EXPECT_EQ(loader.remainder(), 2);
    std::vector<int64_t> rows;
    for (const data::Batch& b : loader) {
      for (int64_t v : b.targets.to_vector<int64_t>()) rows.push_back(v);
      EXPECT_EQ(b.indices, b.targets.to_vector<int64_t>());
    }
    EXPECT_EQ(rows, data::shard_indices(data::epoch_order(11, 3, 0), 2, r, false));
    all.insert(rows.begin(), rows.end());
  }
  EXPECT_EQ(all.size(), 11u);
  expect_error([&] { data::DataLoader(x, y, data::DataLoaderOptions().with_shard(2, 2)); },
               {"DataLoader", "shard rank 2 of 2"});
}

}  // namespace
}  // namespace reel
