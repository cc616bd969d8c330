// What the training loops of `reel train` share (train_command.cpp: images and text windows;
// train_lines.cpp: text lines): the progress line, the compile options a run's flags make, the
// validation loss.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "compile/runtime/compile.h"
#include "compile/runtime/memory_budget.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tools/metrics_log.h"
#include "tools/train_options.h"

namespace reel::tools {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One line, rewritten in place on a terminal; a fresh line every `every` steps otherwise.
class Progress {
 public:
  Progress(int64_t total_steps, const char* unit) : total_(total_steps), unit_(unit), tty_(isatty(1)) {}
  void update(int64_t step, double loss, int64_t items, double lr) {
    double elapsed = seconds_since(start_);
    double rate = items / std::max(elapsed, 1e-9);
    double eta = step > 0 ? elapsed * double(total_ - step) / double(step) : 0;
    bool line_due = tty_ || step == total_ || step % std::max<int64_t>(1, total_ / 10) == 0;
    if (!line_due) return;
    std::printf("%sstep %5lld/%lld | loss %.4f | lr %.2e | %8.0f %s/s | ETA %3.0fs%s", tty_ ? "\r" : "",
                (long long)step, (long long)total_, loss, lr, rate, unit_, eta, tty_ ? "   " : "\n");
    std::fflush(stdout);
  }
  void end_line() {
    if (tty_) std::printf("\n");
  }

 private:
  int64_t total_;
  const char* unit_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
};

// A compiled step is traced without running (compile.h) wherever the optimizer can make its state
// before the first update (AdamW; not SGD with momentum, whose first calls then run eagerly): every
// step then runs the plan. Its first calls would otherwise run eagerly, at eager's footprint (above
// what a memory budget's plan was made to fit) and, in 16 bits, with other roundings than the plan's
// (which keeps some activations in 16 bits): a run resumed from a checkpoint would then take those
// eager steps where the run that never stopped replayed the plan, and end with other bits.
bool traces_without_running(const TrainOptions& o, const optim::Optimizer& opt);
// --compile MODE and --memory-limit as CompileOptions, traced without running as above.
compile::CompileOptions compile_options(const TrainOptions& o, const optim::Optimizer& opt);
// Under --memory-limit, what the compiled step recomputed to fit it (nothing otherwise).
void report_recompute(const std::optional<compile::CompiledFunction>& compiled, const TrainOptions& o);

// The loss of one batch of `batch_size` items drawn from a validation sampler (windows or lines).
template <typename Sampler>
double validation_loss(nn::Module& model, Sampler& sampler, int64_t batch_size, Device device) {
  NoGradGuard no_grad;
  auto v = sampler.next(batch_size, device);
  return nn::model_loss(model, v.inputs, v.targets).item();
}

// A step's line for --log: from an eager step's result, or from a compiled step's outputs {mean
// loss, grad norm, found_inf, scale, lr} (host reads).
MetricsLog::Step step_metrics(int64_t step, double loss, const optim::StepResult& r);
MetricsLog::Step step_metrics(int64_t step, const std::vector<Tensor>& out);

// Writes a step's line to the log, when it is on: `metrics()` (one of step_metrics, called only then,
// so a run without --log makes no extra host reads), with the step's items/s (`items` over the time
// since `start`) and the device's peak so far.
template <typename Metrics>
void log_step(MetricsLog& log, Metrics&& metrics, int64_t items, Clock::time_point start, Device device) {
  if (!log.enabled()) return;
  MetricsLog::Step line = metrics();
  line.items_per_s = double(items) / std::max(seconds_since(start), 1e-9);
  line.peak_mib = double(compile::peak_bytes(device)) / (1 << 20);
  log.step(line);
}

// The log's picture drawn at the end, its path printed (nothing without --log).
void report_log(MetricsLog& log, const std::string& title);

// Whether the run saves after optimizer step `step` (1-based): every --save-every steps, and at --stop-at.
inline bool save_due(const TrainOptions& o, int64_t step) {
  return !o.checkpoint.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.stop_at);
}

// --items lines (train_lines.cpp): `model` trained on a text's lines, one item per line.
int train_lines(const TrainOptions& o, nn::Gpt& model, optim::Optimizer& opt, Device device);

}  // namespace reel::tools
