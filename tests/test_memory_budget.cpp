// The memory-budget planner (compile/runtime/memory_budget.h) and the meta mode it rests on, on the CPU.
//   - meta mode runs no kernel and allocates nothing (a counting allocator), yet the tracer records
//     the same graph as a real trace of the same step: the same ops, buffer kinds and sizes, and so
//     the same memory plan (the planned arena of the real step and the meta one are equal);
//   - reads of values refuse meta tensors with a clear error; the model and its optimizer are left
//     without meta tensors (no .grad, no state) after planning;
//   - planned peaks grow with the micro-batch; pick_micro_batch on hand-made lists (exact fit,
//     nothing fits, the remainder rule: N = 100 with 32 -> ACCUM 4, a last micro-batch of 4);
//   - the SIZE parser and the out-of-memory advice text;
//   - the prediction against reality: the planned peak of an eager and of a compiled step (a small
//     CNN and a small GPT) against the CPU allocator's measured peak of the same step run for real;
//     the tracer's record of when the program dropped each block; the allocator's statistics.
#include <gtest/gtest.h>

#include <optional>

#include "compile/runtime/memory_budget.h"
#include "compile/passes/memory_plan.h"
#include "compile/ir/trace.h"
#include "compile/runtime/train_step.h"
#include "kernels/dispatch.h"
#include "kernels/library_workspaces.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

namespace {

// Wraps the CPU allocator and counts what passes through it.
class CountingAllocator : public Allocator {
 public:
  explicit CountingAllocator(Allocator* inner) : inner_(inner) {}
  void* allocate(size_t nbytes, Device device) override {
    ++allocations;
    return inner_->allocate(nbytes, device);
  }
  void deallocate(void* ptr, size_t nbytes, Device device) override { inner_->deallocate(ptr, nbytes, device); }
  int64_t allocations = 0;

 private:
  Allocator* inner_;
};

class CountAllocations {
 public:
  CountAllocations() : counting_(&allocator_for(Device::cpu())) { previous_ = set_allocator(DeviceType::CPU, &counting_); }
  ~CountAllocations() { set_allocator(DeviceType::CPU, previous_); }
  int64_t count() const { return counting_.allocations; }

 private:
  CountingAllocator counting_;
  Allocator* previous_ = nullptr;
};

// A small Fashion-MNIST CNN (BatchNorm included) with AdamW, clipping: the CLI's setup in miniature.
struct SmallSetup {
  std::shared_ptr<nn::Module> model;
  compile::BudgetSetup setup;
};

// `model` on `device` with AdamW (clipping on), the model's loss, and micro-batches of
// (B, *x_item) inputs filled with x_value and (B, *y_item) i64 targets filled with y_value.
SmallSetup setup_for(std::shared_ptr<nn::Module> model, int64_t effective_batch, Device device, Shape x_item,
                     DType x_dtype, double x_value, Shape y_item, double y_value) {
  SmallSetup s{std::move(model), {}};
  s.model->to(device);
  nn::Module* m = s.model.get();
  s.setup.device = device;
  s.setup.effective_batch = effective_batch;
  s.setup.loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  s.setup.make_optimizer = [m]() -> std::unique_ptr<optim::Optimizer> {
    auto opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions(1e-3));
    opt->set_max_grad_norm(1.0);
    return opt;
  };
  s.setup.make_micro = [=](int64_t B, int64_t count) {
    Shape xs{B}, ys{B};
    xs.insert(xs.end(), x_item.begin(), x_item.end());
    ys.insert(ys.end(), y_item.begin(), y_item.end());
    std::vector<optim::MicroBatch> micro;
    for (int64_t i = 0; i < count; ++i)
      micro.push_back({full(xs, x_value, {x_dtype, device}), full(ys, y_value, {DType::i64, device})});
    return micro;
  };
  return s;
}

SmallSetup small_cnn(int64_t effective_batch, Device device = Device::cpu()) {
  Generator gen(3);
  return setup_for(nn::fashion_cnn(&gen, 4), effective_batch, device, {1, 28, 28}, DType::f32, 0.5, {}, 3.0);
}

// A 2-layer GPT small enough for a test step on two cores.
SmallSetup small_gpt(int64_t effective_batch, Device device = Device::cpu()) {
  Generator gen(5);
  nn::GptConfig cfg;
  cfg.block_size = 32;
  cfg.dim = 64;
  cfg.heads = 2;
  cfg.layers = 2;
  return setup_for(std::make_shared<nn::Gpt>(cfg, &gen), effective_batch, device, {32}, DType::i64, 7.0, {32}, 9.0);
}

// The CPU allocator's peak over one real step in its steady state (the optimizer's state made by an
// earlier step), counted from what the process held before the model was built: everything the step
// touches is the test's, so this is the quantity the planner predicts.
using MakeSetup = SmallSetup (*)(int64_t, Device);

size_t measured_step_peak(MakeSetup make, Device device, int64_t effective_batch, int64_t micro_batch,
                          std::optional<compile::Mode> mode, int measured_call = -1, size_t memory_limit = 0,
                          bool trace_without_running = false) {
  if (device.is_cuda()) cuda::synchronize(device.index);
  // What the process held before, less the libraries' workspaces that earlier tests made: the plan
  // counts those (they stay allocated through the step).
  size_t before = compile::allocated_bytes(device);
  for (const auto& [name, bytes] : library_workspaces(device)) before -= bytes;
  SmallSetup s = make(effective_batch, device);
  const int64_t accum = effective_batch / micro_batch;
  std::unique_ptr<optim::Optimizer> opt = s.setup.make_optimizer();
  opt->set_accum_steps(accum);
  std::vector<optim::MicroBatch> micro = s.setup.make_micro(micro_batch, accum);
  std::optional<compile::CompiledFunction> step;
  compile::CompileOptions options(mode.value_or(compile::Mode::Default));
  options.memory_limit = memory_limit;
  options.trace_without_running = trace_without_running;
  if (mode) step.emplace(compile::compile_train_step(*opt, s.setup.loss_fn, options));
  auto run = [&] {
    if (step) (*step)(compile::flatten_micro(micro));
    else optim::train_step(*opt, s.setup.loss_fn, micro);
  };
  // Compiled: call 0 warms up, call 1 traces, call 2 replays first (traced without running: call 0
  // traces and runs the plan, 1 runs it again); eagerly, call 0 makes the state.
  if (measured_call < 0) measured_call = !mode ? 1 : trace_without_running ? 2 : 3;
  for (int i = 0; i < measured_call; ++i) run();
  if (device.is_cuda()) cuda::synchronize(device.index);
  compile::reset_peak_bytes(device);
  run();
  if (device.is_cuda()) cuda::synchronize(device.index);
  return compile::peak_bytes(device) - before;
}

// The planned and the measured peak of each model, eager and compiled, within 5%.
void expect_plans_match_measurements(Device device, compile::Mode compiled_mode) {
  struct Case {
    const char* name;
    MakeSetup make;
    std::optional<compile::Mode> mode;
  };
  for (const Case& c : {Case{"cnn eager", small_cnn, std::nullopt}, Case{"gpt eager", small_gpt, std::nullopt},
                        Case{"cnn compiled", small_cnn, compiled_mode}, Case{"gpt compiled", small_gpt, compiled_mode}}) {
    SmallSetup s = c.make(16, device);
    s.setup.compile_mode = c.mode;
    const size_t planned = compile::plan_candidate(s.setup, 8).steady_peak();
    const size_t measured = measured_step_peak(c.make, device, 16, 8, c.mode);
    EXPECT_NEAR(double(planned), double(measured), 0.05 * double(measured))
        << c.name << " on " << device.str() << ": " << compile::compare_planned_peak(planned, measured);
  }
}

compile::BudgetCandidate hand_made(int64_t micro_batch, size_t peak) {
  compile::BudgetCandidate c;
  c.micro_batch = micro_batch;
  c.arena_bytes = peak / 2;
  c.external_bytes = peak - peak / 2;
  return c;
}

}  // namespace

TEST(MetaMode, RunsNoKernelAndAllocatesNothing) {
  Generator gen(1);
  auto model = nn::fashion_cnn(&gen, 4);
  const uint64_t kernels_before = kernel_count();
  int64_t allocations = 0;
  {
    CountAllocations counter;
    MetaModeGuard meta;
    Tensor x = full({8, 1, 28, 28}, 1.0), y = full({8}, 2.0, {DType::i64});
    EXPECT_TRUE(x.storage()->is_meta());
    Tensor loss = nn::model_loss(*model, x, y);
    loss.backward();
    EXPECT_EQ(loss.shape(), Shape{});
    EXPECT_TRUE(loss.storage()->is_meta());
    allocations = counter.count();
  }
  EXPECT_EQ(kernel_count(), kernels_before);
  EXPECT_EQ(allocations, 0);
  for (const Tensor& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(p.grad().storage()->is_meta());
    EXPECT_FALSE(p.storage()->is_meta());  // the real parameters stay real
  }
}

TEST(MetaMode, ReadingAMetaTensorIsAClearError) {
  MetaModeGuard meta;
  Tensor x = full({2, 3}, 1.0);
  Tensor v = x.reshape({3, 2});  // views work unchanged
  EXPECT_TRUE(v.storage()->is_meta());
  EXPECT_EQ(v.shape(), (Shape{3, 2}));
  expect_error([&] { x.sum().item(); }, {"meta tensor", "no data"});
  expect_error([&] { x.to_vector<float>(); }, {"meta tensor"});
  expect_error([&] { x.data_ptr(); }, {"data_ptr", "meta tensor", "(2, 3)"});
}

TEST(MetaMode, GuardNestsAndRestores) {
  EXPECT_FALSE(meta_mode());
  {
    MetaModeGuard a;
    {
      MetaModeGuard b;
      EXPECT_TRUE(meta_mode());
    }
    EXPECT_TRUE(meta_mode());
  }
  EXPECT_FALSE(meta_mode());
  EXPECT_FALSE(full({2}, 1.0).storage()->is_meta());
}

TEST(MemoryBudget, MetaTraceHasTheRealTraceShapeAndPlan) {
  SmallSetup real = small_cnn(16), meta = small_cnn(16);
  compile::Graph gr = compile::trace_step_graph(real.setup, 8, 2, false);
  compile::Graph gm = compile::trace_step_graph(meta.setup, 8, 2, true);
  ASSERT_EQ(gr.nodes.size(), gm.nodes.size());
  for (size_t i = 0; i < gr.nodes.size(); ++i) {
    EXPECT_EQ(gr.nodes[i].op, gm.nodes[i].op) << "node " << i;
    ASSERT_EQ(gr.nodes[i].outputs.size(), gm.nodes[i].outputs.size());
    for (size_t k = 0; k < gr.nodes[i].outputs.size(); ++k)
      EXPECT_EQ(gr.nodes[i].outputs[k].shape, gm.nodes[i].outputs[k].shape) << "node " << i;
  }
  ASSERT_EQ(gr.buffers.size(), gm.buffers.size());
  for (size_t b = 0; b < gr.buffers.size(); ++b) {
    EXPECT_EQ(gr.buffers[b].nbytes, gm.buffers[b].nbytes) << "buffer " << b;
    EXPECT_EQ(gr.buffers[b].kind, gm.buffers[b].kind) << "buffer " << b;
  }
  // The planned arena of the real step is what the meta trace predicts (within 5%: here, exactly).
  compile::MemoryPlan pr = compile::plan_memory(gr), pm = compile::plan_memory(gm);
  ASSERT_NE(pr.arena_for(Device::cpu()), nullptr);
  ASSERT_NE(pm.arena_for(Device::cpu()), nullptr);
  const size_t real_bytes = pr.arena_for(Device::cpu())->bytes, meta_bytes = pm.arena_for(Device::cpu())->bytes;
  EXPECT_GT(real_bytes, 0u);
  EXPECT_EQ(real_bytes, meta_bytes);
  EXPECT_NEAR(double(meta_bytes), double(real_bytes), 0.05 * double(real_bytes));
}

TEST(MemoryBudget, PlanningLeavesNoMetaTensorsAndKeepsGradients) {
  SmallSetup s = small_cnn(16);
  std::vector<Tensor> params = s.model->parameters();
  Tensor g0 = full(params[0].shape(), 0.25);
  params[0].set_grad(g0);  // a caller's pending gradient survives planning
  std::vector<double> before = params[1].to_vector<double>();
  const uint64_t kernels_before = kernel_count();
  compile::plan_candidate(s.setup, 8);
  EXPECT_LE(kernel_count() - kernels_before, 8u);  // the fresh optimizer's counters only
  ASSERT_TRUE(params[0].grad().defined());
  EXPECT_TRUE(params[0].grad().is_same(g0));
  for (size_t i = 1; i < params.size(); ++i) EXPECT_FALSE(params[i].grad().defined()) << "param " << i;
  for (const Tensor& p : params) EXPECT_FALSE(p.storage()->is_meta());
  EXPECT_EQ(params[1].to_vector<double>(), before);  // no update ran
  for (const auto& [name, t] : s.model->named_buffers()) EXPECT_FALSE(t.storage()->is_meta()) << name;
}

TEST(MemoryBudget, PeaksGrowWithTheMicroBatch) {
  SmallSetup s = small_cnn(64);
  std::vector<compile::BudgetCandidate> cands = compile::plan_candidates(s.setup);
  ASSERT_EQ(cands.size(), 7u);  // 1 2 4 8 16 32 64
  for (size_t i = 1; i < cands.size(); ++i) {
    EXPECT_GT(cands[i].arena_bytes, cands[i - 1].arena_bytes) << "micro-batch " << cands[i].micro_batch;
    EXPECT_EQ(cands[i].external_bytes, cands[0].external_bytes);  // parameters and state do not grow
  }
  // External: the parameters and AdamW's two moments at least.
  size_t param_bytes = 0;
  for (const Tensor& p : s.model->parameters()) param_bytes += p.nbytes();
  EXPECT_GE(cands[0].external_bytes, 3 * param_bytes);
  EXPECT_EQ(cands[0].workspace_bytes, 0u);  // none on the CPU
  EXPECT_EQ(cands.back().input_bytes, size_t(64) * (28 * 28 * 4 + 8));  // one block of images, one of labels
  // The whole batch in 64 micro-batches: each label is a block of its own, 64 bytes as allocated.
  EXPECT_EQ(cands[0].input_bytes, size_t(64) * (28 * 28 * 4 + 64));
}

TEST(MemoryBudget, CandidatesArePowersOfTwoAndN) {
  EXPECT_EQ(compile::candidate_micro_batches(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(compile::candidate_micro_batches(64), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(compile::candidate_micro_batches(1), (std::vector<int64_t>{1}));
  expect_error([] { compile::candidate_micro_batches(0); }, {"effective batch", "0"});
}

TEST(MemoryBudget, PicksTheLargestThatFitsExactly) {
  std::vector<compile::BudgetCandidate> c{hand_made(1, 100), hand_made(2, 200), hand_made(4, 400), hand_made(8, 800)};
  compile::BudgetChoice choice = compile::pick_micro_batch(c, 8, 400);  // 400 <= 400: fits
  EXPECT_EQ(choice.choice().micro_batch, 4);
  EXPECT_EQ(choice.choice().accum, 2);
  EXPECT_EQ(choice.choice().last_micro_batch, 4);
  EXPECT_FALSE(choice.counts_items());
  EXPECT_TRUE(choice.candidates[2].fits);
  EXPECT_FALSE(choice.candidates[3].fits);
  EXPECT_EQ(compile::pick_micro_batch(c, 8, 399).choice().micro_batch, 2);
  EXPECT_EQ(compile::pick_micro_batch(c, 8, 1u << 30).choice().micro_batch, 8);
  std::string table = compile::budget_table(choice);
  EXPECT_NE(table.find("micro-batch"), std::string::npos) << table;
  EXPECT_NE(table.find("<- chosen"), std::string::npos) << table;
  EXPECT_NE(table.find("micro-batch 4 x ACCUM 2"), std::string::npos) << table;
  EXPECT_EQ(table.find("remainder"), std::string::npos) << table;
}

TEST(MemoryBudget, NothingFitsNamesTheBudgetAndTheSmallestPeak) {
  compile::BudgetCandidate small = hand_made(1, 3 << 20);
  small.arena_bytes = 1 << 20;
  small.external_bytes = 2 << 20;
  std::vector<compile::BudgetCandidate> c{hand_made(2, 5 << 20), small};
  expect_error([&] { compile::pick_micro_batch(c, 2, 1 << 20); },
               {"nothing fits 1.0 MiB", "1048576 bytes", "micro-batch 1 x ACCUM 2", "3.0 MiB",
                "parameters and optimizer state", "2.0 MiB"});
}

TEST(MemoryBudget, RemainderCountsItems) {
  std::vector<compile::BudgetCandidate> c;
  for (int64_t m : compile::candidate_micro_batches(100)) c.push_back(hand_made(m, size_t(m) * 1000));
  compile::BudgetChoice choice = compile::pick_micro_batch(c, 100, 40000);
  const compile::BudgetCandidate& k = choice.choice();
  EXPECT_EQ(k.micro_batch, 32);
  EXPECT_EQ(k.accum, 4);
  EXPECT_EQ(k.last_micro_batch, 4);  // 32 + 32 + 32 + 4 = 100
  EXPECT_TRUE(choice.counts_items());
  std::string table = compile::budget_table(choice);
  EXPECT_NE(table.find("the last micro-batch has 4 items"), std::string::npos) << table;
  EXPECT_NE(table.find("counts items (100 per step)"), std::string::npos) << table;
  // An optimizer counting 100 items per step reaches its boundary after exactly those four.
  Tensor w = full({2}, 1.0);
  w.set_requires_grad(true);
  optim::SGD opt({w}, optim::SGDOptions(0.1));
  opt.set_items_per_step(100);
  for (int64_t i = 0; i < k.accum; ++i) {
    int64_t items = i + 1 < k.accum ? k.micro_batch : k.last_micro_batch;
    opt.scale_loss((w * w).sum(), items).backward();
    EXPECT_EQ(opt.micro_step().stepped, i + 1 == k.accum) << "micro-batch " << i;
  }
}

TEST(MemoryBudget, ParsesSizesStrictly) {
  EXPECT_EQ(compile::parse_memory_size("512MiB"), size_t(512) << 20);
  EXPECT_EQ(compile::parse_memory_size("1GiB"), size_t(1) << 30);
  EXPECT_EQ(compile::parse_memory_size("2.5GB"), size_t(2500000000));
  EXPECT_EQ(compile::parse_memory_size("1.5 gib"), size_t(3) << 29);
  EXPECT_EQ(compile::parse_memory_size("300MB"), size_t(300000000));
  EXPECT_EQ(compile::parse_memory_size("4096"), size_t(4096));
  EXPECT_EQ(compile::parse_memory_size("64KiB"), size_t(65536));
  EXPECT_EQ(compile::parse_memory_size("8B"), size_t(8));
  for (const char* bad : {"", "GiB", "1.2.3GiB", "-1GiB", "1e9", "12 parsecs", "1GiBB", "0", "0.5", "1.5B", " 1GiB", "1G"})
    expect_error([&] { compile::parse_memory_size(bad); }, {"memory size: cannot parse", "e.g. 512MiB"});
}

TEST(MemoryBudget, OutOfMemoryNamesTheOpAndItsBuffer) {
  // 2^50 floats (4 PiB): no host allocator can give them; the error names the op and the buffer.
  Tensor x = full({int64_t(1) << 25}, 1.0);
  expect_error([&] { expand(x.reshape({1, int64_t(1) << 25}), {int64_t(1) << 25, int64_t(1) << 25}).contiguous(); },
               {"output 0", "(33554432, 33554432)", "f32", "4503599627370496 bytes", "on cpu", "out of host memory"});
  EXPECT_TRUE(compile::is_out_of_memory(Error("copy: output 0 (2, 2) f32 (16 bytes) on cpu: cpu allocator: out of "
                                              "host memory asking for 16 bytes")));
}

TEST(MemoryBudget, OutOfMemoryAdvice) {
  std::vector<compile::BudgetCandidate> c{hand_made(16, 100 << 20), hand_made(32, 300 << 20), hand_made(64, 900 << 20)};
  compile::BudgetChoice choice = compile::pick_micro_batch(c, 128, size_t(1) << 30);
  EXPECT_EQ(compile::budget_advice(choice),
            "the planner would choose micro-batch 64 x ACCUM 2 for budget 1.00 GiB (planned peak 900.0 MiB; "
            "reel train --effective-batch 128 --memory-budget SIZE)");
  EXPECT_TRUE(compile::is_out_of_memory(Error("cuda allocator: out of memory on cuda:0 asking for 2 GiB")));
  EXPECT_FALSE(compile::is_out_of_memory(Error("matmul: shapes (4, 3) and (5, 2) cannot be multiplied")));
}

TEST(MemoryBudget, PlannedPeakMatchesTheAllocatorsMeasuredPeak) {
  expect_plans_match_measurements(Device::cpu(), compile::Mode::Default);
}

TEST(MemoryBudgetCuda, PlannedPeakMatchesTheCachingAllocatorsMeasuredPeak) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  // On the GPU: the caching allocator's rounding, cuBLAS's workspace, and for the compiled step the
  // CUDA graph of reduce-overhead (measured at its second replay).
  expect_plans_match_measurements(Device::cuda(0), compile::Mode::ReduceOverhead);
}

// Micro-batch and recomputation chosen together: a compiled step traced without running (no eager
// first calls), under a budget its largest micro-batch does not fit as it is, gets a candidate that
// recomputes to fit it, whose plan measures within 5% of its planned peak on the allocator.
namespace {
void expect_recomputation_fits_as_planned(Device device, compile::Mode mode) {
  SmallSetup s = small_gpt(16, device);
  s.setup.compile_mode = mode;
  s.setup.trace_without_running = true;
  const compile::BudgetCandidate whole = compile::plan_candidate(s.setup, 16), half = compile::plan_candidate(s.setup, 8);
  EXPECT_EQ(whole.eager_calls_bytes, 0u);  // nothing runs eagerly
  ASSERT_GT(whole.peak(), half.peak());
  const size_t budget = half.peak() + (whole.peak() - half.peak()) / 4;
  std::vector<compile::BudgetCandidate> cands = compile::plan_candidates_for(s.setup, budget);
  const compile::BudgetCandidate* recomputing = nullptr;
  for (const compile::BudgetCandidate& c : cands) {
    if (c.micro_batch == 16 && c.memory_limit > 0) recomputing = &c;
    EXPECT_GT(c.estimated_seconds, 0.0) << "micro-batch " << c.micro_batch;
    // Recomputation is tried only where the plain plan does not fit.
    if (c.memory_limit > 0) {
      EXPECT_GT(compile::plan_candidate(s.setup, c.micro_batch).peak(), budget);
    }
  }
  ASSERT_NE(recomputing, nullptr) << compile::budget_table(compile::pick_micro_batch(cands, 16, budget));
  EXPECT_LE(recomputing->peak(), budget);
  EXPECT_GT(recomputing->recomputed_nodes, 0u);
  EXPECT_GT(recomputing->recompute_flops, 0.0);
  EXPECT_GT(recomputing->estimated_seconds, whole.estimated_seconds);  // the same step and more
  const size_t measured = measured_step_peak(small_gpt, device, 16, 16, mode, -1, recomputing->memory_limit, true);
  EXPECT_NEAR(double(recomputing->steady_peak()), double(measured), 0.05 * double(measured))
      << compile::compare_planned_peak(recomputing->steady_peak(), measured);
  EXPECT_LE(measured, budget + budget / 20);
}
}  // namespace

TEST(MemoryBudget, RecomputationMakesALargerMicroBatchFitAsPlanned) {
  expect_recomputation_fits_as_planned(Device::cpu(), compile::Mode::Default);
}

TEST(MemoryBudgetCuda, RecomputationMakesALargerMicroBatchFitAsPlanned) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_recomputation_fits_as_planned(Device::cuda(0), compile::Mode::ReduceOverhead);
}

// Among the candidates that fit, the fewest estimated seconds wins (a larger micro-batch that
// recomputes over a smaller one that starts more kernels), the larger micro-batch on a tie.
TEST(MemoryBudget, PicksTheFastestThatFitsByEstimate) {
  std::vector<compile::BudgetCandidate> c{hand_made(4, 400), hand_made(8, 900), hand_made(8, 450)};
  c[0].estimated_seconds = 2.0;
  c[1].estimated_seconds = 1.0;  // does not fit
  c[2].estimated_seconds = 1.5;
  c[2].memory_limit = 200;
  c[2].recomputed_nodes = 12;
  c[2].recompute_flops = 3e9;
  compile::BudgetChoice choice = compile::pick_micro_batch(c, 16, 500);
  EXPECT_EQ(choice.chosen, 2u);
  const std::string table = compile::budget_table(choice);
  EXPECT_NE(table.find("recompute to"), std::string::npos) << table;
  EXPECT_NE(table.find("recomputing 12 nodes in the backward"), std::string::npos) << table;
  EXPECT_NE(table.find("est. items/s"), std::string::npos) << table;
  EXPECT_NE(compile::budget_advice(choice).find("recomputing to an arena of"), std::string::npos);
  c[2].estimated_seconds = 2.5;  // now slower than micro-batch 4 as it is
  EXPECT_EQ(compile::pick_micro_batch(c, 16, 500).chosen, 0u);
  c[0].estimated_seconds = c[2].estimated_seconds = 0;  // not estimated: the larger micro-batch
  EXPECT_EQ(compile::pick_micro_batch(c, 16, 500).chosen, 2u);
}

TEST(MemoryBudget, TracingACallHoldsNoMoreThanRunningItEagerly) {
  // The tracer lets each block go when the program does (compile/ir/trace.h), so the traced call of a
  // compiled step (plan building included) peaks where an eager step does, not at the sum of its
  // buffers.
  const size_t eager = measured_step_peak(small_gpt, Device::cpu(), 16, 8, std::nullopt);
  const size_t traced = measured_step_peak(small_gpt, Device::cpu(), 16, 8, compile::Mode::Default, 1);
  EXPECT_LE(double(traced), 1.1 * double(eager)) << "eager " << eager << " bytes, traced " << traced;
}

TEST(MemoryBudget, ComparesPlannedWithMeasured) {
  const std::string close = compile::compare_planned_peak(100 << 20, 102 << 20);
  EXPECT_EQ(close, "memory: planned peak 100.0 MiB, measured 102.0 MiB (+2.0%)");
  const std::string off = compile::compare_planned_peak(100 << 20, 90 << 20);
  EXPECT_NE(off.find("(-10.0%)"), std::string::npos) << off;
  EXPECT_NE(off.find("warning: the measured peak differs from the plan by more than 5%"), std::string::npos) << off;
}

TEST(MemoryPlan, EagerPeakFollowsTheProgramsOwnReleases) {
  // x -> a -> b -> c -> d -> e, each 1 KiB; `hold_a` keeps a alive to the end, as a tensor saved for
  // a backward still to come would be.
  for (bool hold_a : {false, true}) {
    Tensor x = full({256}, 1.0);
    compile::Tracer tracer({x});
    tracer.start();
    Tensor a = x * 2.0;  // node 0
    Tensor b = a + 1.0;  // node 1: a's last use
    Tensor keep = hold_a ? a : Tensor();
    a = Tensor();
    Tensor c = b * 3.0;  // node 2: a dropped before it (unless held)
    b = Tensor();
    Tensor d = c + 1.0;  // node 3
    c = Tensor();
    Tensor e = d * 2.0;  // node 4
    d = Tensor();
    keep = Tensor();
    tracer.stop();
    compile::Graph g = tracer.finish({e});
    auto released = [&](int node) { return g.buffers[g.nodes[node].outputs[0].buffer].released_after; };
    EXPECT_EQ(released(0), hold_a ? -1 : 1) << "a";  // held: dropped after the last node
    EXPECT_EQ(released(1), 2) << "b";
    EXPECT_EQ(released(2), 3) << "c";
    EXPECT_EQ(released(3), -1) << "d: dropped after the last node";
    const size_t peak = compile::eager_peak_bytes(g, Device::cpu(), [](size_t n) { return n; });
    EXPECT_EQ(peak, size_t(hold_a ? 3 * 1024 : 2 * 1024));
  }
}

TEST(CpuAllocator, CountsLiveBlocksAndTheirPeak) {
  const Device cpu = Device::cpu();
  EXPECT_EQ(compile::allocation_bytes(cpu, 1000), 1024u);  // 64-byte blocks
  EXPECT_EQ(compile::allocation_bytes(cpu, 64), 64u);
  const size_t base = compile::allocated_bytes(cpu);
  compile::reset_peak_bytes(cpu);
  {
    Tensor t = Tensor::empty({250}, DType::f32, cpu);  // 1000 bytes
    EXPECT_EQ(compile::allocated_bytes(cpu), base + 1024);
    {
      Tensor u = Tensor::empty({1024}, DType::f32, cpu);
      EXPECT_EQ(compile::allocated_bytes(cpu), base + 1024 + 4096);
    }
    EXPECT_EQ(compile::allocated_bytes(cpu), base + 1024);
  }
  EXPECT_EQ(compile::allocated_bytes(cpu), base);
  EXPECT_EQ(compile::peak_bytes(cpu), base + 1024 + 4096);
  compile::reset_peak_bytes(cpu);
  EXPECT_EQ(compile::peak_bytes(cpu), base);
}
