// BatchNorm2d, GroupNorm, LayerNorm (formulas in norm_layers.h).
#include "nn/norm_layers.h"

#include "distributed/sync_batch_norm.h"

namespace reel::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum)
    : BatchNorm2d("BatchNorm2d", channels, eps, momentum) {}

BatchNorm2d::BatchNorm2d(std::string type_name, int64_t channels, double eps, double momentum)
    : Module(std::move(type_name)), channels_(channels), eps_(eps), momentum_(momentum) {
  REEL_CHECK(channels > 0, "BatchNorm2d: channels must be positive, got ", channels);
  REEL_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm2d: momentum must be in [0, 1], got ", momentum);
  weight_ = &register_parameter("weight", ones({channels}));
  bias_ = &register_parameter("bias", zeros({channels}));
  running_mean_ = &register_buffer("running_mean", zeros({channels}));
  running_var_ = &register_buffer("running_var", ones({channels}));
  num_batches_tracked_ = &register_buffer("num_batches_tracked", zeros({}, TensorOptions().with_dtype(DType::i64)));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  REEL_CHECK(x.dim() == 4 && x.size(1) == channels_, "BatchNorm2d: input ", shape_str(x.shape()),
             " must be (N, ", channels_, ", H, W)");
  // Before the statistics, as torch does. An op on the device rather than a host count, so that a
  // compiled step replays it (compile/passes/sink_state_updates.cpp gathers a step's counts into
  // one kernel).
  if (is_training()) add_(num_batches_tracked(), 1.0);
  if (comm_)
    return dist::sync_batch_norm(x, running_mean(), running_var(), weight(), bias(), is_training(), momentum_, eps_,
                                 *comm_);
  return batch_norm(x, running_mean(), running_var(), weight(), bias(), is_training(), momentum_, eps_);
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps) : Module("GroupNorm"), groups_(groups), eps_(eps) {
  REEL_CHECK(groups > 0 && channels > 0 && channels % groups == 0, "GroupNorm: groups ", groups,
             " must be positive and divide channels ", channels);
  weight_ = &register_parameter("weight", ones({channels}));
  bias_ = &register_parameter("bias", zeros({channels}));
}

Tensor GroupNorm::forward(const Tensor& x) { return group_norm(x, groups_, weight(), bias(), eps_); }

LayerNorm::LayerNorm(int64_t dim, double eps) : Module("LayerNorm"), dim_(dim), eps_(eps) {
  REEL_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight_ = &register_parameter("weight", ones({dim}));
  bias_ = &register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, {dim_}, weight(), bias(), eps_); }

}  // namespace reel::nn
