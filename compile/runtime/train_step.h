// MODELS.md's training step as a compiled function: every micro-batch's forward and backward, the
// unscale and inf check, clipping, the optimizer update and the scaler update, in one plan (one CUDA
// graph under reduce-overhead).
//
//   inputs   x_0, y_0, x_1, y_1, ..., x_{A-1}, y_{A-1}     (A = the optimizer's ACCUM)
//   outputs  mean loss over the micro-batches, grad norm (before clipping), found_inf, loss scale,
//            the lr the update used (all 0-dim device tensors; the scale is 1 without a GradScaler)
// The optimizer must keep its lr, step count and scaler state on the device (reel's do), and the
// loss function must be the same on every call. An optimizer that counts items
// (set_items_per_step) weighs each micro-batch by its inputs' leading dim, so a smaller last
// micro-batch (a remainder) compiles too, as a plan of its own.
#pragma once
#include "compile/runtime/compile.h"
#include "optim/train_step.h"

namespace reel::compile {

CompiledFunction compile_train_step(optim::Optimizer& opt, optim::LossFn loss_fn, CompileOptions options = {});

// The inputs of a compiled step, flattened from micro-batches.
std::vector<Tensor> flatten_micro(const std::vector<optim::MicroBatch>& micro);

}  // namespace reel::compile
