// OpProfiler — where a training step's time goes, op by op, without an external profiler.
//
// Installed as the dispatch observer, it stamps the stream after every op that runs a kernel (CUDA
// events on the GPU, the host clock on the CPU, whose kernels are synchronous). The time charged to
// op i is the interval between stamp i-1 and stamp i: its kernels plus any time the device sat idle
// waiting for the host to enqueue it, so a launch-bound step shows up as many small ops whose sum is
// the step and whose kernels are far shorter. Keys are the op name, its input shapes and dtype, so
// that "matmul (16,256,512)x(512,1536) f32" and the same op at another shape are told apart.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/cuda.h"

namespace reel::tools {

class OpProfiler : public DispatchObserver {
 public:
  explicit OpProfiler(Device device);
  ~OpProfiler() override;

  void begin();  // installs the observer and takes the first stamp
  void end();    // removes it and charges the intervals to the ops seen since begin()

  void on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs, bool into_given) override;

  struct Row {
    std::string key;
    int64_t calls = 0;
    double ms = 0;
  };
  // Charges `ms` to an op and a kernel key directly (a compiled plan's kernels, timed by the plan).
  void record(const std::string& op, const std::string& kernel, double ms);

  // Accumulated over every begin()/end() window, heaviest first.
  std::vector<Row> by_op() const;      // keyed by op name
  std::vector<Row> by_kernel() const;  // keyed by op name, input shapes and dtype
  double total_ms() const { return total_ms_; }

 private:
  void stamp();

  Device device_;
  std::unique_ptr<cuda::EventLog> events_;  // GPU
  std::vector<double> host_stamps_ms_;      // CPU
  std::vector<std::pair<std::string, std::string>> pending_;  // (op, kernel key) per stamp after the first
  std::map<std::string, Row> ops_, kernels_;
  double total_ms_ = 0;
  DispatchObserver* previous_ = nullptr;
};

// Prints the `top` heaviest rows of each table, with the share of `step_ms` x `steps` they take.
void print_profile(const OpProfiler& p, int64_t steps, double step_ms, size_t top);

}  // namespace reel::tools
