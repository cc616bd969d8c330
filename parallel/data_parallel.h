// Data parallel (PyTorch's DistributedDataParallel, for reel's optimizer-owned accumulation).
//
// K processes (ranks) each hold a full replica of the model and see their own shard of every batch
// (data/distributed.h). The replicas stay identical because
//   1. at the start, every parameter and buffer is broadcast from rank 0 (after checking that all
//      ranks built the same model: a fixed-size signature is all-gathered and compared, so a mismatch
//      is a reel::Error on every rank naming the first differing tensor, not a hang in a collective
//      of the wrong size);
//   2. at each optimizer step's accumulation boundary, before unscale/clip/update, the gradients are
//      all-reduced once — GradientBuckets, the optimizer's GradSync (optim/grad_sync.h):
//         bucket = [ g_1 w, g_2 w, ..., g_k w | w ]          (w: the items this rank's step saw)
//         all_reduce(bucket, sum)                             (one collective per bucket)
//         g_i   <- bucket_i / bucket[last]                    (= sum_r w_r g_r / sum_r w_r)
//      Gradients are copied into flat buckets of at most bucket_bytes (one per dtype and device when
//      they fit; 25 MiB by default, as DDP), so a step issues ceil(bytes / bucket_bytes) collectives
//      whatever ACCUM is and however many parameters there are. Carrying w in the bucket makes the
//      item-count sum part of the same collective: a rank that saw fewer items (an epoch's
//      remainder, a smaller last micro-batch) weighs less, and the result is the gradient of the mean
//      loss over all ranks' items. The all-reduce is synchronous and runs after the last micro-batch's
//      backward (no overlap with it yet).
//   3. with sync_buffers (DDP's broadcast_buffers), floating buffers (BatchNorm's running statistics)
//      are broadcast from rank 0 at each boundary too, one more collective per step; SyncBatchNorm
//      (nn/sync_batch_norm.h) keeps its running statistics identical by itself, so they are left out,
//      and so is every BatchNorm's num_batches_tracked (each rank counts the same forwards).
// A parameter that received no gradient on a rank contributes zeros; every parameter gets the reduced
// gradient on every rank (as DDP with find_unused_parameters=False assumes every parameter is used).
// Precision: the reduction runs in the gradients' dtype (f32 master gradients; fp16 loss scaling
// happens later, on the reduced gradients, so found_inf agrees across ranks).
// parallel/ sits above nn and optim (it wraps a model and an optimizer); the communicator it drives
// sits below nn, in distributed/. Both keep the namespace reel::dist, so dist::make_data_parallel and
// dist::world() read as before.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace reel::dist {

struct DataParallelOptions {
  size_t bucket_bytes = size_t(25) << 20;
  bool sync_buffers = true;
  DataParallelOptions& with_bucket_bytes(size_t b) { bucket_bytes = b; return *this; }
  DataParallelOptions& with_sync_buffers(bool s) { sync_buffers = s; return *this; }
};

class GradientBuckets : public optim::GradSync {
 public:
  // `params`: the optimizer's parameters, in its order; `buffers`: broadcast from rank 0 at each sync
  // (empty: none).
  GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<Tensor> params, size_t bucket_bytes,
                  std::vector<Tensor> buffers = {});
  void sync(const std::vector<Tensor>& params, double weight) override;
  std::string describe() const override;

  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  // Collectives one sync issues: the buckets, plus one per buffer dtype when buffers are synced.
  int64_t collectives_per_step() const;
  Communicator& communicator() const { return *comm_; }

 private:
  struct Entry {
    size_t param;    // index into params_
    int64_t offset;  // elements into the bucket
  };
  struct Bucket {
    Tensor flat;  // (n + 1): the gradients, then the weight
    int64_t n = 0;
    std::vector<Entry> entries;
  };
  void reduce(Bucket& b, double weight);

  std::shared_ptr<Communicator> comm_;
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<Tensor> buffer_packs_;                 // one flat tensor per buffer dtype
  std::vector<std::vector<Tensor>> buffer_groups_;   // the buffers packed into each
  size_t bucket_bytes_;
};

// Throws reel::Error on every rank unless every rank holds tensors of the same names, shapes and
// dtypes, in the same order (`what` names one in the message: "parameter", "buffer").
void check_same_tensors(Communicator& comm, const nn::NamedTensors& tensors, const std::string& what);
// Checks the model's parameters and buffers across ranks, then copies rank `root`'s into every rank.
void broadcast_module(Communicator& comm, nn::Module& model, int root = 0);

// What DDP's constructor does, for reel's optimizer: checks and broadcasts the model from rank 0 and
// attaches GradientBuckets to `opt` (its parameters must be the model's). Returns the sync attached.
std::shared_ptr<GradientBuckets> make_data_parallel(nn::Module& model, optim::Optimizer& opt,
                                                    std::shared_ptr<Communicator> comm = world_ptr(),
                                                    DataParallelOptions options = {});

// ---- hooks for `reel train` under mpirun ----
// Starts the process's communicator (MPI under mpirun) and returns the device this rank trains on:
// `requested` itself, except cuda:0 becomes cuda:<local rank> when several ranks share a host.
// With world size > 1: --compile is refused (collectives are not recorded; say so), and ranks other
// than 0 stop printing to stdout (REEL_DIST_PRINT_ALL=1 keeps them), as each would print the same.
Device setup_training(Device requested, const std::string& compile_mode = "none");
// With world size > 1: converts the model's BatchNorm2d layers to SyncBatchNorm when `sync_batchnorm`,
// then make_data_parallel(model, opt) (check, broadcast from rank 0, gradient buckets; the optimizer's
// print_setup then shows the data-parallel line). A no-op on a single process.
void prepare_training(nn::Module& model, optim::Optimizer& opt, bool sync_batchnorm = false);

}  // namespace reel::dist
