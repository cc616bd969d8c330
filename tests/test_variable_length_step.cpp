// The accumulation contract for variable-length sequences (data/text_lines.h): a step over
// micro-batches of lines padded to their longest, counted by real tokens (set_items_per_step), gives
// the update of the same lines run one by one unpadded. Right padding leaves a causal model's real
// positions as they are (a real query never sees a later, padded key), and cross_entropy's
// ignore_index counts the padded targets out of the loss and of its mean. f64 on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compile/runtime/bucketed_step.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "data/text_lines.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "test_util.h"

namespace reel {
namespace {

std::shared_ptr<nn::Module> small_gpt() {
  Generator gen(3);
  auto m = nn::gpt(nn::GptConfig{256, 24, 16, 2, 2}, &gen);
  m->to(DType::f64);
  return m;
}

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) d = std::max(d, std::abs(x[k] - y[k]));
  }
  return d;
}

TEST(VariableLengthStep, PaddedMicroBatchesUpdateAsTheUnpaddedLinesDo) {
  const std::vector<std::string> lines = {"A short line.", "Another, somewhat longer, line of text.", "ok",
                                          "Lines of every length come together in one batch", "twelve bytes"};
  data::LineSampler sampler(lines, 24, 11);
  std::vector<data::LineBatch> micro;
  int64_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    micro.push_back(sampler.next(3));
    tokens += micro.back().positions();
  }
  auto padded = small_gpt(), unpadded = small_gpt();
  const std::vector<Tensor> before = [&] {
    std::vector<Tensor> out;
    for (const Tensor& p : padded->parameters()) out.push_back(p.clone());
    return out;
  }();
  optim::SGD opt_padded(padded->parameters(), optim::SGDOptions(0.5)), opt_unpadded(unpadded->parameters(), optim::SGDOptions(0.5));
  opt_padded.set_items_per_step(tokens);
  opt_unpadded.set_items_per_step(tokens);
  int64_t lengths_seen = 0;
  for (const data::LineBatch& b : micro) {
    opt_padded.scale_loss(nn::model_loss(*padded, b.inputs, b.targets), b.positions()).backward();
    opt_padded.micro_step();
    for (int64_t row = 0; row < b.inputs.size(0); ++row) {
      const int64_t n = b.lengths[size_t(row)];
      lengths_seen = std::max(lengths_seen, b.inputs.size(1) - n);
      Tensor x = b.inputs.slice(0, row, row + 1).slice(1, 0, n).contiguous();   // (1, n)
      Tensor y = b.targets.slice(0, row, row + 1).slice(1, 0, n).contiguous();  // (1, n)
      opt_unpadded.scale_loss(nn::model_loss(*unpadded, x, y), n).backward();
      opt_unpadded.micro_step();
    }
  }
  EXPECT_GT(lengths_seen, 0) << "no batch held items of different lengths: the test would not test padding";
  EXPECT_EQ(opt_padded.step_count(), 1);
  EXPECT_EQ(opt_unpadded.step_count(), 1);
  // The update moved the parameters, and both ways moved them alike.
  EXPECT_GT(max_abs_diff(before, padded->parameters()), 1e-4);
  EXPECT_LT(max_abs_diff(padded->parameters(), unpadded->parameters()), 1e-10);
}

// The unpadded reference of one step: every line of every micro-batch its own (1, n) micro-batch,
// weighed by its n of the step's real tokens.
void unpadded_step(nn::Module& model, optim::Optimizer& opt, const std::vector<data::LineBatch>& micro) {
  int64_t tokens = 0;
  for (const data::LineBatch& b : micro) tokens += b.positions();
  opt.set_items_per_step(tokens);
  for (const data::LineBatch& b : micro)
    for (int64_t row = 0; row < b.inputs.size(0); ++row) {
      const int64_t n = b.lengths[size_t(row)];
      Tensor x = b.inputs.slice(0, row, row + 1).slice(1, 0, n).contiguous();
      Tensor y = b.targets.slice(0, row, row + 1).slice(1, 0, n).contiguous();
      opt.scale_loss(nn::model_loss(model, x, y), n).backward();
      opt.micro_step();
    }
}

// `count` steps of `accum` micro-batches of 2 lines each, drawn from lines of many lengths (context 24).
std::vector<std::vector<data::LineBatch>> line_steps(int count, int accum) {
  const std::vector<std::string> lines = {"A short line.", "Another, somewhat longer, line of text.", "ok",
                                          "Lines of every length come together in one batch", "twelve bytes",
                                          "abc", "the longest line of them all, at forty-seven b"};
  data::LineSampler sampler(lines, 24, 21);
  std::vector<std::vector<data::LineBatch>> steps(static_cast<size_t>(count));
  for (auto& step : steps)
    for (int i = 0; i < accum; ++i) step.push_back(sampler.next(2));
  return steps;
}

TEST(VariableLengthStep, CountingRealTargetsOnTheDeviceEagerAndCompiledWithBuckets) {
  // set_items_from_targets: optim::train_step weighs each padded micro-batch by its real targets,
  // counted as tensors, so the same code serves eagerly and in a compiled plan replayed with other
  // counts; the compiled step pads every call to a length bucket (one plan per bucket).
  const std::vector<std::vector<data::LineBatch>> steps = line_steps(8, 2);
  auto eager = small_gpt(), compiled = small_gpt(), reference = small_gpt();
  auto sgd = [](nn::Module& m) { return optim::SGD(m.parameters(), optim::SGDOptions(0.5)); };
  optim::SGD opt_e = sgd(*eager), opt_c = sgd(*compiled), opt_r = sgd(*reference);
  opt_e.set_accum_steps(2).set_items_from_targets();
  opt_c.set_accum_steps(2).set_items_from_targets();
  nn::Module* mc = compiled.get();
  compile::CompileOptions options(compile::Mode::Default);
  // Inputs and targets of both micro-batches (arguments 0..3), padded along dim 1.
  options.buckets = compile::LengthBuckets{{0, 1, 2, 3}, 1, {8, 16, 24},
                                           {double(data::kPadToken), double(data::kIgnoreIndex),
                                            double(data::kPadToken), double(data::kIgnoreIndex)}};
  compile::CompiledFunction step = compile::compile_train_step(
      opt_c, [mc](const Tensor& x, const Tensor& y) { return nn::model_loss(*mc, x, y); }, options);
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<optim::MicroBatch> micro;
    for (const data::LineBatch& b : steps[s]) micro.push_back({b.inputs, b.targets});
    Tensor mean_e;
    optim::train_step(opt_e, [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*eager, x, y); }, micro,
                      &mean_e);
    const double mean_c = step(compile::flatten_micro(micro))[0].item();
    EXPECT_NEAR(mean_c, mean_e.item(), 1e-12) << "step " << s;
    unpadded_step(*reference, opt_r, steps[s]);
  }
  EXPECT_GE(step.replays(), 2) << "the compiled step hardly replayed its plans";
  EXPECT_LE(step.traces(), int(step.bucket_calls().size()));  // a bucket met once runs its warm-up call only
  EXPECT_LT(max_abs_diff(eager->parameters(), reference->parameters()), 1e-10);
  EXPECT_LT(max_abs_diff(compiled->parameters(), reference->parameters()), 1e-10);
}

// The step in pieces (compile/runtime/bucketed_step.h): each micro-batch padded to the bucket of its
// own longest line, its forward and backward one plan per bucket, the optimizer one more; the
// parameters after 8 steps those of the lines run one by one unpadded, the mean loss eager's.
TEST(VariableLengthStep, EachMicroBatchInItsOwnBucketUpdatesAsTheUnpaddedLines) {
  const std::vector<std::vector<data::LineBatch>> steps = line_steps(8, 3);
  auto eager = small_gpt(), pieces = small_gpt(), reference = small_gpt();
  optim::AdamW opt_e(eager->parameters(), optim::AdamWOptions(1e-2)),
      opt_p(pieces->parameters(), optim::AdamWOptions(1e-2)), opt_r(reference->parameters(), optim::AdamWOptions(1e-2));
  for (optim::Optimizer* o : {static_cast<optim::Optimizer*>(&opt_e), static_cast<optim::Optimizer*>(&opt_p),
                              static_cast<optim::Optimizer*>(&opt_r)})
    o->set_accum_steps(3).set_max_grad_norm(1.0);
  opt_e.set_items_from_targets();
  opt_p.set_items_from_targets();
  nn::Module* mp = pieces.get();
  compile::BucketedTrainStep step(
      opt_p, [mp](const Tensor& x, const Tensor& y) { return nn::model_loss(*mp, x, y); }, {8, 16, 24},
      compile::CompileOptions(compile::Mode::Default), data::kPadToken);
  int mixed_steps = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<optim::MicroBatch> micro;
    std::set<int64_t> buckets;
    for (const data::LineBatch& b : steps[s]) {
      micro.push_back({b.inputs, b.targets});
      buckets.insert(b.inputs.size(1) <= 8 ? 8 : b.inputs.size(1) <= 16 ? 16 : 24);
    }
    mixed_steps += buckets.size() > 1;
    Tensor mean_e;
    optim::train_step(opt_e, [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*eager, x, y); }, micro,
                      &mean_e);
    const std::vector<Tensor> out = step(micro);
    EXPECT_NEAR(out[0].item(), mean_e.item(), 1e-12) << "step " << s;
    unpadded_step(*reference, opt_r, steps[s]);
  }
  EXPECT_GT(mixed_steps, 0) << "no step mixed buckets: the test would not test per-micro-batch buckets";
  EXPECT_EQ(opt_p.step_count(), 8);
  EXPECT_LT(max_abs_diff(pieces->parameters(), reference->parameters()), 1e-10);
  EXPECT_LT(max_abs_diff(pieces->parameters(), eager->parameters()), 1e-10);
  // One plan per bucket met and one for the optimizer, all in one arena.
  EXPECT_EQ(step.micro_batch_piece().traces(), int(step.bucket_calls().size()));
  EXPECT_EQ(step.optimizer_piece().traces(), 1);
  int64_t calls = 0;
  for (const auto& [size, n] : step.bucket_calls()) calls += n;
  EXPECT_EQ(calls, 8 * 3);
  EXPECT_GT(step.arena_pool().bytes(Device::cpu()), 0u);
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>;

std::unique_ptr<optim::Optimizer> adamw(nn::Module& m) {
  auto o = std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions(1e-2));
  o->set_accum_steps(3).set_max_grad_norm(1.0);
  return o;
}
std::unique_ptr<optim::Optimizer> sgd(nn::Module& m) {
  auto o = std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions(0.5));
  o->set_accum_steps(3).set_max_grad_norm(1.0);
  return o;
}

std::vector<Tensor> as_f64_on_cpu(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.to(Device::cpu()).to(DType::f64));
  return out;
}

// The parameters after `steps`, each line run on its own unpadded, eagerly, on `device` in `dtype`.
std::vector<Tensor> unpadded_parameters(const std::vector<std::vector<data::LineBatch>>& steps, Device device,
                                        DType dtype, const MakeOptimizer& make) {
  auto model = small_gpt();
  model->to(device);
  model->to(dtype);
  auto opt = make(*model);
  for (const auto& step : steps) {
    std::vector<data::LineBatch> on_device = step;
    for (data::LineBatch& b : on_device) {
      b.inputs = b.inputs.to(device);
      b.targets = b.targets.to(device);
    }
    unpadded_step(*model, *opt, on_device);
  }
  return as_f64_on_cpu(model->parameters());
}

// The step in pieces traced without running (no call eager; a new bucket's first call served by its
// plan), on `device` in `dtype`, over `steps` of 3 micro-batches: the parameters it leaves, and its
// measured peak beside the pieces' planned one (compile::plans_steady_peak).
struct PiecesRun {
  std::vector<Tensor> parameters;  // f64, on the CPU
  size_t planned = 0, measured = 0;
};

PiecesRun run_pieces(const std::vector<std::vector<data::LineBatch>>& steps, Device device, DType dtype,
                     compile::Mode mode, const MakeOptimizer& make) {
  auto pieces = small_gpt();
  pieces->to(device);
  pieces->to(dtype);
  auto opt = make(*pieces);
  opt->set_items_from_targets();
  std::vector<std::vector<optim::MicroBatch>> micro(steps.size());
  for (size_t s = 0; s < steps.size(); ++s)
    for (const data::LineBatch& b : steps[s]) micro[s].push_back({b.inputs.to(device), b.targets.to(device)});
  // What is held besides the pieces' plans: everything allocated now but the model's parameters. The
  // libraries' workspaces (cuBLAS's) are made first, so that they are in it and out of the comparison.
  (void)matmul(ones({2, 2}, TensorOptions{dtype, device}), ones({2, 2}, TensorOptions{dtype, device}));
  size_t parameters = 0;
  for (const Tensor& p : pieces->parameters()) parameters += compile::allocation_bytes(device, p.nbytes());
  const size_t other = compile::allocated_bytes(device) - parameters;
  compile::CompileOptions options(mode);
  options.trace_without_running = true;
  nn::Module* mp = pieces.get();
  compile::BucketedTrainStep step(
      *opt, [mp](const Tensor& x, const Tensor& y) { return nn::model_loss(*mp, x, y); }, {8, 16, 24}, options,
      data::kPadToken);
  compile::reset_peak_bytes(device);
  for (const auto& m : micro) step(m);
  PiecesRun r;
  r.measured = compile::peak_bytes(device) - other;
  EXPECT_EQ(step.micro_batch_piece().eager_calls() + step.optimizer_piece().eager_calls(), 0);
  EXPECT_EQ(step.micro_batch_piece().traces(), int(step.bucket_calls().size()));
  EXPECT_EQ(opt->step_count(), int64_t(steps.size()));
  r.parameters = as_f64_on_cpu(pieces->parameters());
  // The plans' own part (the workspaces were there before).
  r.planned = compile::plans_steady_peak(step.plans(), device) - compile::library_workspace_bytes(device);
  return r;
}

// Planned within 5%; slack for the calls' 0-dim results, each a block of its own.
void expect_planned_peak(const PiecesRun& r) {
  EXPECT_NEAR(double(r.planned), double(r.measured), 0.05 * double(r.planned) + 16384)
      << compile::compare_planned_peak(r.planned, r.measured);
}

TEST(VariableLengthStep, PiecesTracedWithoutRunningMatchTheUnpaddedLinesAndTheirPlannedPeak) {
  const std::vector<std::vector<data::LineBatch>> steps = line_steps(8, 3);
  const PiecesRun r = run_pieces(steps, Device::cpu(), DType::f64, compile::Mode::Default, adamw);
  EXPECT_LT(max_abs_diff(r.parameters, unpadded_parameters(steps, Device::cpu(), DType::f64, adamw)), 1e-10);
  expect_planned_peak(r);
}

// fp32 on the GPU against the f64 lines on the CPU (other kernels, other shapes, no padding). With
// SGD the fp32 rounding stays at its own size; AdamW divides each gradient by its own magnitude, so a
// near-zero gradient's rounding becomes a step of lr: there the pieces must be as close to f64 as the
// unpadded lines run eagerly in fp32 on the same GPU are.
TEST(VariableLengthStepCuda, PiecesInFp32MatchTheUnpaddedLinesAndTheirPlannedPeak) {
  REEL_REQUIRE_GPU();
  const std::vector<std::vector<data::LineBatch>> steps = line_steps(8, 3);
  const Device gpu = Device::cuda(0);
  const PiecesRun plain = run_pieces(steps, gpu, DType::f32, compile::Mode::ReduceOverhead, sgd);
  EXPECT_LT(max_abs_diff(plain.parameters, unpadded_parameters(steps, Device::cpu(), DType::f64, sgd)), 1e-4);
  expect_planned_peak(plain);

  const std::vector<Tensor> exact = unpadded_parameters(steps, Device::cpu(), DType::f64, adamw);
  const PiecesRun adam = run_pieces(steps, gpu, DType::f32, compile::Mode::ReduceOverhead, adamw);
  const double eager_fp32 = max_abs_diff(unpadded_parameters(steps, gpu, DType::f32, adamw), exact);
  const double pieces_fp32 = max_abs_diff(adam.parameters, exact);
  EXPECT_LT(pieces_fp32, 2 * eager_fp32 + 1e-5) << "eager fp32 lines on the GPU: " << eager_fp32 << " from f64";
  EXPECT_LT(pieces_fp32, 1e-2);  // well under one lr-sized step of difference
  std::printf("AdamW, fp32 on the GPU, largest difference from f64: pieces %.3g, unpadded eager lines %.3g\n",
              pieces_fp32, eager_fp32);
  expect_planned_peak(adam);
}

TEST(VariableLengthStep, CountingModesDoNotMix) {
  auto m = small_gpt();
  optim::SGD a(m->parameters()), b(m->parameters()), c(m->parameters());
  a.set_items_per_step(100);
  testing_util::expect_error([&] { a.set_items_from_targets(); }, {"set_items_from_targets", "items_per_step (100)"});
  b.set_items_from_targets();
  testing_util::expect_error([&] { b.set_items_per_step(100); }, {"items_per_step", "set_items_from_targets"});
  testing_util::expect_error([&] { c.scale_loss_share(ones({}), ones({})); }, {"call set_items_from_targets first"});
  testing_util::expect_error([&] { b.scale_loss_share(ones({}), ones({2})); }, {"one-element loss and share", "(2,)"});
  // Pieces traced without running need the optimizer's state made up front: SGD's momentum is made
  // at its first update.
  optim::SGD momentum(m->parameters(), optim::SGDOptions(0.5).momentum(0.9));
  momentum.set_items_from_targets();
  compile::CompileOptions options;
  options.trace_without_running = true;
  testing_util::expect_error(
      [&] { compile::BucketedTrainStep(momentum, [](const Tensor& x, const Tensor&) { return x.sum(); }, {8}, options); },
      {"bucketed step: tracing without running", "SGD"});
}

}  // namespace
}  // namespace reel
