// SyncBatchNorm on two ranks against one BatchNorm2d over the concatenated batch (f64): outputs,
// input gradients, parameter gradients (summed over ranks, as the loss is) and running statistics;
// and a converted model trained data-parallel against one process.
#include "nn/nn.h"
#include "optim/optim.h"
#include "parallel/data_parallel.h"
#include "tests/dist/dist_test_util.h"

#include <optional>

#include "compile/runtime/plan.h"
#include "compile/runtime/train_step.h"

namespace reel {
namespace {

using dist_test::rel_err;
using dist_test::values;

constexpr double kTol = 1e-10;

// Rank r's rows [begin, end) of dim 0.
Tensor block(const Tensor& t, int64_t begin, int64_t end) { return t.slice(0, begin, end).contiguous(); }

TEST(DistSyncBatchNorm, MatchesBatchNormOnTheCombinedBatch) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const int r = w.rank();
  // The ranks' batches differ in size (3 and 5 samples): the statistics weigh each by its count.
  const int64_t begin = r == 0 ? 0 : 3, end = r == 0 ? 3 : 8;
  Generator g(42);
  TensorOptions f64 = TensorOptions().with_dtype(DType::f64);
  Tensor x_all = randn({8, 4, 3, 2}, f64, &g) * 2.0 + 0.5;
  Tensor dy_all = randn({8, 4, 3, 2}, f64, &g);  // the loss is sum(y * dy_all): dL/dy = dy_all
  Tensor w_init = randn({4}, f64, &g), b_init = randn({4}, f64, &g);

  auto make = [&](bool sync) {
    auto bn = std::make_shared<nn::BatchNorm2d>(4, 1e-5, 0.3);
    bn->to(DType::f64);
    NoGradGuard no_grad;
    copy_(bn->weight(), w_init);
    copy_(bn->bias(), b_init);
    if (sync) bn->set_communicator(dist::world_ptr());
    return bn;
  };
  // One process, the whole batch.
  auto ref = make(false);
  Tensor xr = x_all.detach().set_requires_grad();
  Tensor yr = ref->forward(xr);
  sum(yr * dy_all).backward();
  // Two ranks, a block each.
  auto bn = make(true);
  Tensor x = block(x_all, begin, end).set_requires_grad();
  const uint64_t before = w.collective_count();
  Tensor y = bn->forward(x);
  sum(y * block(dy_all, begin, end)).backward();
  EXPECT_EQ(w.collective_count() - before, 2u);  // the statistics' all_gather, the backward's all_reduce

  EXPECT_LT(rel_err(y.to_vector<double>(), block(yr, begin, end).to_vector<double>()), kTol) << "y";
  EXPECT_LT(rel_err(x.grad().to_vector<double>(), block(xr.grad(), begin, end).to_vector<double>()), kTol) << "dx";
  // Each rank holds its part of dw and db (DDP's all-reduce of the gradients adds them up).
  Tensor dw = clone(bn->weight().grad()), db = clone(bn->bias().grad());
  w.all_reduce(dw);
  w.all_reduce(db);
  EXPECT_LT(rel_err(dw.to_vector<double>(), ref->weight().grad().to_vector<double>()), kTol) << "dweight";
  EXPECT_LT(rel_err(db.to_vector<double>(), ref->bias().grad().to_vector<double>()), kTol) << "dbias";
  EXPECT_LT(rel_err(bn->running_mean().to_vector<double>(), ref->running_mean().to_vector<double>()), kTol);
  EXPECT_LT(rel_err(bn->running_var().to_vector<double>(), ref->running_var().to_vector<double>()), kTol);
  // Eval mode uses the running statistics, the same on every rank: no collective.
  bn->eval();
  ref->eval();
  const uint64_t eval_before = w.collective_count();
  Tensor ye = bn->forward(block(x_all, begin, end));
  EXPECT_EQ(w.collective_count(), eval_before);
  EXPECT_LT(rel_err(ye.to_vector<double>(), block(ref->forward(x_all), begin, end).to_vector<double>()), kTol);
}

// A small CNN with BatchNorm, converted and trained on two ranks (halves of each batch), against the
// same CNN on one process with whole batches: parameters and running statistics after 5 steps.
TEST(DistSyncBatchNorm, ConvertedModelTrainsAsOneProcess) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  auto make = [] {
    Generator gen(8);
    auto m = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Conv2d>(2, 4, 3, 1, 1, false, &gen), std::make_shared<nn::BatchNorm2d>(4),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::GlobalAvgPool2d>(),
        std::make_shared<nn::Linear>(4, 3, true, &gen)});
    m->to(DType::f64);
    return m;
  };
  const Device device = dist_test::test_device();  // each rank's GPU with REEL_DIST_TEST_DEVICE=cuda
  auto run = [&](bool parallel, bool sync_bn = true, std::optional<compile::Mode> compiled = std::nullopt) {
    auto model = make();
    model->to(device);
    if (parallel && sync_bn) {
      EXPECT_EQ(nn::convert_sync_batchnorm(*model), 1);
    }
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-2));
    opt.set_accum_steps(2);
    if (parallel) {
      auto sync = dist::make_data_parallel(*model, opt, dist::world_ptr());
      // The gradients; SyncBatchNorm's statistics agree already, plain BatchNorm's buffers are broadcast.
      EXPECT_EQ(sync->collectives_per_step(), sync_bn ? 1 : 2);
    }
    nn::Module* m = model.get();
    std::optional<compile::CompiledFunction> step;
    if (compiled)
      step.emplace(compile::compile_train_step(
          opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); }, {*compiled}));
    Generator g(4);
    for (int s = 0; s < 5; ++s) {
      std::vector<optim::MicroBatch> micro;
      for (int i = 0; i < 2; ++i) {
        Tensor x = randn({6, 2, 5, 5}, TensorOptions().with_dtype(DType::f64), &g);
        Tensor y = tensor_i64({0, 1, 2, 2, 1, 0}, {6});
        if (parallel) {
          x = block(x, 3 * w.rank(), 3 * w.rank() + 3);
          y = block(y, 3 * w.rank(), 3 * w.rank() + 3);
        }
        if (step) {
          micro.push_back({x.to(device), y.to(device)});
          continue;
        }
        opt.scale_loss(nn::model_loss(*model, x.to(device), y.to(device))).backward();
        opt.micro_step();
      }
      if (step) (*step)(compile::flatten_micro(micro));
    }
    if (step) {
      EXPECT_NE(step->last_plan(), nullptr) << "the step did not compile";
    }
    std::vector<double> out = values(model->parameters());
    std::vector<double> buf = values(model->buffers());
    out.insert(out.end(), buf.begin(), buf.end());
    return out;
  };
  const std::vector<double> single = run(false);
  const double err = rel_err(run(true), single);
  EXPECT_LT(err, kTol);
  // Compiled: SyncBatchNorm's gather and all-reduce and the gradients' all-reduce are ops of the plan.
  const compile::Mode mode = device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default;
  const double err_compiled = rel_err(run(true, true, mode), single);
  EXPECT_LT(err_compiled, kTol) << "compiled";
  // Plain BatchNorm, compiled: rank 0's buffers broadcast by an op at each step, as eagerly.
  const double err_buffers = rel_err(run(true, false, mode), run(true, false));
  EXPECT_LT(err_buffers, kTol) << "compiled, buffers broadcast";
  if (w.rank() == 0)
    std::printf("  converted CNN on %s: relative error %.2e after 5 steps (parameters, running statistics); "
                "compiled (%s) %.2e; plain BatchNorm compiled vs eager on 2 ranks %.2e\n",
                device.str().c_str(), err, compile::mode_name(mode), err_compiled, err_buffers);
}

}  // namespace
}  // namespace reel
