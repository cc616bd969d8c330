// `reel train`: trains a model end to end with micro-batches and gradient accumulation, printing a
// live progress line (step, loss, items/s, ETA), the test accuracy (image models) or validation loss
// and a generated sample (text models), and a final summary.
//
// The step is MODELS.md's: for each of ACCUM micro-batches, loss = model_loss(model(x), y) and
// backward(opt.scale_loss(loss)); then opt.micro_step() unscales, clips, steps AdamW, advances the
// schedule and zeroes the gradients at the accumulation boundary. With --compile MODE the ACCUM
// micro-batches of a step go through compile::compile_train_step instead: warm-up, trace, then the
// plan replayed (one CUDA graph under reduce-overhead); an epoch's tail runs eagerly.
//
// With --effective-batch N --memory-budget SIZE the micro-batch is chosen first: the step is planned
// in meta mode for micro-batches 1, 2, 4, ..., N (compile/runtime/memory_budget.h; compiled, also with the
// recomputation that makes a micro-batch fit), the table printed, and training runs with the fastest by
// estimate that fits (its memory limit set when it recomputes) and ACCUM = ceil(N / micro-batch). When that micro-batch
// does not divide N, each step's last micro-batch is smaller and the optimizer counts items (N per
// step); a compiled step then weighs each micro-batch by its leading dim. After the first step (the
// first replay when compiled) the planned peak is set beside the allocator's measured one, with a
// warning past 5%. An out-of-memory error during training is rethrown with the planner's advice.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "compile/runtime/describe.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "data/data.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "parallel/data_parallel.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "tensor/file_io.h"
#include "tools/commands.h"
#include "tools/train_checkpoint.h"
#include "tools/train_common.h"
#include "tools/train_options.h"
#include "tools/train_trace.h"

namespace reel::tools {
namespace {

// Channels of fashion_cnn's first conv: 16 trains an epoch of Fashion-MNIST in seconds on two cores
// and passes 85% test accuracy in a few epochs.
constexpr int64_t kFashionWidth = 16;

Device pick_device(const std::string& name) {
  if (name == "auto") return cuda::is_available() ? Device::cuda(0) : Device::cpu();
  Device d = Device::parse(name);
  REEL_CHECK(d.is_cpu() || cuda::is_available(), "train: --device ", name, " asked for, but ",
             cuda::unavailable_reason());
  return d;
}

// The mean loss of an optimizer step's micro-batches, summed on the device and read once per step.
class StepLoss {
 public:
  void add(const Tensor& loss) {
    sum_ = sum_.defined() ? sum_ + loss.detach() : loss.detach();
    ++count_;
  }
  double take() {
    double mean = sum_.item() / double(count_);
    sum_ = Tensor();
    count_ = 0;
    return mean;
  }

 private:
  Tensor sum_;
  int64_t count_ = 0;
};

// A step's micro-batches: with --effective-batch, the planner's micro-batch split of it (whose last
// micro-batch may be smaller); otherwise ACCUM micro-batches of --micro-batch.
optim::AccumulationSplit step_split(const TrainOptions& o) {
  if (o.effective_batch > 0) return optim::split_accumulation(o.effective_batch, o.micro_batch);
  return {o.micro_batch, o.accum, o.micro_batch};
}
// A planned micro-batch that does not divide the effective batch: each step ends with a smaller one.
bool counts_items(const TrainOptions& o) { return step_split(o).uneven(); }
// Items in micro-batch `index` (0-based) of a step.
int64_t micro_batch_size(const TrainOptions& o, int64_t index) { return step_split(o).micro_batch_size(index); }

std::unique_ptr<optim::AdamW> make_optimizer(const TrainOptions& o, nn::Module& model, int64_t total_steps) {
  auto opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions(o.lr));
  // With --effective-batch the optimizer counts items when the last micro-batch is smaller.
  if (o.effective_batch > 0) opt->set_effective_batch(o.effective_batch, o.micro_batch);
  else opt->set_accum_steps(o.accum).set_micro_batch(o.micro_batch);
  opt->set_max_grad_norm(o.clip);
  if (autocast_policy().needs_grad_scaler()) opt->set_grad_scaler(std::make_shared<optim::GradScaler>());
  if (o.schedule == "cosine")
    opt->set_schedule(std::make_shared<optim::LinearWarmupCosine>(std::min(o.warmup, total_steps / 4), total_steps,
                                                                   o.lr * 0.05));
  return opt;
}

// One micro-batch eagerly: forward, backward of the scaled loss, and the optimizer's micro_step
// (which, at the accumulation boundary, unscales, clips, updates and zeroes).
optim::StepResult eager_micro_batch(nn::Module& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                                    StepLoss& step_loss, int64_t items = -1) {
  Tensor loss = nn::model_loss(model, x, y);
  opt.scale_loss(loss, items).backward();
  step_loss.add(loss);
  return opt.micro_step();
}

// The compiled step of --compile MODE (none: eager), with the same loss and optimizer.
std::optional<compile::CompiledFunction> compiled_step(const TrainOptions& o, nn::Module& model,
                                                       optim::Optimizer& opt) {
  if (o.compile == "none") return std::nullopt;
  nn::Module* m = &model;
  compile::CompileOptions options = compile_options(o, opt);
  return compile::compile_train_step(
      opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); }, options);
}

// What the planner needs: micro-batches of meta inputs shaped as the data's (one item: `input_item`,
// `target_item`), the loss, and a fresh optimizer configured as the run's, whose state it plans.
compile::BudgetSetup budget_setup(const TrainOptions& o, nn::Module& model, Device device, Shape input_item,
                                  DType input_dtype, Shape target_item) {
  compile::BudgetSetup s;
  nn::Module* m = &model;
  s.device = device;
  s.effective_batch = o.effective_batch;
  if (o.compile != "none") s.compile_mode = compile::parse_mode(o.compile);
  s.memory_limit = o.memory_limit;  // the user's own limit, if any: then no other is tried
  s.loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  // The planner sets each candidate's accumulation itself (compile::trace_step_graph), and o's
  // micro-batch is not chosen yet: the factory's copy leaves --effective-batch out, so that
  // make_optimizer does not split it by a micro-batch that may exceed it.
  TrainOptions unplanned = o;
  unplanned.effective_batch = 0;
  s.make_optimizer = [unplanned, m]() -> std::unique_ptr<optim::Optimizer> {
    return make_optimizer(unplanned, *m, 1);
  };
  s.trace_without_running = traces_without_running(o, *s.make_optimizer());
  s.make_micro = [=](int64_t B, int64_t count) {
    Shape xs{B}, ys{B};
    xs.insert(xs.end(), input_item.begin(), input_item.end());
    ys.insert(ys.end(), target_item.begin(), target_item.end());
    std::vector<optim::MicroBatch> micro;
    for (int64_t i = 0; i < count; ++i)
      micro.push_back({zeros(xs, {input_dtype, device}), zeros(ys, {DType::i64, device})});
    return micro;
  };
  return s;
}

// What the memory budget decided, for the out-of-memory advice and the check after the first step.
struct BudgetRun {
  std::string oom_advice;
  size_t planned_peak = 0;  // 0: no budget was asked for
};

// Plans the candidates, prints the table and sets o's micro-batch, ACCUM and (compiled, when the
// choice recomputes) memory limit from the choice.
BudgetRun choose_micro_batch(TrainOptions& o, const compile::BudgetSetup& setup) {
  compile::BudgetChoice c =
      compile::pick_micro_batch(compile::plan_candidates_for(setup, o.memory_budget), o.effective_batch, o.memory_budget);
  std::printf("%s", compile::budget_table(c).c_str());
  o.micro_batch = c.choice().micro_batch;
  o.accum = c.choice().accum;
  if (c.choice().memory_limit) o.memory_limit = c.choice().memory_limit;
  return {compile::budget_advice(c) + "; the step took more than planned (per-call workspaces, "
          "fragmentation): lower --memory-budget",
          c.choice().steady_peak()};
}

// The first training step whose peak is the steady state's: the second eager step, the second replay
// of a plan traced after two eager calls, or the third call of one traced without running (call 0
// traces and runs the plan, 1 captures its CUDA graph, 2 replays it).
int64_t first_steady_step(const TrainOptions& o, const optim::Optimizer& opt) {
  if (o.compile == "none") return 1;
  return traces_without_running(o, opt) ? 2 : 3;
}

// The plan's peak against the allocator's after the first step in the steady state the plan
// describes: the second eager step (the optimizer's state appears at the end of the first), or the
// second replay when compiled (call 0 warms up, 1 traces, 2 captures the CUDA graph as it first runs
// the plan, and the capture's own allocations are gone by call 3; first_steady_step). The plan counts the model's
// parameters but not what else the process held before training (a dataset in host memory), so that
// is taken off the measurement.
class PeakCheck {
 public:
  PeakCheck(size_t planned, const nn::Module& model, Device device, int64_t steady_step)
      : planned_(planned), device_(device), step_(steady_step) {
    if (!planned_) return;
    size_t model_bytes = 0;
    for (const Tensor& t : model.parameters()) model_bytes += compile::allocation_bytes(device, t.nbytes());
    for (const Tensor& t : model.buffers()) model_bytes += compile::allocation_bytes(device, t.nbytes());
    const size_t before = compile::allocated_bytes(device);
    other_ = before > model_bytes ? before - model_bytes : 0;
  }
  // Call before and after each training step (not around evaluation, which the plan does not cover);
  // the comparison prints once, at step_. The allocator counts blocks when the host asks and frees
  // them, so no synchronisation is needed.
  void before_step(int64_t) {
    if (planned_) compile::reset_peak_bytes(device_);
  }
  void after_step(int64_t step) {
    if (!planned_) return;
    const size_t peak = compile::peak_bytes(device_);
    steps_peak_ = std::max(steps_peak_, peak);
    if (step == step_)
      std::printf("%s\n", compile::compare_planned_peak(planned_, peak > other_ ? peak - other_ : 0).c_str());
  }
  // The most the allocator held during any training step, against the budget.
  void report_run(size_t budget) const {
    if (!planned_) return;
    const size_t peak = steps_peak_ > other_ ? steps_peak_ - other_ : 0;
    std::printf("memory: the training steps' peak on %s was %s allocated (besides %s held before training), "
                "budget %s: %s\n", device_.str().c_str(), compile::bytes_str(peak).c_str(),
                compile::bytes_str(other_).c_str(), compile::bytes_str(budget).c_str(),
                peak <= budget ? "within" : "EXCEEDED");
  }

 private:
  size_t planned_ = 0, other_ = 0, steps_peak_ = 0;
  Device device_;
  int64_t step_ = 0;
};

// One loader batch of the effective batch cut into the step's micro-batches (the last may be smaller);
// slices along dim 0 are views, no copy.
std::vector<optim::MicroBatch> split_batch(const data::Batch& b, const TrainOptions& o) {
  std::vector<optim::MicroBatch> micro;
  for (int64_t start = 0, i = 0; start < b.size(); ++i) {
    int64_t end = std::min(b.size(), start + micro_batch_size(o, i));
    micro.push_back({b.inputs.slice(0, start, end), b.targets.slice(0, start, end), end - start});
    start = end;
  }
  return micro;
}

// Fraction of `data` whose arg-max logit is the label, in batches of `batch` (the micro-batch under a
// memory budget: without gradients a forward holds less than a training micro-batch).
double accuracy(nn::Module& model, const data::ImageDataset& test, Device device, int64_t batch) {
  model.eval();
  NoGradGuard no_grad;
  data::DataLoader loader(test, data::DataLoaderOptions().with_batch_size(batch).with_shuffle(false).with_device(device));
  int64_t correct = 0;
  for (const data::Batch& b : loader) {
    std::vector<float> logits = model.forward(b.inputs).to_vector<float>();
    std::vector<int64_t> labels = b.targets.to_vector<int64_t>();
    int64_t C = int64_t(logits.size() / labels.size());
    for (size_t i = 0; i < labels.size(); ++i) {
      const float* row = logits.data() + i * C;
      correct += int64_t(std::max_element(row, row + C) - row) == labels[i];
    }
  }
  model.train();
  return double(correct) / double(test.size());
}

// Synthetic images (the image benchmark models have no CIFAR here): each of 10 classes has a fixed
// random prototype and an image is 0.5 * its class's prototype plus unit noise, so there is something to
// learn and the loss falls, while the step still measures the real model's compute. side: 32, or 64
// for yolov8n-cls (nn::benchmark_image_side).
data::ImageDataset random_images(int64_t n, uint64_t seed, int64_t side) {
  Generator protos_gen(12345), g(seed);
  const int64_t pixels = 3 * side * side;
  Tensor protos = randn({10, pixels}, {}, &protos_gen);
  std::vector<int64_t> labels;
  for (double u : uniform({n}, 0, 10, {DType::f64}, &g).to_vector<double>()) labels.push_back(std::min<int64_t>(9, int64_t(u)));
  data::ImageDataset d;
  d.labels = tensor_i64(labels, {n});
  d.images = (embedding(protos, d.labels) * 0.5 + randn({n, pixels}, {}, &g)).reshape({n, 3, side, side});
  d.num_classes = 10;
  return d;
}

// --init-from: the whole state_dict, strictly (load_state_dict checks every key, shape and dtype
// before it copies anything), into the model as built, before it moves to the device.
void init_from(nn::Module& model, const std::string& path) {
  if (path.empty()) return;
  nn::load_weights(model, path);  // safetensors or REELSD01, by the file's first bytes
  std::printf("init: %zu tensors loaded from %s (%zu parameters, %zu buffers)\n", model.named_state().size(),
              path.c_str(), model.named_parameters().size(), model.named_buffers().size());
}

int train_images(TrainOptions o, Device device, BudgetRun& budget) {
  Generator gen(o.seed);
  std::shared_ptr<nn::Module> model;
  data::ImageDataset train, test;
  if (o.dataset == "fashion-mnist") {
    REEL_CHECK(o.model == "fashion-cnn", "train: fashion-mnist images are 1x28x28; use --model fashion-cnn");
    model = nn::fashion_cnn(&gen, kFashionWidth);
    train = data::load_fashion_mnist(data::fashion_mnist_dir(), true, o.limit);
    test = data::load_fashion_mnist(data::fashion_mnist_dir(), false);
  } else {
    REEL_CHECK(o.dataset == "random" && o.model != "fashion-cnn", "train: model ", o.model, " with dataset ",
               o.dataset, " is not a known pairing (fashion-cnn trains on fashion-mnist; cnn-small, "
               "resnet18-cifar, vit-tiny and yolov8n-cls on random images; the GPTs on --dataset text (a file or "
               "the fortunes) or random tokens)");
    model = nn::make_benchmark_model(o.model, &gen);
    const int64_t side = nn::benchmark_image_side(o.model);
    train = random_images(o.limit > 0 ? o.limit : 2048, o.seed, side);
    test = random_images(512, o.seed + 7, side);
  }
  init_from(*model, o.init_from);
  model->to(device);
  if (o.effective_batch > 0) {
    Shape item(train.images.shape().begin() + 1, train.images.shape().end());
    budget = choose_micro_batch(o, budget_setup(o, *model, device, item, DType::f32, {}));
  }
  // With a smaller last micro-batch, the loader yields whole effective batches and split_batch cuts them.
  const bool split = counts_items(o);
  data::DataLoader loader(train, data::DataLoaderOptions()
                                     .with_batch_size(split ? o.effective_batch : o.micro_batch)
                                     .with_seed(o.seed)
                                     .with_shard(dist::rank(), dist::world_size())
                                     .with_device(device));
  const int64_t step_items = split ? o.effective_batch : o.micro_batch * o.accum;
  // A run that would take no optimizer step is an error now, not a "final loss 0" at the end.
  REEL_CHECK(loader.items_per_epoch() >= step_items || o.remainder == "step", "train: an epoch has ",
             loader.items_per_epoch(), " items", dist::world_size() > 1 ? " on this rank" : "",
             ", fewer than one optimizer step takes (", step_items,
             "): no step would be taken. Lower --micro-batch or --accum, raise --limit, or use --remainder step");
  const int64_t steps_per_epoch =
      std::max<int64_t>(1, split ? loader.items_per_epoch() / o.effective_batch : loader.num_batches() / o.accum);
  auto opt = make_optimizer(o, *model, o.epochs * steps_per_epoch);
  dist::prepare_training(*model, *opt, o.sync_bn);  // rank 0's parameters; gradients all-reduced once a step
  std::printf("model %s: %lld parameters on %s, %s | data %s: %lld train, %lld test\n", o.model.c_str(),
              (long long)model->num_parameters(), device.str().c_str(), autocast_policy().name(), o.dataset.c_str(),
              (long long)train.size(), (long long)test.size());
  opt->print_setup(std::cout);
  auto policy = o.remainder == "step" ? optim::RemainderPolicy::Step : optim::RemainderPolicy::Drop;
  // Before the compiled step: a step traced without running has its optimizer make its state there,
  // which the plan counts.
  PeakCheck peak_check(budget.planned_peak, *model, device, first_steady_step(o, *opt));
  // Image models save and resume at epoch ends: an epoch's order comes from (seed, epoch) alone.
  int64_t first_epoch = 0;
  if (!o.resume.empty()) {
    first_epoch = resume_training(o.resume, *model, *opt, o).epochs;
    std::printf("resume: epoch %lld of %lld from %s\n", (long long)first_epoch, (long long)o.epochs, o.resume.c_str());
  }
  const int64_t last_epoch = o.stop_at > 0 ? std::min(o.stop_at, o.epochs) : o.epochs;
  MetricsLog log(dist::rank() == 0 ? o.log : "", !o.resume.empty());
  std::optional<compile::CompiledFunction> compiled = compiled_step(o, *model, *opt);
  int64_t steps_run = 0;  // over all epochs, for peak_check
  Clock::time_point start = Clock::now();
  double acc = 0, last_loss = 0;
  int64_t epochs_done = first_epoch;
  for (int64_t epoch = first_epoch; epoch < last_epoch; ++epoch) {
    loader.set_epoch(epoch);
    Progress progress(steps_per_epoch, "img");
    int64_t items = 0, step = 0, step_items = 0;
    Clock::time_point step_start = Clock::now();
    // After each optimizer step: its line in the log (numbered over all epochs), then the next step's clock.
    auto finish_step = [&](auto metrics) {
      log_step(log, metrics, step_items, step_start, device);
      step_items = 0;
      step_start = Clock::now();
    };
    const int64_t run_step = first_epoch * steps_per_epoch;  // + steps_run: the step just taken
    StepLoss step_loss;
    std::vector<optim::MicroBatch> pending;  // the compiled path's micro-batches of the next step
    for (const data::Batch& b : loader) {
      items += b.size();
      step_items += b.size();
      if (split && compiled && b.size() == o.effective_batch) {
        peak_check.before_step(steps_run);
        std::vector<Tensor> out = (*compiled)(compile::flatten_micro(split_batch(b, o)));
        peak_check.after_step(steps_run++);
        last_loss = out[0].item();
        progress.update(++step, last_loss, items, out[4].item());
        finish_step([&] { return step_metrics(run_step + steps_run, out); });
        continue;
      }
      if (split) {
        optim::StepResult r;
        peak_check.before_step(steps_run);
        for (const optim::MicroBatch& m : split_batch(b, o))
          r = eager_micro_batch(*model, *opt, m.inputs, m.targets, step_loss, m.items);
        if (!r.stepped) continue;  // an epoch's short last batch: finish_epoch's remainder policy
        peak_check.after_step(steps_run++);
        last_loss = step_loss.take();
        progress.update(++step, last_loss, items, r.lr);
        finish_step([&] { return step_metrics(run_step + steps_run, last_loss, r); });
        continue;
      }
      if (compiled && b.size() == o.micro_batch) {
        pending.push_back({b.inputs, b.targets});
        if (int64_t(pending.size()) < o.accum) continue;
        peak_check.before_step(steps_run);
        std::vector<Tensor> out = (*compiled)(compile::flatten_micro(pending));
        peak_check.after_step(steps_run++);
        pending.clear();
        last_loss = out[0].item();
        progress.update(++step, last_loss, items, out[4].item());
        finish_step([&] { return step_metrics(run_step + steps_run, out); });
        continue;
      }
      if (pending.empty() && opt->pending_micro_batches() == 0) peak_check.before_step(steps_run);
      for (const optim::MicroBatch& p : pending) eager_micro_batch(*model, *opt, p.inputs, p.targets, step_loss);
      pending.clear();
      optim::StepResult r = eager_micro_batch(*model, *opt, b.inputs, b.targets, step_loss);
      if (!r.stepped) continue;
      peak_check.after_step(steps_run++);
      last_loss = step_loss.take();
      progress.update(++step, last_loss, items, r.lr);
      finish_step([&] { return step_metrics(run_step + steps_run, last_loss, r); });
    }
    // An epoch's tail that does not fill a step runs eagerly, so the remainder policy applies to it.
    for (const optim::MicroBatch& p : pending) eager_micro_batch(*model, *opt, p.inputs, p.targets, step_loss);
    opt->finish_epoch(policy);
    progress.end_line();
    epochs_done = epoch + 1;
    // At the epoch's end, before the evaluation (which draws nothing a later epoch reads).
    if (!o.checkpoint.empty() && dist::rank() == 0)
      save_training(o.checkpoint, *model, *opt, RunPosition{0, epochs_done, 0, default_generator().offset()}, o);
    acc = accuracy(*model, test, device, o.effective_batch > 0 ? o.micro_batch : 500);
    log.eval(first_epoch * steps_per_epoch + steps_run, "test_accuracy", acc);
    std::printf("epoch %lld: test accuracy %.2f%% (%.0fs elapsed)\n", (long long)epoch + 1, 100 * acc,
                seconds_since(start));
  }
  peak_check.report_run(o.memory_budget);
  report_recompute(compiled, o);
  std::printf("done: %lld epochs in %.1fs, final loss %.4f, test accuracy %.2f%%\n", (long long)epochs_done,
              seconds_since(start), last_loss, 100 * acc);
  if (epochs_done < o.epochs)
    std::printf("stopped at epoch %lld (--stop-at); --resume %s continues the run\n", (long long)epochs_done,
                o.checkpoint.c_str());
  report_log(log, o.model + ", " + o.precision);
  if (!o.trace.empty()) {  // one more step, traced, on the first batches of the last epoch's order
    std::vector<optim::MicroBatch> micro;
    if (split) micro = split_batch(loader.batch(0), o);
    for (int64_t i = 0; !split && i < std::min(o.accum, loader.num_batches()); ++i) {
      data::Batch b = loader.batch(i);
      micro.push_back({b.inputs, b.targets});
    }
    write_train_trace(o.trace, compiled, *model, *opt, micro, device);
  }
  return 0;
}

// Bytes as a terminal can show them: printable ASCII, newlines and tabs as they are, anything else
// (control characters, stray UTF-8 bytes of an early model) as \xNN.
std::string printable(const std::string& bytes) {
  std::string out;
  char hex[8];
  for (unsigned char c : bytes) {
    if ((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t') {
      out.push_back(char(c));
      continue;
    }
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

// Samples `n` bytes from the model, starting from a newline, with temperature 0.8.
std::string sample_text(nn::Gpt& model, int64_t n, Device device, uint64_t seed) {
  model.eval();
  NoGradGuard no_grad;
  Generator gen(seed);
  std::vector<int64_t> ctx{'\n'};
  std::string out;
  const int64_t T = model.config().block_size;
  for (int64_t i = 0; i < n; ++i) {
    int64_t start = std::max<int64_t>(0, int64_t(ctx.size()) - T);
    std::vector<int64_t> window(ctx.begin() + start, ctx.end());
    Tensor idx = tensor_i64(window, {1, int64_t(window.size())}, device);
    Tensor logits = select(select(model.forward(idx), 0, 0), 0, -1);  // (256,) of the last position
    std::vector<double> p = softmax(logits.to(DType::f64) * (1.0 / 0.8), 0).to_vector<double>();
    double u = rand({}, {DType::f64}, &gen).item(), acc = 0;
    int64_t next = 255;
    for (int64_t v = 0; v < 256; ++v)
      if ((acc += p[v]) > u) {
        next = v;
        break;
      }
    ctx.push_back(next);
    out.push_back(char(next));
  }
  model.train();
  return out;
}

// Uniform random byte tokens (--dataset random for a GPT): nothing to learn beyond the uniform
// distribution (the loss falls to ln 256 = 5.545 and stays), while the step measures the model's
// compute on MODELS.md's shapes without a corpus.
Tensor random_tokens(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> bytes;
  bytes.reserve(size_t(n));
  for (double u : uniform({n}, 0, 256, {DType::f64}, &g).to_vector<double>()) bytes.push_back(std::min<int64_t>(255, int64_t(u)));
  return tensor_i64(bytes, {n});
}

int train_text(TrainOptions o, Device device, BudgetRun& budget) {
  Generator gen(o.seed);
  auto model = o.model == "gpt-small" ? nn::gpt_small(&gen) : nn::gpt_tiny(&gen);
  REEL_CHECK(o.model == "gpt-tiny" || o.model == "gpt-small", "train: unknown model ", o.model);
  init_from(*model, o.init_from);
  model->to(device);
  if (o.effective_batch > 0) {
    const int64_t T = model->config().block_size;
    budget = choose_micro_batch(o, budget_setup(o, *model, device, {T}, DType::i64, {T}));
  }
  if (o.items == "lines") {
    auto opt = make_optimizer(o, *model, o.steps);
    dist::prepare_training(*model, *opt, o.sync_bn);
    std::printf("model %s: %lld parameters on %s, %s | text lines\n", o.model.c_str(),
                (long long)model->num_parameters(), device.str().c_str(), autocast_policy().name());
    opt->print_setup(std::cout);
    return train_lines(o, *model, *opt, device);
  }
  const bool random = o.dataset == "random";
  Tensor tokens = random ? random_tokens(int64_t(1) << 20, o.seed)
                  : o.text_path.empty() ? data::load_fortunes() : data::load_text_bytes(o.text_path);
  data::TextSplit split = data::split_text(tokens, 0.05);
  const int64_t T = model->config().block_size;
  // Each rank draws its own windows.
  data::TextSampler sampler(split.train, T, o.seed + uint64_t(dist::rank())), val_sampler(split.val, T, o.seed + 1);
  auto opt = make_optimizer(o, *model, o.steps);
  dist::prepare_training(*model, *opt, o.sync_bn);
  std::printf("model %s: %lld parameters on %s, %s | %s: %lld bytes\n", o.model.c_str(),
              (long long)model->num_parameters(), device.str().c_str(), autocast_policy().name(),
              random ? "random tokens" : "text", (long long)tokens.numel());
  opt->print_setup(std::cout);
  Progress progress(o.steps, "tok");
  Clock::time_point start = Clock::now();
  int64_t items = 0, step = 0, micro_index = 0;
  if (!o.resume.empty()) {
    const RunPosition at = resume_training(o.resume, *model, *opt, o);
    step = at.steps;
    sampler.set_draws(at.sampler_draws);
    std::printf("resume: step %lld of %lld from %s\n", (long long)step, (long long)o.steps, o.resume.c_str());
  }
  const int64_t last_step = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;
  auto position = [&] { return RunPosition{step, 0, sampler.draws(), default_generator().offset()}; };
  MetricsLog log(dist::rank() == 0 ? o.log : "", !o.resume.empty());
  double last_loss = 0;
  StepLoss step_loss;
  PeakCheck peak_check(budget.planned_peak, *model, device, first_steady_step(o, *opt));
  std::optional<compile::CompiledFunction> compiled = compiled_step(o, *model, *opt);
  Clock::time_point step_start = Clock::now();
  int64_t step_items = 0;
  // After each optimizer step: its line in the log, and a checkpoint when one is due.
  auto finish_step = [&](auto metrics) {
    log_step(log, metrics, step_items, step_start, device);
    if (save_due(o, step) && dist::rank() == 0) save_training(o.checkpoint, *model, *opt, position(), o);
    step_start = Clock::now();
    step_items = 0;
  };
  while (step < last_step) {
    if (compiled) {
      std::vector<optim::MicroBatch> micro;
      for (int64_t i = 0; i < o.accum; ++i) {
        data::TextBatch b = sampler.next(micro_batch_size(o, i), device);
        micro.push_back({b.inputs, b.targets});
        items += b.inputs.numel();
        step_items += b.inputs.numel();
      }
      peak_check.before_step(step);
      std::vector<Tensor> out = (*compiled)(compile::flatten_micro(micro));
      peak_check.after_step(step);
      last_loss = out[0].item();
      progress.update(++step, last_loss, items, out[4].item());
      finish_step([&] { return step_metrics(step, out); });
      continue;
    }
    const int64_t B = micro_batch_size(o, micro_index);
    data::TextBatch b = sampler.next(B, device);
    items += b.inputs.numel();
    step_items += b.inputs.numel();
    if (micro_index == 0) peak_check.before_step(step);
    optim::StepResult r = eager_micro_batch(*model, *opt, b.inputs, b.targets, step_loss, counts_items(o) ? B : -1);
    micro_index = r.stepped ? 0 : micro_index + 1;
    if (!r.stepped) continue;
    peak_check.after_step(step);
    last_loss = step_loss.take();
    progress.update(++step, last_loss, items, r.lr);
    finish_step([&] { return step_metrics(step, last_loss, r); });
  }
  progress.end_line();
  // The end's checkpoint (one writer), unless this step's save just wrote it.
  if (!o.checkpoint.empty() && dist::rank() == 0 && !save_due(o, step))
    save_training(o.checkpoint, *model, *opt, position(), o);
  const double val_loss = validation_loss(*model, val_sampler, o.micro_batch, device);
  log.eval(step, "validation_loss", val_loss);
  peak_check.report_run(o.memory_budget);
  report_recompute(compiled, o);
  std::printf("done: %lld steps in %.1fs, train loss %.4f, validation loss %.4f\n", (long long)step,
              seconds_since(start), last_loss, val_loss);
  if (step < o.steps) std::printf("stopped at step %lld (--stop-at); --resume %s continues the run\n", (long long)step,
                                  o.checkpoint.c_str());
  else std::printf("sample:\n%s\n", printable(sample_text(*model, o.sample_bytes, device, o.seed)).c_str());
  report_log(log, o.model + ", " + o.precision);
  if (!o.trace.empty()) {  // one more step, traced, on the next windows
    std::vector<optim::MicroBatch> micro;
    for (int64_t i = 0; i < o.accum; ++i) {
      data::TextBatch b = sampler.next(micro_batch_size(o, i), device);
      micro.push_back({b.inputs, b.targets, counts_items(o) ? b.inputs.size(0) : -1});
    }
    write_train_trace(o.trace, compiled, *model, *opt, micro, device);
  }
  return 0;
}

}  // namespace

int train_command(int argc, char** argv) {
  if (argc > 0 && (std::string(argv[0]) == "--help" || std::string(argv[0]) == "-h")) {
    std::printf("%s", train_usage());
    return 0;
  }
  TrainOptions o = parse_train_options(argc, argv);
  // A checkpoint that cannot be written is an error now, not after the whole run.
  if (!o.checkpoint.empty()) check_checkpoint_dir(o.checkpoint);
  // Under mpirun: MPI started, this rank's GPU (its local rank), output from rank 0 only.
  Device device = dist::setup_training(pick_device(o.device), o.compile);
  // matmul and conv inputs run in the policy's dtype inside the whole run (nn's layers read it);
  // master weights, norms, softmax and the loss stay f32.
  AutocastGuard amp(PrecisionPolicy::parse(o.precision));
  BudgetRun budget{"to choose a micro-batch that fits, reel train --effective-batch " +
                       std::to_string(o.micro_batch * o.accum) +
                       " --memory-budget SIZE plans the step for each candidate without running it"};
  try {
    const bool gpt = o.model.rfind("gpt", 0) == 0;
    if (o.dataset == "text" || (gpt && o.dataset == "random")) return train_text(o, device, budget);
    return train_images(o, device, budget);
  } catch (const Error& e) {
    if (!compile::is_out_of_memory(e)) throw;
    throw Error(std::string(e.what()) + "\n" + budget.oom_advice);
  }
}

}  // namespace reel::tools
