// DataLoader — batches of a labelled data set in a seeded, per-epoch shuffled order (like
// torch.utils.data.DataLoader with a seeded sampler and sampler.set_epoch).
//
// Order: epoch e's order is a permutation of 0..N-1 made by Fisher-Yates, with the draw for position i
// taken from Philox(key = seed, counter = e * 2^32 + i) (tensor/rng.h). So the same (seed, epoch)
// always gives the same order, on any machine and in any process, and different epochs give
// different orders without any state carried from one epoch to the next. shuffle = false gives
// 0..N-1 in every epoch.
//
// Batches: batch k holds the items order[k*B .. (k+1)*B). When B does not divide N the last batch has
// remainder() = N mod B items: it is yielded (a short batch) unless drop_last, in which case those
// items are skipped for that epoch (and, being shuffled, a different subset is skipped each epoch).
//
// Sharding (data parallel): with_shard(rank, num_replicas) keeps only this rank's shard of each
// epoch's order (data/distributed.h: every num_replicas-th entry from `rank`, padded or cut so that all
// ranks get the same count); batches, remainder() and num_batches() then count the shard's items.
//
// Gathering: rows are copied on the host (one memcpy per item) into fresh contiguous CPU tensors,
// which are then moved to the loader's device with .to(device) (pageable memory: the driver stages
// the copy, so the host buffer may be freed at once). The data set stays on the host.
#pragma once
#include <cstdint>
#include <vector>

#include "data/fashion_mnist.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace reel::data {

struct DataLoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  Device device = Device::cpu();
  int64_t num_replicas = 1, rank = 0;  // this rank's shard of each epoch (data/distributed.h)
  bool shard_drop_last = false;        // cut the order to a multiple of num_replicas instead of padding
  DataLoaderOptions& with_batch_size(int64_t b) { batch_size = b; return *this; }
  DataLoaderOptions& with_shuffle(bool s) { shuffle = s; return *this; }
  DataLoaderOptions& with_seed(uint64_t s) { seed = s; return *this; }
  DataLoaderOptions& with_drop_last(bool d) { drop_last = d; return *this; }
  DataLoaderOptions& with_device(Device d) { device = d; return *this; }
  DataLoaderOptions& with_shard(int64_t r, int64_t replicas, bool drop_last_shard = false) {
    rank = r;
    num_replicas = replicas;
    shard_drop_last = drop_last_shard;
    return *this;
  }
};

struct Batch {
  Tensor inputs;                 // (b, ...) rows of the data set's inputs, e.g. (b, 1, 28, 28) f32
  Tensor targets;                // (b, ...) rows of its targets, e.g. (b) i64
  std::vector<int64_t> indices;  // the data-set rows gathered, in batch order
  int64_t size() const { return int64_t(indices.size()); }
};

// The shuffled order of one epoch (see above): a permutation of 0..n-1.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

class DataLoader {
 public:
  // inputs (N, ...) and targets (N, ...) on the CPU, any dtypes; they share their first dimension.
  DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options);
  DataLoader(const ImageDataset& dataset, DataLoaderOptions options)
      : DataLoader(dataset.images, dataset.labels, options) {}

  // Chooses the epoch whose order the following batches follow (like sampler.set_epoch); 0 at start.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  int64_t dataset_size() const { return n_; }
  // Items of this rank's shard per epoch (M): N without sharding.
  int64_t shard_size() const { return m_; }
  int64_t batch_size() const { return options_.batch_size; }
  // Items in the last, short batch (M mod B; 0 when B divides M). Dropped per epoch when drop_last.
  int64_t remainder() const { return m_ % options_.batch_size; }
  // Batches per epoch: floor(M / B) with drop_last, else ceil(M / B).
  int64_t num_batches() const;
  // Items yielded per epoch: M, or M - remainder() with drop_last.
  int64_t items_per_epoch() const { return m_ - (options_.drop_last ? remainder() : 0); }
  const DataLoaderOptions& options() const { return options_; }
  // The current epoch's order of data-set rows (this rank's shard of it when sharded).
  const std::vector<int64_t>& order() const { return order_; }

  // Batch k (0 <= k < num_batches()) of the current epoch.
  Batch batch(int64_t k) const;

  class Iterator {
   public:
    Iterator(const DataLoader* loader, int64_t k) : loader_(loader), k_(k) {}
    Batch operator*() const { return loader_->batch(k_); }
    Iterator& operator++() { ++k_; return *this; }
    bool operator!=(const Iterator& o) const { return k_ != o.k_; }
    bool operator==(const Iterator& o) const { return k_ == o.k_; }

   private:
    const DataLoader* loader_;
    int64_t k_;
  };
  // for (const Batch& b : loader) ... visits the current epoch's batches in order.
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, num_batches()); }

 private:
  Tensor inputs_, targets_;  // (N, ...), contiguous, CPU
  int64_t n_ = 0, m_ = 0;  // items in the data set, and in this rank's shard
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace reel::data
