// Normalisation layers: BatchNorm2d, GroupNorm, LayerNorm (PyTorch defaults: eps 1e-5, affine
// weight 1 and bias 0, BatchNorm momentum 0.1).
//
//   y = (x - mean) / sqrt(var + eps) * weight + bias, with mean/var (biased) over
//     BatchNorm2d:  N, H, W per channel (training: the batch's; eval: the running statistics)
//     GroupNorm:    each sample's group of C/G channels and H, W
//     LayerNorm:    the last dim (size d)
//   BatchNorm2d running stats, in training: r <- (1 - momentum) r + momentum * batch_stat, with the
//   unbiased variance for running_var (batch_norm() updates the buffers in place).
//   num_batches_tracked: a 0-dim i64 buffer, += 1 at each forward in training (not in eval), as
//   torch's _BatchNorm keeps it, so that a PyTorch state_dict maps one to one. momentum is always a
//   number here (torch's momentum=None, the cumulative average 1/num_batches_tracked, is not
//   offered), so the count only counts.
//   With a communicator (set_communicator, or SyncBatchNorm2d / convert_sync_batchnorm in
//   nn/sync_batch_norm.h) the training statistics span every rank's batch (distributed/sync_batch_norm.h).
#pragma once
#include <memory>

#include "nn/module.h"

namespace reel::dist {
class Communicator;
}

namespace reel::nn {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;  // x: (N, C, H, W)
  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }
  const Tensor& running_mean() const { return *running_mean_; }
  const Tensor& running_var() const { return *running_var_; }
  const Tensor& num_batches_tracked() const { return *num_batches_tracked_; }
  // Data parallel: batch statistics over every rank of `comm` in training; nullptr: this batch only.
  void set_communicator(std::shared_ptr<dist::Communicator> comm) { comm_ = std::move(comm); }
  const std::shared_ptr<dist::Communicator>& communicator() const { return comm_; }

 protected:
  BatchNorm2d(std::string type_name, int64_t channels, double eps, double momentum);

 private:
  int64_t channels_;
  double eps_, momentum_;
  Tensor *weight_, *bias_, *running_mean_, *running_var_, *num_batches_tracked_;
  std::shared_ptr<dist::Communicator> comm_;
};

class GroupNorm : public Module {
 public:
  GroupNorm(int64_t groups, int64_t channels, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;  // x: (N, C, *)
  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }

 private:
  int64_t groups_;
  double eps_;
  Tensor *weight_, *bias_;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;  // x: (..., dim)
  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }

 private:
  int64_t dim_;
  double eps_;
  Tensor *weight_, *bias_;
};

}  // namespace reel::nn
