// DataLoader: the per-epoch Philox shuffle and the host-side row gather (see loader.h).
#include "data/loader.h"

#include <cstring>
#include <numeric>

#include "autograd/ops.h"
#include "data/distributed.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace reel::data {
namespace {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Copies rows `rows` of `src` (N, ...) into a fresh contiguous (rows.size(), ...) CPU tensor.
Tensor gather_rows(const Tensor& src, const std::vector<int64_t>& rows) {
  Shape shape = src.shape();
  shape[0] = int64_t(rows.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  const size_t row_bytes = src.nbytes() / size_t(src.size(0));
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  const int64_t b = int64_t(rows.size());
#pragma omp parallel for schedule(static) if (b * int64_t(row_bytes) > (1 << 20))
  for (int64_t i = 0; i < b; ++i) std::memcpy(to + size_t(i) * row_bytes, from + size_t(rows[size_t(i)]) * row_bytes, row_bytes);
  return out;
}

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  REEL_CHECK(n >= 0 && n < (int64_t(1) << 32), "epoch_order: n must be in [0, 2^32), got ", n);
  REEL_CHECK(epoch >= 0, "epoch_order: epoch must be non-negative, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  const uint64_t base = uint64_t(epoch) << 32;
  for (int64_t i = n - 1; i > 0; --i) {
    Philox4 r = philox4x32_10(seed, base + uint64_t(i));
    uint64_t u = (uint64_t(r.w[0]) << 32) | r.w[1];
    std::swap(order[size_t(i)], order[size_t(u % uint64_t(i + 1))]);
  }
  return order;
}

DataLoader::DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options) : options_(options) {
  REEL_CHECK(inputs.defined() && targets.defined(), "DataLoader: inputs and targets must be defined tensors");
  REEL_CHECK(inputs.dim() >= 1 && targets.dim() >= 1, "DataLoader: inputs ", shape_str(inputs.shape()),
             " and targets ", shape_str(targets.shape()), " need a leading item dimension");
  REEL_CHECK(inputs.size(0) == targets.size(0), "DataLoader: inputs ", shape_str(inputs.shape()), " and targets ",
             shape_str(targets.shape()), " hold different numbers of items");
  REEL_CHECK(inputs.device().is_cpu() && targets.device().is_cpu(), "DataLoader: the data set must be on the cpu, got ",
             inputs.device(), " and ", targets.device(), "; the loader moves each batch to options.device");
  REEL_CHECK(options.batch_size > 0, "DataLoader: batch_size must be positive, got ", options.batch_size);
  inputs_ = inputs.contiguous();
  targets_ = targets.contiguous();
  n_ = inputs.size(0);
  REEL_CHECK(n_ > 0, "DataLoader: the data set is empty");
  REEL_CHECK(options.num_replicas >= 1 && options.rank >= 0 && options.rank < options.num_replicas,
             "DataLoader: shard rank ", options.rank, " of ", options.num_replicas, " replicas is not a rank");
  m_ = options.num_replicas > 1 ? data::shard_size(n_, options.num_replicas, options.shard_drop_last) : n_;
  REEL_CHECK(m_ > 0, "DataLoader: ", n_, " items over ", options.num_replicas, " ranks leave each rank none");
  REEL_CHECK(!(options.drop_last && m_ < options.batch_size), "DataLoader: drop_last with batch_size ",
             options.batch_size, " and only ", m_, " items", options.num_replicas > 1 ? " per rank" : "",
             " would yield no batch");
  set_epoch(0);
}

void DataLoader::set_epoch(int64_t epoch) {
  REEL_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be non-negative, got ", epoch);
  epoch_ = epoch;
  if (options_.shuffle) {
    order_ = epoch_order(n_, options_.seed, epoch);
  } else if (int64_t(order_.size()) != m_) {
    order_.resize(size_t(n_));
    std::iota(order_.begin(), order_.end(), int64_t(0));
  } else {
    return;  // unshuffled and already sharded: the same every epoch
  }
  if (options_.num_replicas > 1)
    order_ = shard_indices(order_, options_.num_replicas, options_.rank, options_.shard_drop_last);
}

int64_t DataLoader::num_batches() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? m_ / b : (m_ + b - 1) / b;
}

Batch DataLoader::batch(int64_t k) const {
  REEL_CHECK(k >= 0 && k < num_batches(), "DataLoader::batch: batch ", k, " is outside [0, ", num_batches(), ")");
  const int64_t begin = k * options_.batch_size;
  const int64_t end = std::min(m_, begin + options_.batch_size);
  Batch out;
  out.indices.assign(order_.begin() + begin, order_.begin() + end);
  out.inputs = gather_rows(inputs_, out.indices);
  out.targets = gather_rows(targets_, out.indices);
  if (!options_.device.is_cpu()) {
    out.inputs = out.inputs.to(options_.device);
    out.targets = out.targets.to(options_.device);
  }
  return out;
}

}  // namespace reel::data
