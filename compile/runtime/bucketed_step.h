// BucketedTrainStep — a training step over micro-batches of token sequences of any length, each
// micro-batch padded to its own length bucket, cut into compiled pieces.
//
// compile_train_step (train_step.h) is one plan for the whole step, so the ACCUM micro-batches of a
// step share one input signature: with length buckets they are all padded to the bucket of the
// step's longest sequence. Here each micro-batch takes the bucket of its own longest:
//
//   N       = the step's real targets (not ignore_index), counted on the device     eager, ACCUM x 4 small kernels
//   for each micro-batch i (inputs x_i (B, T_i), targets y_i (B, T_i)):
//     piece(x_i, y_i, N)   x_i, y_i padded to the bucket of T_i (pad token, ignore_index);
//                          loss_i = loss_fn(x_i, y_i), a mean over its n_i real targets;
//                          backward of loss_i n_i / N (x the GradScaler's scale), accumulated in
//                          place into the parameters' gradients;
//                          returns loss_i n_i / N                                    one plan per bucket
//   optimizer()            unscale, inf check, clip, update, scaler update, gradients zeroed in place
//                                                                                    one plan
//   mean loss = sum_i loss_i n_i / N                                                 eager adds
//
// so the gradient is the mean over the step's real targets, whatever the padding and the buckets
// (tests/test_variable_length_step.cpp). Each piece is a compiled function (compile.h): one plan per
// bucket met, one for the optimizer, all placed in one arena (their calls never overlap: arena_pool.h),
// each one CUDA graph under reduce-overhead. A step launches ACCUM + 1 graphs and a few small
// kernels, and reads nothing on the host. The gradients live between the pieces: the step makes them
// (zeros) before its first call and sets the optimizer to zero them in place (set_zero_grad_to_none(false)).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "compile/runtime/compile.h"
#include "optim/train_step.h"

namespace reel::compile {

class BucketedTrainStep {
 public:
  // `opt` counts real targets (set_items_from_targets) with ACCUM = the micro-batches per call; the
  // buckets are the lengths (dim 1 of inputs and targets) to pad to, ascending; `options` gives the
  // mode, trace_without_running and the rest (its buckets and arenas are set here). Traced without
  // running, no piece's call runs eagerly (a new bucket's first call is traced in meta mode and served
  // by its plan): the optimizer's state is made here, before the first call.
  BucketedTrainStep(optim::Optimizer& opt, optim::LossFn loss_fn, std::vector<int64_t> buckets,
                    CompileOptions options = {}, int64_t pad_token = 0);

  // One optimizer step over `micro`; returns {mean loss over the real targets, grad norm, found_inf,
  // loss scale (1 without a scaler), lr}, 0-dim device tensors, as compile_train_step's plan does.
  std::vector<Tensor> operator()(const std::vector<optim::MicroBatch>& micro);

  const CompiledFunction& micro_batch_piece() const { return piece_; }
  const CompiledFunction& optimizer_piece() const { return optimizer_; }
  // Plans traced by both pieces; calls each bucket served (micro-batches, not steps).
  int traces() const { return piece_.traces() + optimizer_.traces(); }
  const std::map<int64_t, int64_t>& bucket_calls() const { return piece_.bucket_calls(); }
  const ArenaPool& arena_pool() const { return *arenas_; }
  // The plans of both pieces (every bucket met, and the optimizer's), for plans_steady_peak.
  std::vector<const Plan*> plans() const;

 private:
  optim::Optimizer* opt_;
  std::shared_ptr<ArenaPool> arenas_;
  CompiledFunction piece_, optimizer_;
};

}  // namespace reel::compile
