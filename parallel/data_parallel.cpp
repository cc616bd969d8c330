// Data parallel: the model check and broadcast, the gradient buckets, and the `reel train` hooks
// (see parallel/data_parallel.h).
#include "parallel/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "nn/sync_batch_norm.h"
#include "tensor/cuda.h"
#include "tensor/error.h"

namespace reel::dist {
namespace {

// ---- the model signature ----
// One tensor's record, all i64 so that one all_gather carries it: a hash of the name, the dtype, the
// rank and up to 8 dims (the 8th folds any further ones in), then the first 64 bytes of the name
// (only for the message).
constexpr int64_t kMaxDims = 8, kNameWords = 8, kRecord = 3 + kMaxDims + kNameWords;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::vector<int64_t> record_of(const std::string& name, const Tensor& t) {
  std::vector<int64_t> r(size_t(kRecord), 0);
  r[0] = int64_t(fnv1a(name.data(), name.size()));
  r[1] = int64_t(t.dtype());
  r[2] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t slot = std::min(d, kMaxDims - 1);
    r[size_t(3 + slot)] = d < kMaxDims - 1 ? t.size(d) : r[size_t(3 + slot)] * 1000003 + t.size(d);
  }
  std::memcpy(r.data() + 3 + kMaxDims, name.data(), std::min(name.size(), size_t(kNameWords * 8)));
  return r;
}

std::string describe_record(const int64_t* r) {
  char name[kNameWords * 8 + 1] = {};
  std::memcpy(name, r + 3 + kMaxDims, kNameWords * 8);
  Shape shape(r + 3, r + 3 + std::min<int64_t>(r[2], kMaxDims));
  std::string s = detail::cat(name, " ", shape_str(shape), " ", dtype_name(DType(r[1])));
  return r[2] > kMaxDims ? s + " (" + std::to_string(r[2]) + " dims)" : s;
}

Tensor i64_tensor(const std::vector<int64_t>& v) { return tensor_i64(v, {int64_t(v.size())}); }

// Groups tensors by (dtype, device), keeping their order within a group.
std::vector<std::vector<Tensor>> group_by_type(const std::vector<Tensor>& ts) {
  std::map<std::tuple<int, int, int>, size_t> index;
  std::vector<std::vector<Tensor>> groups;
  for (const Tensor& t : ts) {
    auto key = std::make_tuple(int(t.dtype()), int(t.device().type), t.device().index);
    auto [it, fresh] = index.emplace(key, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(t);
  }
  return groups;
}

// One flat (sum of numels) tensor holding copies of `ts` (same dtype and device), back to back.
Tensor pack(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += t.numel();
  Tensor flat = Tensor::empty({n}, ts[0].dtype(), ts[0].device());
  int64_t off = 0;
  for (const Tensor& t : ts) {
    copy_(flat.slice(0, off, off + t.numel()).view(t.shape()), t);
    off += t.numel();
  }
  return flat;
}

void unpack(const Tensor& flat, const std::vector<Tensor>& ts) {
  int64_t off = 0;
  for (const Tensor& t : ts) {
    copy_(t, flat.slice(0, off, off + t.numel()).view(t.shape()));
    off += t.numel();
  }
}

// Copies rank root's values of `ts` into every rank's, one broadcast per (dtype, device).
void broadcast_tensors(Communicator& comm, const std::vector<Tensor>& ts, int root) {
  NoGradGuard no_grad;
  for (const std::vector<Tensor>& group : group_by_type(ts)) {
    Tensor flat = pack(group);
    comm.broadcast(flat, root);
    unpack(flat, group);
  }
}

std::string bytes_str(size_t b) {
  char s[32];
  if (b >= (size_t(1) << 20)) std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1 << 20));
  else if (b >= (size_t(1) << 10)) std::snprintf(s, sizeof s, "%.1f KiB", double(b) / double(1 << 10));
  else std::snprintf(s, sizeof s, "%zu B", b);
  return s;
}

}  // namespace

void check_same_tensors(Communicator& comm, const nn::NamedTensors& tensors, const std::string& what) {
  if (comm.world_size() == 1 || meta_mode()) return;
  // Phase 1, one small all_gather: the count, the elements and a hash of every record.
  int64_t elements = 0;
  uint64_t hash = 1469598103934665603ull;
  std::vector<std::vector<int64_t>> records;
  for (const auto& [name, t] : tensors) {
    records.push_back(record_of(name, t));
    elements += t.numel();
    hash = fnv1a(records.back().data(), size_t(3 + kMaxDims) * 8, hash);  // the name enters through its hash
  }
  const int64_t count = int64_t(tensors.size());
  std::vector<int64_t> summary =
      comm.all_gather(i64_tensor({count, elements, int64_t(hash)})).to_vector<int64_t>();
  const int R = comm.world_size();
  bool same = true;
  int64_t min_count = count;
  for (int r = 0; r < R; ++r) {
    same = same && std::equal(summary.begin() + 3 * r, summary.begin() + 3 * r + 3, summary.begin());
    min_count = std::min(min_count, summary[size_t(3 * r)]);
  }
  if (same) return;
  // Phase 2 (every rank reaches it, having seen the same summary): the records of the first
  // min_count tensors, to name the first that differs.
  std::string msg = "data parallel: the ranks built different models (every rank must build the same one, whose " +
                    what + "s rank 0 then broadcasts): ";
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < min_count; ++i) mine.insert(mine.end(), records[size_t(i)].begin(), records[size_t(i)].end());
  if (min_count > 0) {
    std::vector<int64_t> all = comm.all_gather(i64_tensor(mine)).to_vector<int64_t>();
    const size_t stride = size_t(min_count * kRecord);
    for (int64_t i = 0; i < min_count; ++i) {
      const int64_t* base = all.data() + i * kRecord;
      for (int r = 1; r < R; ++r) {
        const int64_t* other = all.data() + r * stride + i * kRecord;
        if (std::equal(base, base + 3 + kMaxDims, other)) continue;
        throw Error(detail::cat(msg, what, " ", i, " is ", describe_record(base), " on rank 0 but ",
                                describe_record(other), " on rank ", r, " (seen from rank ", comm.rank(), ")"));
      }
    }
  }
  msg += what + "s per rank:";
  for (int r = 0; r < R; ++r)
    msg += detail::cat(" rank ", r, " has ", summary[size_t(3 * r)], " (", summary[size_t(3 * r + 1)], " elements)",
                       r + 1 < R ? "," : "");
  throw Error(detail::cat(msg, " (seen from rank ", comm.rank(), ")"));
}

void broadcast_module(Communicator& comm, nn::Module& model, int root) {
  if (comm.world_size() == 1) return;
  check_same_tensors(comm, model.named_parameters(), "parameter");
  check_same_tensors(comm, model.named_buffers(), "buffer");
  std::vector<Tensor> all = model.parameters();
  for (const Tensor& b : model.buffers()) all.push_back(b);
  broadcast_tensors(comm, all, root);
}

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<Tensor> params, size_t bucket_bytes,
                                 std::vector<Tensor> buffers)
    : comm_(std::move(comm)), params_(std::move(params)), bucket_bytes_(bucket_bytes) {
  REEL_CHECK(comm_ != nullptr, "GradientBuckets: no communicator");
  REEL_CHECK(bucket_bytes_ > 0, "GradientBuckets: bucket_bytes must be positive");
  // Buckets fill in parameter order within each (dtype, device); one that would pass bucket_bytes is
  // closed first (so a parameter larger than bucket_bytes gets a bucket of its own).
  std::map<std::tuple<int, int, int>, size_t> open;  // (dtype, device) -> the bucket being filled
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    auto key = std::make_tuple(int(p.dtype()), int(p.device().type), p.device().index);
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = buckets_[it->second];
      if (size_t(b.n + p.numel()) * p.element_size() > bucket_bytes_) open.erase(it), it = open.end();
    }
    if (it == open.end()) {
      buckets_.emplace_back();
      it = open.emplace(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    b.entries.push_back({i, b.n});
    b.n += p.numel();
  }
  for (Bucket& b : buckets_) {
    const Tensor& p = params_[b.entries[0].param];
    b.flat = zeros({b.n + 1}, TensorOptions().with_dtype(p.dtype()).with_device(p.device()));
  }
  for (const std::vector<Tensor>& group : group_by_type(buffers)) {
    buffer_groups_.push_back(group);
    buffer_packs_.push_back(pack(group));
  }
}

void GradientBuckets::reduce(Bucket& b, double weight) {
  Tensor body = b.flat.slice(0, 0, b.n), total = b.flat.slice(0, b.n, b.n + 1);
  for (const Entry& e : b.entries) {
    const Tensor& p = params_[e.param];
    Tensor slot = b.flat.slice(0, e.offset, e.offset + p.numel()).view(p.shape());
    Tensor g = p.grad();
    if (g.defined()) copy_(slot, g);
    else zero_(slot);
  }
  if (weight != 1.0) mul_(body, weight);
  fill_(total, weight);
  // As an op (the f32/f64 buckets of training): a compiled step records it, and its replay (a CUDA
  // graph with NCCL's kernel in it) runs it.
  comm_->all_reduce_op(b.flat, ReduceOp::sum);
  // sum_r w_r g_r / sum_r w_r; with equal shares this is the mean over ranks (a division by K).
  dispatch_out(OpKind::Div, {body, total}, {body});
  for (const Entry& e : b.entries) {
    const Tensor& p = params_[e.param];
    Tensor slot = b.flat.slice(0, e.offset, e.offset + p.numel()).view(p.shape());
    Tensor g = p.grad();
    if (g.defined()) copy_(g, slot);
    else p.set_grad(clone(slot));
  }
}

void GradientBuckets::sync(const std::vector<Tensor>& params, double weight) {
  REEL_CHECK(params.size() == params_.size(), "data parallel: the optimizer has ", params.size(),
             " parameters but its gradient buckets were built for ", params_.size());
  for (size_t i = 0; i < params.size(); ++i)
    REEL_CHECK(params[i].is_same(params_[i]), "data parallel: parameter ", i, " of shape ", shape_str(params[i].shape()),
               " is not the one the gradient buckets were built for (build them after moving the model)");
  REEL_CHECK(weight > 0, "data parallel: a rank's share of the step must be positive, got ", weight);
  // One rank: sum_r w_r g_r / sum_r w_r is g itself; a weight of 1 keeps it so to the bit.
  if (comm_->world_size() == 1) weight = 1.0;
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) reduce(b, weight);
  for (size_t k = 0; k < buffer_packs_.size(); ++k) {
    const std::vector<Tensor>& group = buffer_groups_[k];
    int64_t off = 0;
    for (const Tensor& t : group) {
      copy_(buffer_packs_[k].slice(0, off, off + t.numel()).view(t.shape()), t);
      off += t.numel();
    }
    comm_->broadcast_op(buffer_packs_[k], 0);  // an op: a compiled step records and replays it
    unpack(buffer_packs_[k], group);
  }
}

int64_t GradientBuckets::collectives_per_step() const { return int64_t(buckets_.size() + buffer_packs_.size()); }

std::string GradientBuckets::describe() const {
  size_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += b.flat.nbytes();
  std::string s = detail::cat("data parallel: rank ", comm_->rank(), " of ", comm_->world_size(), " (",
                              comm_->describe(), "); gradients all-reduced once per optimizer step, ",
                              buckets_.size(), " bucket", buckets_.size() == 1 ? "" : "s", " of ", bytes_str(bytes),
                              " in all (at most ", bytes_str(bucket_bytes_), " each)");
  if (!buffer_packs_.empty()) s += "; buffers broadcast from rank 0 at each step";
  return s;
}

std::shared_ptr<GradientBuckets> make_data_parallel(nn::Module& model, optim::Optimizer& opt,
                                                    std::shared_ptr<Communicator> comm, DataParallelOptions options) {
  REEL_CHECK(comm != nullptr, "make_data_parallel: no communicator");
  std::vector<Tensor> params = model.parameters();
  const std::vector<Tensor>& theirs = opt.parameters();
  REEL_CHECK(params.size() == theirs.size(), "make_data_parallel: the optimizer holds ", theirs.size(),
             " parameters but the model has ", params.size(), "; build the optimizer from model.parameters()");
  for (size_t i = 0; i < params.size(); ++i)
    REEL_CHECK(params[i].is_same(theirs[i]), "make_data_parallel: the optimizer's parameter ", i, " of shape ",
               shape_str(theirs[i].shape()), " is not the model's (move the model before building the optimizer)");
  broadcast_module(*comm, model, 0);
  // Buffers to broadcast at each step: all but those that agree already, SyncBatchNorm's running
  // statistics and every BatchNorm's num_batches_tracked (each rank runs the same forwards between
  // two boundaries, whose collectives keep the ranks in step, and broadcast_module aligned the
  // counts at the start: rank 0's count is every rank's, as after DDP's broadcast, one collective fewer).
  std::vector<Tensor> buffers;
  if (options.sync_buffers) {
    std::vector<Tensor> synced;
    auto note = [&](nn::Module& m) {
      auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m);
      if (!bn) return;
      synced.push_back(bn->num_batches_tracked());
      if (bn->communicator() && bn->communicator()->world_size() > 1) {
        synced.push_back(bn->running_mean());
        synced.push_back(bn->running_var());
      }
    };
    note(model);
    for (const auto& [name, child] : model.named_modules()) note(*child);
    for (const Tensor& b : model.buffers())
      if (std::none_of(synced.begin(), synced.end(), [&](const Tensor& t) { return t.is_same(b); })) buffers.push_back(b);
  }
  auto sync = std::make_shared<GradientBuckets>(comm, params, options.bucket_bytes, buffers);
  opt.set_grad_sync(sync);
  return sync;
}

Device setup_training(Device requested, const std::string& compile_mode) {
  Communicator& comm = init(Backend::automatic);
  if (comm.world_size() == 1) return requested;
  (void)compile_mode;  // the gradient all-reduce is an op: a compiled step records and replays it
  Device device = requested;
  if (device.is_cuda() && device.index == 0 && local_rank() > 0) {
    REEL_CHECK(local_rank() < cuda::device_count(), "train: local rank ", local_rank(), " needs GPU ", local_rank(),
               " but only ", cuda::device_count(), " are visible; start at most that many ranks per host");
    device = Device::cuda(local_rank());
  }
  const char* all = std::getenv("REEL_DIST_PRINT_ALL");
  if (comm.rank() != 0 && !(all && std::string(all) == "1")) {
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout)) std::fprintf(stderr, "rank %d: could not silence stdout\n", comm.rank());
  }
  return device;
}

void prepare_training(nn::Module& model, optim::Optimizer& opt, bool sync_batchnorm) {
  std::shared_ptr<Communicator> comm = world_ptr();
  if (comm->world_size() == 1) return;
  if (sync_batchnorm) nn::convert_sync_batchnorm(model, comm);
  make_data_parallel(model, opt, comm);
}

}  // namespace reel::dist
