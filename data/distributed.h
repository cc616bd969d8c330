// Sharding a data set across the ranks of a data-parallel job (torch.utils.data.DistributedSampler).
//
// Every rank computes the same epoch order (data/loader.h: a permutation of 0..N-1 from Philox with
// the seed and the epoch, or 0..N-1 unshuffled) and keeps every K-th entry starting at its rank:
//   rank r of K takes order[r], order[r + K], order[r + 2K], ...   (PyTorch's strided split)
// so the shards of one epoch are disjoint and, together, cover the data set. When K does not divide N:
//   drop_last = false: the order is padded to a multiple of K with its own first entries (repeated
//                      as often as needed), so every rank gets ceil(N / K) items and a few items are
//                      seen twice in that epoch;
//   drop_last = true:  the order is cut to the largest multiple of K, so every rank gets floor(N / K)
//                      items and N mod K items (a different set each shuffled epoch) are skipped.
// Equal shard sizes are the point: every rank then runs the same number of micro-batches and
// optimizer steps, so their collectives line up. (This drop_last is about the shards; the loader's
// own drop_last still decides what happens to a short last batch within a shard.)
#pragma once
#include <cstdint>
#include <vector>

namespace reel::data {

// Items each rank gets from a data set of n items (see above).
int64_t shard_size(int64_t n, int64_t num_replicas, bool drop_last);

// Rank `rank`'s entries of `order` (the epoch's order of the whole data set, the same on every rank).
std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, int64_t num_replicas, int64_t rank,
                                   bool drop_last);

// The sampler on its own, for loops that do not use DataLoader: the indices of this rank's shard of
// epoch `epoch`'s order.
class DistributedSampler {
 public:
  DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  int64_t size() const { return int64_t(indices_.size()); }
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  int64_t n_, replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  std::vector<int64_t> indices_;
};

}  // namespace reel::data
