// ChromeTrace — one training step as a timeline in the Chrome trace-event format, the JSON that
// chrome://tracing and Perfetto (ui.perfetto.dev) open and PyTorch's profiler writes:
//
//   {"traceEvents": [
//     {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "host"}},
//     {"name": "matmul", "cat": "kernel", "ph": "X", "ts": 12.5, "dur": 3.25, "pid": 2, "tid": 1,
//      "args": {"phase": "micro-batch 0", ...}},
//     ...], "displayTimeUnit": "ms"}
//
// "X" events are complete spans (ts and dur in microseconds, here from the step's first event); "M"
// events name the rows: a row is a thread (tid) of a process (pid). The rows of a step:
//   host / host         what the launching thread did: the phases of the step ("micro-batch 0", ...,
//                       "optimizer": kernels/phase.h) and, for a GPU, each kernel's launch;
//   cuda:N / stream     a GPU's kernels as they ran on the stream (CUDA events), inside the phases'
//                       spans on the device; the kernels a plan runs on a side stream (Node::stream)
//                       on rows of their own, "side stream 1" and "side stream 2";
//   host / kernels      a compiled step's CPU kernels, which run on the host: timed by the host clock.
// A phase's span on a row runs from the first to the last of its kernels (or ops) there; consecutive
// kernels of one phase make one span, so spans on a row never overlap.
//
// Compiled: trace_plan_call runs one call of a plan kernel by kernel (Plan::trace, outside any CUDA
// graph, no waits between kernels), each kernel named as `reel bench --profile` names it ("matmul",
// "fused[layer_norm+cast]", with the fused ops in args). Eager: EagerTraceRecorder watches the dispatch
// door; each op's host span runs from the previous op's end to its own (its kernel, allocation and
// whatever host work preceded it: autograd's engine, the optimizer's loops), so the spans tile the step.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compile/runtime/plan.h"
#include "kernels/dispatch.h"

namespace reel::compile {

class ChromeTrace {
 public:
  using Args = std::vector<std::pair<std::string, std::string>>;  // string values
  struct Row {
    int pid = 0, tid = 0;
  };
  // The row `thread` of `process`, named in the viewer (rows and processes sort in creation order);
  // the same names give the same row.
  Row row(const std::string& process, const std::string& thread);
  // A complete span from begin_us to end_us of the host's steady clock.
  void span(Row row, const std::string& name, const std::string& category, double begin_us, double end_us,
            Args args = {});
  // A span named by its phase around each run of consecutive items sharing a non-empty phase.
  struct Timed {
    std::string phase;
    double begin_us, end_us;
  };
  void phase_spans(Row row, const std::vector<Timed>& items);

  size_t size() const { return events_.size(); }
  size_t count(const std::string& category) const;  // spans of that category ("kernel", "op", "phase")
  std::string json() const;
  // Written to `path`.tmp, then renamed: a reader never sees half a file.
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string name, category;
    double begin_us, end_us;
    Row row;
    Args args;
  };
  struct Named {
    std::string process, thread;
    Row row;
  };
  std::vector<Event> events_;
  std::vector<Named> rows_;
};

// One call of `plan` on `inputs` traced (Plan::trace): the rows above, the kernels of each device on
// theirs, each kernel's args its phase, node ("k12"), fused ops and input shapes. The inputs must have
// the signature the plan was traced with (plan_takes).
ChromeTrace trace_plan_call(Plan& plan, const std::vector<Tensor>& inputs);
bool plan_takes(const Plan& plan, const std::vector<Tensor>& inputs);  // shapes, dtypes and devices

// Records the ops the calling thread dispatches between begin() and end() into `trace`'s host row,
// with their phases around them. Views (no kernel) are left out.
class EagerTraceRecorder : public DispatchObserver {
 public:
  explicit EagerTraceRecorder(ChromeTrace& trace);
  ~EagerTraceRecorder() override;
  void begin();
  void end();
  void on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs, bool into_given) override;

 private:
  ChromeTrace& trace_;
  ChromeTrace::Row row_;
  std::vector<ChromeTrace::Timed> ops_;
  double last_us_ = 0;
  DispatchObserver* previous_ = nullptr;
  bool active_ = false;
};

// One eager call of `step` traced (the device is synchronised before and after it).
ChromeTrace trace_eager_call(const std::function<void()>& step, Device device);

}  // namespace reel::compile
