// OpProfiler (see op_profile.h).
#include "tools/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace reel::tools {
namespace {

double host_now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string kernel_key(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  std::string k = op_name(op);
  k += ' ';
  bool first = true;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (!first) k += 'x';
    first = false;
    k += shape_str(t.shape());
  }
  const Tensor& dtype_of = !outputs.empty() && outputs[0].defined() ? outputs[0] : inputs[0];
  k += ' ';
  k += dtype_name(dtype_of.dtype());
  return k;
}

std::vector<OpProfiler::Row> sorted(const std::map<std::string, OpProfiler::Row>& m) {
  std::vector<OpProfiler::Row> rows;
  for (const auto& [k, r] : m) rows.push_back(r);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return rows;
}

}  // namespace

OpProfiler::OpProfiler(Device device) : device_(device) {
  if (device.is_cuda()) events_ = std::make_unique<cuda::EventLog>(device.index);
}

OpProfiler::~OpProfiler() {
  if (set_dispatch_observer(previous_) != this) set_dispatch_observer(nullptr);
}

void OpProfiler::stamp() {
  if (events_) events_->mark();
  else host_stamps_ms_.push_back(host_now_ms());
}

void OpProfiler::begin() {
  pending_.clear();
  host_stamps_ms_.clear();
  if (events_) events_->clear();
  previous_ = set_dispatch_observer(this);
  stamp();
}

void OpProfiler::on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const Attrs&, bool) {
  if (is_view_op(op)) return;  // no kernel ran
  pending_.emplace_back(op_name(op), kernel_key(op, inputs, outputs));
  stamp();
}

void OpProfiler::end() {
  set_dispatch_observer(previous_);
  std::vector<double> intervals;
  if (events_) {
    intervals = events_->intervals_ms();
  } else {
    for (size_t i = 1; i < host_stamps_ms_.size(); ++i)
      intervals.push_back(host_stamps_ms_[i] - host_stamps_ms_[i - 1]);
  }
  REEL_ASSERT(intervals.size() == pending_.size(), "OpProfiler: ", intervals.size(), " intervals for ",
              pending_.size(), " ops");
  for (size_t i = 0; i < intervals.size(); ++i) {
    for (auto [table, key] : {std::pair{&ops_, &pending_[i].first}, std::pair{&kernels_, &pending_[i].second}}) {
      Row& r = (*table)[*key];
      r.key = *key;
      r.calls += 1;
      r.ms += intervals[i];
    }
    total_ms_ += intervals[i];
  }
  pending_.clear();
}

void OpProfiler::record(const std::string& op, const std::string& kernel, double ms) {
  for (auto [table, key] : {std::pair{&ops_, &op}, std::pair{&kernels_, &kernel}}) {
    Row& r = (*table)[*key];
    r.key = *key;
    r.calls += 1;
    r.ms += ms;
  }
  total_ms_ += ms;
}

std::vector<OpProfiler::Row> OpProfiler::by_op() const { return sorted(ops_); }
std::vector<OpProfiler::Row> OpProfiler::by_kernel() const { return sorted(kernels_); }

void print_profile(const OpProfiler& p, int64_t steps, double step_ms, size_t top) {
  double per = 1.0 / double(std::max<int64_t>(steps, 1));
  std::printf("  ops charged %.3f ms per step (step median %.3f ms)\n", p.total_ms() * per, step_ms);
  auto table = [&](const char* title, const std::vector<OpProfiler::Row>& rows) {
    std::printf("  %-84s %8s %10s %7s\n", title, "calls", "ms/step", "share");
    for (size_t i = 0; i < rows.size() && i < top; ++i)
      std::printf("  %-84.84s %8.0f %10.3f %6.1f%%\n", rows[i].key.c_str(), double(rows[i].calls) * per,
                  rows[i].ms * per, 100.0 * rows[i].ms * per / step_ms);
  };
  table("op", p.by_op());
  table("op, input shapes, dtype", p.by_kernel());
}

}  // namespace reel::tools
