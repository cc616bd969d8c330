// Shards of an epoch's order for data parallel (see data/distributed.h).
#include "data/distributed.h"

#include <numeric>

#include "data/loader.h"
#include "tensor/error.h"

namespace reel::data {
namespace {

void check_replicas(const char* who, int64_t num_replicas, int64_t rank) {
  REEL_CHECK(num_replicas >= 1, who, ": num_replicas must be >= 1, got ", num_replicas);
  REEL_CHECK(rank >= 0 && rank < num_replicas, who, ": rank ", rank, " is outside [0, ", num_replicas, ")");
}

}  // namespace

int64_t shard_size(int64_t n, int64_t num_replicas, bool drop_last) {
  REEL_CHECK(num_replicas >= 1 && n >= 0, "shard_size: n ", n, " and num_replicas ", num_replicas,
             " must be >= 0 and >= 1");
  return drop_last ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, int64_t num_replicas, int64_t rank,
                                   bool drop_last) {
  check_replicas("shard_indices", num_replicas, rank);
  const int64_t n = int64_t(order.size());
  const int64_t per_rank = shard_size(n, num_replicas, drop_last);
  REEL_CHECK(per_rank > 0 || n == 0, "shard_indices: ", n, " items over ", num_replicas,
             " ranks with drop_last leaves every rank empty");
  std::vector<int64_t> out;
  out.reserve(size_t(per_rank));
  // Position i of the padded (or cut) order is order[i mod n]: padding repeats the order's start.
  for (int64_t k = 0; k < per_rank; ++k) out.push_back(order[size_t((rank + k * num_replicas) % n)]);
  return out;
}

DistributedSampler::DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  check_replicas("DistributedSampler", num_replicas, rank);
  REEL_CHECK(n > 0, "DistributedSampler: the data set is empty");
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  REEL_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch must be non-negative, got ", epoch);
  epoch_ = epoch;
  std::vector<int64_t> order;
  if (shuffle_) {
    order = epoch_order(n_, seed_, epoch);
  } else {
    order.resize(size_t(n_));
    std::iota(order.begin(), order.end(), int64_t(0));
  }
  indices_ = shard_indices(order, replicas_, rank_, drop_last_);
}

}  // namespace reel::data
