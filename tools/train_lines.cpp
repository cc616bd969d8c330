// `reel train --items lines`: a GPT trained on a text's lines, one item per line, micro-batches of
// lines of different lengths (data/text_lines.h), eagerly or compiled with length buckets.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "compile/runtime/bucketed_step.h"
#include "compile/runtime/describe.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "data/data.h"
#include "parallel/data_parallel.h"
#include "reel.h"
#include "tensor/file_io.h"
#include "tools/train_checkpoint.h"
#include "tools/train_common.h"

namespace reel::tools {

// Each step draws its ACCUM micro-batches of lines first, each padded to its own longest line, and weighs them by their real tokens, so that the step's gradient is the mean over its
// real tokens whatever the padding (tests/test_variable_length_step.cpp), counted from the targets on
// the device (set_items_from_targets). Compiled, every call is padded to a length bucket, powers of
// two up to the context, so the plans traced are at most the buckets used, never one per length.
// Where the optimizer can make its state first (AdamW), a bucket's first call is traced without
// running (compile.h), so no call runs eagerly at eager's footprint, and the run's peak is the plans'
// (compile::plans_steady_peak: the largest bucket's arena, shared, plus parameters, gradients,
// optimizer state and inputs), printed beside the measured one at the end.
int train_lines(const TrainOptions& o, nn::Gpt& model, optim::Optimizer& opt, Device device) {
  const std::string text = o.text_path.empty() ? data::read_fortunes() : data::tensor_to_bytes(data::load_text_bytes(o.text_path));
  std::vector<std::string> lines = data::split_lines(text);
  REEL_CHECK(lines.size() >= 2, "train: --items lines needs a text of at least 2 lines, got ", lines.size());
  // The last 5% of the lines (at least one) for validation, as split_text keeps the last 5% of a text.
  const size_t n_val = std::max<size_t>(1, lines.size() / 20);
  std::vector<std::string> val(lines.end() - ptrdiff_t(n_val), lines.end());
  lines.resize(lines.size() - n_val);
  const int64_t T = model.config().block_size;
  data::LineSampler sampler(lines, T, o.seed + uint64_t(dist::rank())), val_sampler(val, T, o.seed + 1);
  std::printf("lines: %zu for training, %zu for validation, cut at %lld bytes\n", sampler.num_items(),
              val_sampler.num_items(), (long long)T + 1);
  // Each micro-batch weighs its real tokens' share of the step, counted from the targets on the
  // device: the same for the eager and the compiled step.
  opt.set_items_from_targets(data::kIgnoreIndex);
  int64_t first_step = 0;
  if (!o.resume.empty()) {
    const RunPosition at = resume_training(o.resume, model, opt, o);
    first_step = at.steps;
    sampler.set_draws(at.sampler_draws);
    std::printf("resume: step %lld of %lld from %s\n", (long long)first_step, (long long)o.steps, o.resume.c_str());
  }
  const int64_t last_step = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;
  MetricsLog log(dist::rank() == 0 ? o.log : "", !o.resume.empty());
  nn::Module* m = &model;
  optim::LossFn loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  std::optional<compile::CompiledFunction> compiled;  // --buckets step: the whole step, one plan per bucket
  std::optional<compile::BucketedTrainStep> pieces;   // --buckets micro-batch: the step in pieces
  const std::vector<int64_t> sizes = compile::LengthBuckets::powers_of_two(std::min<int64_t>(16, T), T);
  auto bucket_of = [&](int64_t length) { return *std::lower_bound(sizes.begin(), sizes.end(), length); };
  // Compiled, traced without running where the optimizer can make its state first (train_common.h).
  compile::CompileOptions options;
  if (o.compile != "none") options = compile_options(o, opt);
  if (o.compile != "none" && o.buckets == "micro-batch") {
    pieces.emplace(opt, loss_fn, sizes, options, data::kPadToken);
  } else if (o.compile != "none") {
    compile::LengthBuckets buckets;
    buckets.dim = 1;
    buckets.sizes = sizes;
    for (int64_t i = 0; i < o.accum; ++i) {
      buckets.inputs.insert(buckets.inputs.end(), {size_t(2 * i), size_t(2 * i + 1)});
      buckets.pad_values.insert(buckets.pad_values.end(), {double(data::kPadToken), double(data::kIgnoreIndex)});
    }
    options.buckets = buckets;
    options.cache_limit = int(buckets.sizes.size());
    compiled.emplace(compile::compile_train_step(opt, loss_fn, options));
  }
  Progress progress(o.steps, "tok");
  Clock::time_point start = Clock::now();
  int64_t tokens = 0, padded = 0;
  double last_loss = 0;
  std::vector<double> seconds_per_token;  // per step (each ends with the host reading its loss)
  compile::reset_peak_bytes(device);
  int64_t step = first_step;
  auto save = [&] {
    if (dist::rank() == 0) save_training(o.checkpoint, model, opt, {step, 0, sampler.draws(), default_generator().offset()}, o);
  };
  auto finish_step = [&](auto metrics, int64_t step_tokens, Clock::time_point step_start) {
    log_step(log, metrics, step_tokens, step_start, device);
    if (save_due(o, step)) save();
  };
  while (step < last_step) {
    const Clock::time_point step_start = Clock::now();
    std::vector<data::LineBatch> micro;
    int64_t step_tokens = 0, longest = 0, rows = 0;
    for (int64_t i = 0; i < o.accum; ++i) {
      micro.push_back(sampler.next(o.micro_batch, device));
      step_tokens += micro.back().positions();
      longest = std::max(longest, micro.back().inputs.size(1));
      rows += micro.back().inputs.size(0);
    }
    tokens += step_tokens;
    if (compiled || pieces) {
      std::vector<optim::MicroBatch> mb;
      for (const data::LineBatch& b : micro) mb.push_back({b.inputs, b.targets});
      std::vector<Tensor> out;
      if (pieces) {
        out = (*pieces)(mb);
        for (const data::LineBatch& b : micro) padded += b.inputs.size(0) * bucket_of(b.inputs.size(1));
      } else {
        out = (*compiled)(compile::flatten_micro(mb));
        padded += rows * bucket_of(longest);
      }
      last_loss = out[0].item();
      seconds_per_token.push_back(seconds_since(step_start) / double(std::max<int64_t>(step_tokens, 1)));
      progress.update(++step, last_loss, tokens, out[4].item());
      finish_step([&] { return step_metrics(step, out); }, step_tokens, step_start);
      continue;
    }
    std::vector<optim::MicroBatch> mb;
    for (const data::LineBatch& b : micro) {
      padded += b.inputs.numel();
      mb.push_back({b.inputs, b.targets});
    }
    Tensor mean_loss;
    optim::StepResult r = optim::train_step(opt, loss_fn, mb, &mean_loss);
    last_loss = mean_loss.item();
    seconds_per_token.push_back(seconds_since(step_start) / double(std::max<int64_t>(step_tokens, 1)));
    progress.update(++step, last_loss, tokens, r.lr);
    finish_step([&] { return step_metrics(step, last_loss, r); }, step_tokens, step_start);
  }
  progress.end_line();
  if (!o.checkpoint.empty() && !save_due(o, step)) save();  // the end's, unless just written
  const size_t peak = compile::peak_bytes(device);
  if (seconds_per_token.size() >= 10) {
    // The steady state: the first tenth of the steps (warm-up, traces, captures) left out.
    std::vector<double> steady(seconds_per_token.begin() + ptrdiff_t(seconds_per_token.size() / 10),
                               seconds_per_token.end());
    std::sort(steady.begin(), steady.end());
    std::printf("throughput: median %.0f real tokens/s over steps %zu..%zu (each step timed to its loss read)\n",
                1.0 / steady[steady.size() / 2], seconds_per_token.size() / 10 + 1, seconds_per_token.size());
  }
  std::printf("memory: peak allocated during training %s on %s\n", compile::bytes_str(peak).c_str(),
              device.str().c_str());
  // The plans' steady peak against the measured one: a new bucket's first call runs its plan, so the
  // whole run is steady when traced without running.
  if ((compiled || pieces) && options.trace_without_running) {
    const std::vector<const compile::Plan*> plans = pieces ? pieces->plans() : compiled->plans();
    std::printf("%s (the plans of every bucket, one arena sized by the largest)\n",
                compile::compare_planned_peak(compile::plans_steady_peak(plans, device), peak).c_str());
  }
  const double val_loss = validation_loss(model, val_sampler, o.micro_batch, device);
  log.eval(step, "validation_loss", val_loss);
  std::printf("tokens: %lld real, %lld with padding (overhead %.2fx)\n", (long long)tokens, (long long)padded,
              double(padded) / double(std::max<int64_t>(tokens, 1)));
  if (compiled) {
    std::printf("length buckets (steps per bucket):");
    for (const auto& [size, n] : compiled->bucket_calls()) std::printf(" %lld: %lld", (long long)size, (long long)n);
    std::printf("; plans traced %d, steps replayed %d, run eagerly %d\n", compiled->traces(), compiled->replays(),
                compiled->eager_calls());
    report_recompute(compiled, o);
  }
  if (pieces) {
    const compile::CompiledFunction& p = pieces->micro_batch_piece();
    std::printf("length buckets (micro-batches per bucket):");
    for (const auto& [size, n] : pieces->bucket_calls()) std::printf(" %lld: %lld", (long long)size, (long long)n);
    std::printf("; plans traced %d (%d for buckets, 1 for the optimizer), micro-batches replayed %d, run eagerly %d; "
                "one arena for all the plans: %s\n", pieces->traces(), p.traces(), p.replays(), p.eager_calls(),
                compile::bytes_str(pieces->arena_pool().bytes(device)).c_str());
  }
  std::printf("done: %lld steps in %.1fs, train loss %.4f, validation loss %.4f\n", (long long)step,
              seconds_since(start), last_loss, val_loss);
  if (step < o.steps)
    std::printf("stopped at step %lld (--stop-at); --resume %s continues the run\n", (long long)step, o.checkpoint.c_str());
  report_log(log, o.model + ", " + o.precision + ", lines");
  return 0;
}

}  // namespace reel::tools
