// SyncBatchNorm2d and convert_sync_batchnorm — BatchNorm whose training statistics span every rank of
// a data-parallel job (torch.nn.SyncBatchNorm and SyncBatchNorm.convert_sync_batchnorm).
//
// A SyncBatchNorm2d is a BatchNorm2d with a communicator: in training, mean and variance are those of
// the concatenation of every rank's batch, and the backward all-reduces its two per-channel sums
// (math in distributed/sync_batch_norm.h); in eval mode, or with world size 1, it is BatchNorm2d exactly.
// The running statistics are then the same on every rank without any broadcast.
// convert_sync_batchnorm gives every BatchNorm2d of a model (found through named_modules) the
// communicator, in place: the same parameters and buffers, so an optimizer built before stays valid,
// and layers that hold their BatchNorm2d by pointer see the change. It must be done on every rank.
#pragma once
#include <memory>

#include "distributed/communicator.h"
#include "nn/norm_layers.h"

namespace reel::nn {

class SyncBatchNorm2d : public BatchNorm2d {
 public:
  explicit SyncBatchNorm2d(int64_t channels, std::shared_ptr<dist::Communicator> comm = dist::world_ptr(),
                           double eps = 1e-5, double momentum = 0.1);
};

// Returns how many BatchNorm2d layers of `model` (itself included) now synchronise over `comm`.
int64_t convert_sync_batchnorm(Module& model, std::shared_ptr<dist::Communicator> comm = dist::world_ptr());

}  // namespace reel::nn
