// Helpers shared by the compiler's test files: reproducible token micro-batches, bit-exact comparison
// that counts NaN equal to NaN, a scoped kernel-cache directory, and the pieces of hand-made graphs.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compile/ir/graph.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"

namespace reel::testing_util {

// ---- hand-made graphs: a pass's cases written node by node ----

// A new buffer of g on the CPU: its id.
inline int graph_buffer(compile::Graph& g, compile::BufferKind kind, size_t nbytes) {
  compile::Buffer b;
  b.id = int(g.buffers.size());
  b.kind = kind;
  b.nbytes = nbytes;
  b.device = Device::cpu();
  g.buffers.push_back(b);
  return b.id;
}

// A new buffer of `floats` f32 values.
inline int graph_floats(compile::Graph& g, compile::BufferKind kind, int64_t floats) {
  return graph_buffer(g, kind, size_t(floats) * sizeof(float));
}

// A contiguous view of all of `buffer` in `shape`.
inline compile::TensorRef graph_ref(int buffer, const Shape& shape, DType dtype = DType::f32) {
  return compile::TensorRef{buffer, shape, contiguous_strides(shape), 0, dtype};
}

inline compile::Node graph_node(OpKind op, std::vector<compile::TensorRef> in, std::vector<compile::TensorRef> out,
                                bool in_place = false) {
  compile::Node n{op, Attrs(), {}, std::move(out), in_place, {}};
  for (compile::TensorRef& r : in) n.inputs.emplace_back(std::move(r));
  return n;
}
// With one output, as most nodes have.
inline compile::Node graph_node(OpKind op, std::vector<compile::TensorRef> in, compile::TensorRef out,
                                bool in_place = false) {
  return graph_node(op, std::move(in), std::vector<compile::TensorRef>{std::move(out)}, in_place);
}

// `accum` micro-batches of (B, T) token ids and targets below `vocab`, from a small LCG: token ids
// need no quality, only reproducibility.
inline std::vector<optim::MicroBatch> token_batches(int accum, int64_t B, int64_t T, int64_t vocab,
                                                    Device device = Device::cpu(), uint64_t seed = 11) {
  uint64_t state = seed;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int64_t((state >> 33) % uint64_t(vocab));
  };
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> x(size_t(B * T)), y(size_t(B * T));
    for (auto& v : x) v = next();
    for (auto& v : y) v = next();
    micro.push_back({tensor_i64(x, {B, T}, device), tensor_i64(y, {B, T}, device)});
  }
  return micro;
}

// The mean losses of `steps` training steps over `micro`: through the compiled step when given
// (compile::compile_train_step of the same optimizer and loss), else eagerly (optim::train_step).
inline std::vector<double> step_losses(optim::Optimizer& opt, const optim::LossFn& loss_fn,
                                       const std::vector<optim::MicroBatch>& micro, int steps,
                                       compile::CompiledFunction* compiled) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    if (compiled) {
      losses.push_back((*compiled)(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      losses.push_back(mean_loss.item());
    }
  }
  return losses;
}

// A benchmark model set up for a few training steps, as the compiled-step tests train it: its
// micro-batches (micro_batch x ACCUM accum, on `device`), AdamW (lr 1e-3, weight decay 0.01) set for
// ACCUM with clipping at 1.0, and the model's loss. Made under the caller's AutocastGuard, if any.
struct SmallTraining {
  nn::Workload w;
  std::vector<optim::MicroBatch> micro;
  std::unique_ptr<optim::AdamW> opt;
  optim::LossFn loss;

  // The model's parameters, then its buffers, as doubles.
  std::vector<std::vector<double>> state() const {
    std::vector<std::vector<double>> out;
    for (const auto& [name, p] : w.model->named_parameters()) out.push_back(p.to_vector<double>());
    for (const auto& [name, b] : w.model->named_buffers()) out.push_back(b.to_vector<double>());
    return out;
  }
};

inline SmallTraining small_training(const std::string& model, Device device, int64_t accum = 2, int64_t micro_batch = 2,
                                    bool grad_scaler = false) {
  SmallTraining t;
  t.w = nn::make_workload(model, device, accum, micro_batch);
  for (const auto& [x, y] : t.w.micro) t.micro.push_back({x, y});
  t.opt = std::make_unique<optim::AdamW>(t.w.model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
  t.opt->set_accum_steps(accum).set_max_grad_norm(1.0);
  if (grad_scaler) t.opt->set_grad_scaler(std::make_shared<optim::GradScaler>());
  nn::Module* m = t.w.model.get();
  t.loss = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  return t;
}

// Equal to the bit, NaN included (a planted overflow leaves NaN in losses or BatchNorm's running
// statistics, in eager as in PyTorch, and NaN != NaN).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// `steps` compiled training steps of small_training(model, device) under `precision` (in `mode`, by
// default reduce-overhead on a GPU and the default mode on the CPU) with `disabled_passes` off (and passes off by
// default in `enabled_passes` on): the losses, the state after, and the compiled function, whose last_plan() is the
// graph the passes left. What a pass's test runs with the pass on and off.
struct CompiledSteps {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;
  std::unique_ptr<compile::CompiledFunction> step;
  const compile::Plan* plan() const { return step ? step->last_plan() : nullptr; }
};

inline CompiledSteps compiled_steps(const std::string& model, Device device, const char* precision,
                                    std::vector<std::string> disabled_passes, size_t memory_limit = 0, int steps = 3,
                                    std::vector<std::string> enabled_passes = {}, bool grad_scaler = false,
                                    std::optional<compile::Mode> mode = std::nullopt) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  SmallTraining t = small_training(model, device, 2, 2, grad_scaler);
  compile::CompileOptions o(mode ? *mode : device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
  o.disabled_passes = std::move(disabled_passes);
  o.enabled_passes = std::move(enabled_passes);
  o.memory_limit = memory_limit;
  CompiledSteps r;
  r.step = std::make_unique<compile::CompiledFunction>(compile::compile_train_step(*t.opt, t.loss, o));
  r.losses = step_losses(*t.opt, t.loss, t.micro, steps, r.step.get());
  r.state = t.state();
  return r;
}

// How many of a graph's (a plan's) nodes run `op`.
inline size_t count_op(const compile::Graph& g, OpKind op) {
  return size_t(std::count_if(g.nodes.begin(), g.nodes.end(), [op](const compile::Node& n) { return n.op == op; }));
}
inline size_t count_op(const compile::Plan& p, OpKind op) { return count_op(p.graph(), op); }

// A layer norm's fused backward node: layer_norm_backward_add, or on a GPU the
// layer_norm_backward_partials that split_norm_param_sums.h makes of it (its sums then in a
// layer_norm_param_sums node after it). Both keep the fused op list and the inputs but the sums' own.
inline bool is_norm_backward_node(const compile::Node& n) {
  return n.op == OpKind::LayerNormBackwardAdd || n.op == OpKind::LayerNormBackwardPartials;
}

// A pass's A/B on a model's compiled steps: every pass on, and `pass` off.
struct PassAB {
  CompiledSteps on, off;
};
inline PassAB pass_on_and_off(const std::string& model, Device device, const char* precision, const std::string& pass,
                              bool grad_scaler = false) {
  PassAB r;
  r.off = compiled_steps(model, device, precision, {pass}, 0, 3, {}, grad_scaler);
  r.on = compiled_steps(model, device, precision, {}, 0, 3, {}, grad_scaler);
  return r;
}

// The configurations of the streams' same-bits GPU tests (compile/passes/side_stream.h,
// overlap_micro_batches.h): gpt-tiny and cnn-small, captured in a CUDA graph and launched one by one,
// fp32, bf16 and fp16; fn(model, mode, precision) under a SCOPED_TRACE that names them.
template <typename Fn>
void for_each_stream_test_config(Fn&& fn) {
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (compile::Mode mode : {compile::Mode::ReduceOverhead, compile::Mode::Default})
      for (const char* precision : {"fp32", "bf16", "fp16"}) {
        SCOPED_TRACE(std::string(model) + " " + precision + " " + compile::mode_name(mode));
        fn(model, mode, precision);
      }
}

// Whether two runs trained to the same bits: every loss, and every tensor of the state after.
inline bool same_training(const CompiledSteps& a, const CompiledSteps& b) {
  if (!same_bits(a.losses, b.losses) || a.state.size() != b.state.size()) return false;
  for (size_t i = 0; i < a.state.size(); ++i)
    if (!same_bits(a.state[i], b.state[i])) return false;
  return true;
}

// Points REEL_CACHE_DIR at a fresh directory for a test's lifetime.
class TempCacheDir {
 public:
  TempCacheDir() {
    char tmpl[] = "/tmp/reel-kernel-cache-XXXXXX";
    REEL_ASSERT(mkdtemp(tmpl) != nullptr, "mkdtemp failed");
    dir_ = tmpl;
    if (const char* old = std::getenv("REEL_CACHE_DIR")) old_ = old;
    setenv("REEL_CACHE_DIR", dir_.c_str(), 1);
  }
  ~TempCacheDir() {
    if (old_) setenv("REEL_CACHE_DIR", old_->c_str(), 1);
    else unsetenv("REEL_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::optional<std::string> old_;
};

// Two runs of one GPT's training, parameter by parameter (by name): the largest relative L2 difference
// and its parameter, with the key part of every qkv bias (the middle third) compared apart, as the
// largest absolute difference of its entries. That part's gradient is zero in exact arithmetic (one
// vector added to every key shifts all of a query's scores alike, which softmax ignores), so a step
// computes rounding noise for it (3e-10 against 2e-3 for the query and value parts in the tests' GPT
// of width 32), which AdamW, dividing by the gradient's own scale, turns into steps of up to about lr
// whose signs are that noise: two runs that sum in different orders (eager's GEMM calls and a
// compiled step's fused ones, each with the algorithm cuBLAS picks for it) walk those entries apart,
// by up to 2 lr x steps.
struct GptParamDiff {
  double worst_rel = 0;
  std::string worst_name;
  double key_bias_abs = 0;
};
inline GptParamDiff compare_gpt_params(nn::Module& a, nn::Module& b) {
  GptParamDiff d;
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return {INFINITY, "(a different parameter count)", 0};
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::string& name = pa[i].first;
    std::vector<double> x = pa[i].second.to_vector<double>(), y = pb[i].second.to_vector<double>();
    if (x.size() != y.size()) return {INFINITY, name, 0};
    const std::string suffix = "qkv.bias";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const size_t third = x.size() / 3;
      for (size_t k = third; k < 2 * third; ++k) {
        d.key_bias_abs = std::max(d.key_bias_abs, std::abs(x[k] - y[k]));
        x[k] = y[k] = 0;
      }
    }
    double num = 0, den = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      if (std::isnan(x[k]) || std::isnan(y[k])) return {INFINITY, name, d.key_bias_abs};
      num += (x[k] - y[k]) * (x[k] - y[k]);
      den += x[k] * x[k];
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    if (rel > d.worst_rel) d.worst_rel = rel, d.worst_name = name;
  }
  return d;
}

}  // namespace reel::testing_util
