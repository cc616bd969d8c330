// Data parallel on two ranks against one process with the doubled batch: the same parameters after
// 10 optimizer steps (f64, relative error < 1e-10), one gradient all-reduce per step whatever ACCUM,
// item counts summed across ranks, the start-up broadcast, buffers, the fp16 scaler's agreement, and
// a parameter-shape mismatch as an error on both ranks. The equivalence tests run on each rank's GPU
// with REEL_DIST_TEST_DEVICE=cuda (NCCL then carries the gradients).
#include <algorithm>
#include <optional>

#include "compile/runtime/plan.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "parallel/data_parallel.h"
#include "tests/dist/dist_test_util.h"

namespace reel {
namespace {

using dist_test::rel_err;
using dist_test::values;

constexpr double kTol = 1e-10;

std::shared_ptr<nn::Module> mlp(uint64_t seed, int64_t hidden = 8, bool extra = false) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, hidden, true, &gen), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(hidden, 4, true, &gen)});
  if (extra) m->push_back(std::make_shared<nn::Linear>(4, 4, true, &gen));
  m->to(DType::f64);
  return m;
}

std::shared_ptr<nn::Module> tiny_gpt(uint64_t seed) {
  Generator gen(seed);
  nn::GptConfig c;
  c.vocab = 256;
  c.block_size = 8;
  c.dim = 16;
  c.heads = 2;
  c.layers = 1;
  auto m = nn::gpt(c, &gen);
  m->to(DType::f64);
  return m;
}

// The data of one micro-batch of the whole job: `items` rows; rank r of K takes rows
// [r items/K, (r+1) items/K) (a contiguous block: which rows go where does not change the mean).
struct Sample {
  Tensor x, y;
};
Sample mlp_batch(Generator& g, int64_t items) {
  Tensor x = randn({items, 6}, TensorOptions().with_dtype(DType::f64), &g);
  Tensor u = uniform({items}, 0, 4, TensorOptions().with_dtype(DType::f64), &g);
  std::vector<int64_t> labels;
  for (double v : u.to_vector<double>()) labels.push_back(std::min<int64_t>(3, int64_t(v)));
  return {x, tensor_i64(labels, {items})};
}
Sample gpt_batch(Generator& g, int64_t items) {
  Tensor u = uniform({items, 9}, 0, 256, TensorOptions().with_dtype(DType::f64), &g);
  std::vector<int64_t> tok;
  for (double v : u.to_vector<double>()) tok.push_back(std::min<int64_t>(255, int64_t(v)));
  Tensor all = tensor_i64(tok, {items, 9});
  return {all.slice(1, 0, 8).contiguous(), all.slice(1, 1, 9).contiguous()};
}
Sample rows(const Sample& s, int64_t begin, int64_t end) {
  return {s.x.slice(0, begin, end).contiguous(), s.y.slice(0, begin, end).contiguous()};
}

struct Run {
  std::vector<double> params;
  std::vector<uint64_t> collectives_per_step;
};

// `steps` optimizer steps of AdamW (clipping on) with ACCUM micro-batches of `global_items` rows, all
// of them (comm null: one process) or this rank's block of them (data parallel over comm); with
// `compiled`, each step through compile::compile_train_step in that mode (the all-reduce recorded in
// the plan, and on the GPU replayed inside the CUDA graph).
Run train(const std::function<std::shared_ptr<nn::Module>(uint64_t)>& make,
          const std::function<Sample(Generator&, int64_t)>& batch, int64_t accum, int64_t global_items, int steps,
          dist::Communicator* comm, std::optional<compile::Mode> compiled = std::nullopt) {
  // Ranks start from different initialisations: the broadcast from rank 0 must make them equal.
  const int rank = comm ? comm->rank() : 0, K = comm ? comm->world_size() : 1;
  const Device device = dist_test::test_device();
  auto model = make(17 + uint64_t(rank));
  model->to(device);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-2));
  opt.set_accum_steps(accum).set_micro_batch(global_items / K).set_max_grad_norm(0.7);
  std::shared_ptr<dist::GradientBuckets> sync;
  if (comm) sync = dist::make_data_parallel(*model, opt, dist::world_ptr());
  Generator g(5);
  Run run;
  nn::Module* m = model.get();
  std::optional<compile::CompiledFunction> step;
  if (compiled)
    step.emplace(compile::compile_train_step(
        opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); }, {*compiled}));
  for (int s = 0; s < steps; ++s) {
    const uint64_t before = comm ? comm->collective_count() : 0;
    if (step) {
      std::vector<optim::MicroBatch> micro;
      for (int64_t i = 0; i < accum; ++i) {
        Sample all = batch(g, global_items);
        const int64_t per = global_items / K;
        Sample mine = rows(all, rank * per, (rank + 1) * per);
        micro.push_back({mine.x.to(device), mine.y.to(device)});
      }
      (*step)(compile::flatten_micro(micro));
      if (comm) run.collectives_per_step.push_back(comm->collective_count() - before);
      continue;
    }
    for (int64_t i = 0; i < accum; ++i) {
      Sample all = batch(g, global_items);
      const int64_t per = global_items / K;
      Sample mine = rows(all, rank * per, (rank + 1) * per);
      opt.scale_loss(nn::model_loss(*model, mine.x.to(device), mine.y.to(device))).backward();
      EXPECT_EQ(opt.micro_step().stepped, i == accum - 1);
    }
    if (comm) run.collectives_per_step.push_back(comm->collective_count() - before);
  }
  if (step) {
    const compile::Plan* plan = step->last_plan();
    EXPECT_NE(plan, nullptr) << "the step did not compile";
    size_t reduces = 0;
    if (plan)
      for (const compile::Node& n : plan->graph().nodes) reduces += n.op == OpKind::AllReduce;
    EXPECT_EQ(reduces, comm && comm->world_size() > 1 ? 1u : 0u) << "all_reduce nodes in the plan";
  }
  run.params = values(model->parameters());
  return run;
}

void expect_equivalent(const std::function<std::shared_ptr<nn::Module>(uint64_t)>& make,
                       const std::function<Sample(Generator&, int64_t)>& batch, int64_t items, const char* what) {
  dist::Communicator& w = dist::world();
  for (int64_t accum : {1, 4}) {
    Run single = train(make, batch, accum, items, 10, nullptr);
    Run parallel = train(make, batch, accum, items, 10, &w);
    const double err = rel_err(parallel.params, single.params);
    EXPECT_LT(err, kTol) << what << " ACCUM " << accum << ": 2 ranks vs one process with the doubled batch";
    // (b) one all-reduce of the gradients per optimizer step, whatever ACCUM (the model has no buffers).
    EXPECT_EQ(parallel.collectives_per_step, std::vector<uint64_t>(10, 1u)) << what << " ACCUM " << accum;
    // Both ranks hold the same parameters, to the bit.
    Tensor mine = tensor(parallel.params, {int64_t(parallel.params.size())}, TensorOptions().with_dtype(DType::f64));
    std::vector<double> both = w.all_gather(mine).to_vector<double>();
    EXPECT_TRUE(std::equal(both.begin(), both.begin() + int64_t(both.size() / 2), both.begin() + int64_t(both.size() / 2)))
        << what << " ACCUM " << accum << ": the ranks' parameters differ";
    if (w.rank() == 0)
      std::printf("  %s ACCUM %lld on %s: relative error %.2e after 10 steps, %llu all-reduce per step\n", what,
                  (long long)accum, dist_test::test_device().str().c_str(), err,
                  (unsigned long long)parallel.collectives_per_step[0]);
  }
}

TEST(DistDataParallel, MlpMatchesOneProcessWithTheDoubledBatch) {
  REEL_NEED_TWO_RANKS();
  expect_equivalent([](uint64_t s) { return mlp(s); }, mlp_batch, 8, "mlp");
}

TEST(DistDataParallel, CompiledStepsMatchOneProcessWithTheDoubledBatch) {
  // The gradient all-reduce is an op: the compiled step records it, and every replay (a CUDA graph on
  // the GPU, NCCL's kernel inside) runs it once. Against eager single-process training.
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const compile::Mode mode =
      dist_test::test_device().is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default;
  auto make_gpt = [](uint64_t s) { return tiny_gpt(s); };
  for (int64_t accum : {1, 4}) {
    const auto single = train(make_gpt, gpt_batch, accum, 4, 10, nullptr);
    const auto parallel = train(make_gpt, gpt_batch, accum, 4, 10, &w, mode);
    const double err = rel_err(parallel.params, single.params);
    EXPECT_LT(err, kTol) << "compiled ACCUM " << accum;
    // Calls 0-2 run on the host (warm-up, trace, capture) and count their collective; a replayed CUDA
    // graph runs NCCL's kernel inside it, with no host call to count (train() checks the plan's one
    // all_reduce node, and the parameters above show that every replay reduced).
    std::vector<uint64_t> expected(10, 1u);
    if (mode == compile::Mode::ReduceOverhead) std::fill(expected.begin() + 3, expected.end(), 0u);
    EXPECT_EQ(parallel.collectives_per_step, expected) << "compiled ACCUM " << accum;
    if (w.rank() == 0)
      std::printf("  gpt compiled (%s) ACCUM %lld on %s: relative error %.2e after 10 steps, %llu all-reduce per "
                  "step\n", compile::mode_name(mode), (long long)accum, dist_test::test_device().str().c_str(), err,
                  (unsigned long long)parallel.collectives_per_step[0]);
  }
}

TEST(DistDataParallel, TinyGptMatchesOneProcessWithTheDoubledBatch) {
  REEL_NEED_TWO_RANKS();
  expect_equivalent(tiny_gpt, gpt_batch, 4, "gpt (1 layer, d 16)");
}

// Ranks whose micro-batches differ in size (3 and 5 items) and that count items: each weighs by its
// items, so the result is the gradient of the mean over all 16 items of the step.
TEST(DistDataParallel, ItemCountsAreSummedAcrossRanks) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const int64_t sizes[2] = {3, 5};
  auto run = [&](bool parallel) {
    auto model = mlp(23);
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.2).momentum(0.9));
    if (parallel) {
      opt.set_items_per_step(2 * sizes[w.rank()]);
      dist::make_data_parallel(*model, opt, dist::world_ptr());
    } else {
      opt.set_items_per_step(16);
    }
    Generator g(9);
    for (int s = 0; s < 5; ++s)
      for (int i = 0; i < 2; ++i) {
        Sample all = mlp_batch(g, 8);
        Sample mine = parallel ? rows(all, w.rank() == 0 ? 0 : 3, w.rank() == 0 ? 3 : 8) : all;
        opt.scale_loss(nn::model_loss(*model, mine.x, mine.y), mine.x.size(0)).backward();
        opt.micro_step();
      }
    return values(model->parameters());
  };
  EXPECT_LT(rel_err(run(true), run(false)), kTol);
}

// An epoch's remainder: 3 micro-batches of an ACCUM-4 step, stepped by finish_epoch(Step), with a
// different share per rank (rank 1's micro-batches are twice as large and it says so).
TEST(DistDataParallel, RemainderStepMatchesOneProcess) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  auto run = [&](bool parallel) {
    auto model = mlp(29);
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-2));
    opt.set_accum_steps(4);
    if (parallel) {
      opt.set_micro_batch(w.rank() == 0 ? 2 : 4);
      dist::make_data_parallel(*model, opt, dist::world_ptr());
    }
    Generator g(13);
    // One process: micro-batches of all 6 items; their mean is not the mean over ranks' means
    // (2 and 4 items), so the equal-share DDP average would be wrong here. The item counts carried
    // in the bucket weigh rank 1 twice.
    for (int step = 0; step < 2; ++step) {
      for (int i = 0; i < 3; ++i) {
        Sample all = mlp_batch(g, 6);
        Sample mine = parallel ? rows(all, w.rank() == 0 ? 0 : 2, w.rank() == 0 ? 2 : 6) : all;
        opt.scale_loss(nn::model_loss(*model, mine.x, mine.y)).backward();
        EXPECT_FALSE(opt.micro_step().stepped);
      }
      EXPECT_TRUE(opt.finish_epoch(optim::RemainderPolicy::Step).stepped);
    }
    return values(model->parameters());
  };
  EXPECT_LT(rel_err(run(true), run(false)), kTol);
}

TEST(DistDataParallel, ParametersAndBuffersStartFromRankZero) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  Generator gen(100 + uint64_t(w.rank()));
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, false, &gen), std::make_shared<nn::BatchNorm2d>(3)});
  // Different running statistics per rank, before the broadcast.
  model->forward(randn({2, 2, 4, 4}, {}, &gen));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  auto sync = dist::make_data_parallel(*model, opt, dist::world_ptr());
  auto same_on_both = [&](const std::vector<Tensor>& ts) {
    std::vector<double> v = values(ts);
    std::vector<double> both = w.all_gather(tensor(v, {int64_t(v.size())}, TensorOptions().with_dtype(DType::f64)))
                                   .to_vector<double>();
    return std::equal(both.begin(), both.begin() + int64_t(v.size()), both.begin() + int64_t(v.size()));
  };
  EXPECT_TRUE(same_on_both(model->parameters()));
  EXPECT_TRUE(same_on_both(model->buffers()));
  // A step: each rank's BatchNorm updates its running statistics from its own batch; the boundary
  // broadcasts rank 0's (DDP's broadcast_buffers), one collective beside the gradients' one.
  EXPECT_EQ(sync->collectives_per_step(), 2);
  const uint64_t before = w.collective_count();
  opt.scale_loss(mean(model->forward(randn({2, 2, 4, 4}, {}, &gen)))).backward();
  EXPECT_TRUE(opt.micro_step().stepped);
  EXPECT_EQ(w.collective_count() - before, 2u);
  EXPECT_TRUE(same_on_both(model->parameters()));
  EXPECT_TRUE(same_on_both(model->buffers()));
}

// fp16 loss scaling: an inf in one rank's gradients reaches every rank's sum, so both skip the update
// and halve the scale together.
TEST(DistDataParallel, GradScalerSkipsOnEveryRankTogether) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  auto model = mlp(31);
  model->to(DType::f32);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-2));
  opt.set_grad_scaler(std::make_shared<optim::GradScaler>(optim::GradScalerOptions().init_scale(1024)));
  dist::make_data_parallel(*model, opt, dist::world_ptr());
  const std::vector<double> before = values(model->parameters());
  Generator g(3);
  Sample s = mlp_batch(g, 4);
  Tensor loss = nn::model_loss(*model, s.x.to(DType::f32), s.y);
  if (w.rank() == 1) loss = loss * 1e38;  // x 1024 overflows f32 on this rank only
  opt.scale_loss(loss).backward();
  optim::StepResult r = opt.micro_step();
  ASSERT_TRUE(r.stepped);
  EXPECT_TRUE(r.skipped()) << "rank " << w.rank();
  EXPECT_EQ(r.loss_scale(), 512.0);
  EXPECT_EQ(values(model->parameters()), before);
  // The next, clean step updates on both ranks.
  opt.scale_loss(nn::model_loss(*model, s.x.to(DType::f32), s.y)).backward();
  r = opt.micro_step();
  EXPECT_FALSE(r.skipped()) << "rank " << w.rank();
  EXPECT_NE(values(model->parameters()), before);
}

// (e) Ranks that built different models: a reel::Error on both, naming the first difference.
TEST(DistDataParallel, ShapeMismatchIsAnErrorOnEveryRank) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  auto attempt = [&](std::shared_ptr<nn::Module> model) -> std::string {
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
    try {
      dist::make_data_parallel(*model, opt, dist::world_ptr());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string msg = attempt(mlp(1, w.rank() == 0 ? 8 : 9));
  EXPECT_NE(msg.find("the ranks built different models"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameter 0 is 0.weight (8, 6) f64 on rank 0 but 0.weight (9, 6) f64 on rank 1"),
            std::string::npos)
      << msg;
  msg = attempt(mlp(1, 8, w.rank() == 1));
  EXPECT_NE(msg.find("parameters per rank: rank 0 has 4 (92 elements), rank 1 has 6 (112 elements)"), std::string::npos) << msg;
  // The communicator is still in step: a collective after the errors works.
  Tensor t = full({1}, 1.0);
  w.all_reduce(t);
  EXPECT_EQ(t.item(), 2.0);
}

// (f) State that persists between steps: a bucket slot whose parameter has no gradient on this rank
// (its layer unused in this step's loss, gradients zeroed to none) must count as zero, not as what
// the slot held from an earlier step. Over three steps the last layer is used by both ranks, then by
// rank 0 only, then by rank 1 only: after each sync its gradient is the mean of the ranks' own
// gradients, with zero for the rank that did not use it, on both ranks.
TEST(DistDataParallel, ASlotWithoutAGradientIsZeroOnEveryLaterStep) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  auto model = std::dynamic_pointer_cast<nn::Sequential>(mlp(3, 8, true));
  ASSERT_TRUE(model);
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  std::shared_ptr<dist::GradientBuckets> sync = dist::make_data_parallel(*model, opt, dist::world_ptr());
  const std::vector<Tensor> params = model->parameters();
  const std::vector<Tensor> last = (*model)[3]->parameters();  // weight and bias of the extra layer
  Generator g(40 + uint64_t(w.rank()));
  const bool used_by[3][2] = {{true, true}, {true, false}, {false, true}};
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad(/*set_to_none=*/true);
    Sample s = mlp_batch(g, 4);
    const bool mine = used_by[step][w.rank()];
    Tensor h = (*model)[2]->forward((*model)[1]->forward((*model)[0]->forward(s.x)));
    Tensor loss = cross_entropy(mine ? (*model)[3]->forward(h) : h, s.y);
    loss.backward();
    // This rank's own gradient of the extra layer (zero when unused), and the other rank's.
    std::vector<double> own;
    for (const Tensor& p : last) {
      std::vector<double> v = p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>(size_t(p.numel()), 0.0);
      own.insert(own.end(), v.begin(), v.end());
    }
    ASSERT_EQ(last[0].grad().defined(), mine) << "step " << step;
    std::vector<double> both = w.all_gather(tensor(own, {int64_t(own.size())}, TensorOptions().with_dtype(DType::f64)))
                                   .to_vector<double>();
    sync->sync(params, 1.0);
    std::vector<double> reduced, expected(own.size());
    for (const Tensor& p : last) {
      ASSERT_TRUE(p.grad().defined()) << "step " << step << ": sync leaves every parameter a gradient";
      for (double v : p.grad().to_vector<double>()) reduced.push_back(v);
    }
    for (size_t i = 0; i < own.size(); ++i) expected[i] = (both[i] + both[own.size() + i]) / 2;
    EXPECT_EQ(reduced, expected) << "step " << step << " on rank " << w.rank()
                                 << ": the extra layer's synced gradient is not the mean of the ranks' own";
  }
}

}  // namespace
}  // namespace reel
