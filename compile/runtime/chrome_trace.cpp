// ChromeTrace (see chrome_trace.h).
#include "compile/runtime/chrome_trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "compile/runtime/describe.h"
#include "kernels/phase.h"
#include "tensor/cuda.h"

namespace reel::compile {
namespace {

double host_now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A JSON string literal: quotes, backslashes and control characters escaped (op names and phases are
// plain, but a label is free text).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string args_json(const ChromeTrace::Args& args) {
  std::string out = "{";
  for (size_t i = 0; i < args.size(); ++i)
    out += (i ? ", " : "") + quoted(args[i].first) + ": " + quoted(args[i].second);
  return out + "}";
}

std::string shapes_of(const Node& n) {
  std::string s;
  for (const auto& r : n.inputs)
    if (r) s += (s.empty() ? "" : " ") + shape_str(r->shape);
  if (!n.outputs.empty()) s += std::string(s.empty() ? "" : " ") + dtype_name(n.outputs[0].dtype);
  return s;
}

}  // namespace

ChromeTrace::Row ChromeTrace::row(const std::string& process, const std::string& thread) {
  int pid = 0, last_pid = 0, tid = 0;
  for (const Named& n : rows_) {
    if (n.process == process && n.thread == thread) return n.row;
    if (n.process == process) pid = n.row.pid, tid = std::max(tid, n.row.tid);
    last_pid = std::max(last_pid, n.row.pid);
  }
  Row r{pid ? pid : last_pid + 1, tid + 1};
  rows_.push_back({process, thread, r});
  return r;
}

void ChromeTrace::span(Row row, const std::string& name, const std::string& category, double begin_us,
                       double end_us, Args args) {
  events_.push_back({name, category, begin_us, std::max(end_us, begin_us), row, std::move(args)});
}

void ChromeTrace::phase_spans(Row row, const std::vector<Timed>& items) {
  size_t i = 0;
  while (i < items.size()) {
    size_t j = i + 1;
    double end_us = items[i].end_us;
    while (j < items.size() && items[j].phase == items[i].phase) end_us = std::max(end_us, items[j++].end_us);
    if (!items[i].phase.empty())
      span(row, items[i].phase, "phase", items[i].begin_us, end_us, {{"kernels", std::to_string(j - i)}});
    i = j;
  }
}

size_t ChromeTrace::count(const std::string& category) const {
  return size_t(std::count_if(events_.begin(), events_.end(), [&](const Event& e) { return e.category == category; }));
}

std::string ChromeTrace::json() const {
  // Times from the first event, so the viewer's ruler starts at 0.
  double origin = events_.empty() ? 0 : events_[0].begin_us;
  for (const Event& e : events_) origin = std::min(origin, e.begin_us);
  std::string out = "{\"traceEvents\": [\n";
  bool first = true;
  auto line = [&](const std::string& event) {
    out += (first ? "  " : ",\n  ") + event;
    first = false;
  };
  std::vector<std::string> processes;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Named& n = rows_[i];
    const std::string pid = std::to_string(n.row.pid), tid = std::to_string(n.row.tid);
    if (std::find(processes.begin(), processes.end(), n.process) == processes.end()) {
      processes.push_back(n.process);
      line("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": 0, \"args\": {\"name\": " +
           quoted(n.process) + "}}");
      line("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"tid\": 0, \"args\": {\"sort_index\": " + pid + "}}");
    }
    line("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": " + tid +
         ", \"args\": {\"name\": " + quoted(n.thread) + "}}");
    line("{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": " + tid +
         ", \"args\": {\"sort_index\": " + tid + "}}");
  }
  for (const Event& e : events_)
    line("{\"name\": " + quoted(e.name) + ", \"cat\": " + quoted(e.category) + ", \"ph\": \"X\", \"ts\": " +
         number(e.begin_us - origin) + ", \"dur\": " + number(e.end_us - e.begin_us) +
         ", \"pid\": " + std::to_string(e.row.pid) + ", \"tid\": " + std::to_string(e.row.tid) +
         ", \"args\": " + args_json(e.args) + "}");
  return out + "\n], \"displayTimeUnit\": \"ms\"}\n";
}

void ChromeTrace::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    REEL_CHECK(f.good(), "trace: cannot write ", tmp);
    f << json();
    f.close();
    REEL_CHECK(f.good(), "trace: writing ", tmp, " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  REEL_CHECK(!ec, "trace: cannot rename ", tmp, " to ", path, ": ", ec.message());
}

bool plan_takes(const Plan& plan, const std::vector<Tensor>& inputs) {
  const Graph& g = plan.graph();
  if (inputs.size() != g.inputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorRef& r = g.inputs[i];
    if (inputs[i].shape() != r.shape || inputs[i].dtype() != r.dtype ||
        inputs[i].device() != g.buffers[size_t(r.buffer)].device)
      return false;
  }
  return true;
}

ChromeTrace trace_plan_call(Plan& plan, const std::vector<Tensor>& inputs) {
  // The plan copies each argument into its traced place: only arguments of its signature fit there.
  const Graph& g = plan.graph();
  REEL_CHECK(inputs.size() == g.inputs.size(), "trace: ", inputs.size(), " arguments for a plan of ", g.inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorRef& r = g.inputs[i];
    const Device traced = g.buffers[size_t(r.buffer)].device;
    REEL_CHECK(inputs[i].shape() == r.shape && inputs[i].dtype() == r.dtype && inputs[i].device() == traced,
               "trace: argument ", i, " is ", shape_str(inputs[i].shape()), " ", dtype_name(inputs[i].dtype()), " on ",
               inputs[i].device().str(), "; the plan was traced with ", shape_str(r.shape), " ", dtype_name(r.dtype),
               " on ", traced.str());
  }
  const std::vector<Plan::KernelSpan> spans = plan.trace(inputs);
  ChromeTrace t;
  const ChromeTrace::Row host = t.row("host", "host");
  // The host's phases: from each run's first launch (or CPU kernel) to its last.
  std::vector<ChromeTrace::Timed> host_items;
  for (const Plan::KernelSpan& k : spans)
    host_items.push_back({plan.graph().nodes[k.node].phase, k.host_begin_us, k.host_end_us});
  t.phase_spans(host, host_items);
  // Each device's kernels on its row, with the phases' spans there around them.
  std::vector<Device> devices;
  for (const Plan::KernelSpan& k : spans)
    if (std::find(devices.begin(), devices.end(), k.device) == devices.end()) devices.push_back(k.device);
  // A GPU's kernels on a row per stream of the plan (Node::stream: the main one, side lanes 1 and 2), so
  // that a phase's kernels on the main stream stay one span where another phase's run on a side lane
  // among them (a micro-batch's first forward kernels under the backward before it).
  static const char* kStreamRows[] = {"stream", "side stream 1", "side stream 2"};
  for (const Device& d : devices)
    for (int lane = 0; lane < 3; ++lane) {
      auto on_row = [&](const Plan::KernelSpan& k) {
        return k.device == d && (d.is_cuda() ? plan.graph().nodes[k.node].stream == lane : lane == 0);
      };
      if (std::none_of(spans.begin(), spans.end(), on_row)) continue;
      const ChromeTrace::Row row = d.is_cuda() ? t.row(d.str(), kStreamRows[lane]) : t.row("host", "kernels");
      std::vector<ChromeTrace::Timed> items;
      for (const Plan::KernelSpan& k : spans) {
        if (!on_row(k)) continue;
        const Node& n = plan.graph().nodes[k.node];
        ChromeTrace::Args args{{"phase", n.phase}, {"node", "k" + std::to_string(k.node)}};
        if (!n.fused.empty()) args.push_back({"ops", fused_str(n.fused)});
        args.push_back({"inputs", shapes_of(n)});
        const double b = d.is_cuda() ? k.device_begin_us : k.host_begin_us;
        const double e = d.is_cuda() ? k.device_end_us : k.host_end_us;
        if (d.is_cuda()) t.span(host, k.label, "launch", k.host_begin_us, k.host_end_us, {args[0], args[1]});
        t.span(row, k.label, "kernel", b, e, std::move(args));
        items.push_back({n.phase, b, e});
      }
      t.phase_spans(row, items);
    }
  return t;
}

EagerTraceRecorder::EagerTraceRecorder(ChromeTrace& trace) : trace_(trace), row_(trace.row("host", "host")) {}

EagerTraceRecorder::~EagerTraceRecorder() {
  if (active_) set_dispatch_observer(previous_);
}

void EagerTraceRecorder::begin() {
  REEL_ASSERT(!active_, "EagerTraceRecorder::begin while recording");
  ops_.clear();
  previous_ = set_dispatch_observer(this);
  active_ = true;
  last_us_ = host_now_us();
}

void EagerTraceRecorder::on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>&,
                                     const Attrs&, bool) {
  if (is_view_op(op)) return;  // no kernel ran
  const double now = host_now_us();
  std::string shapes;
  for (const Tensor& t : inputs)
    if (t.defined()) shapes += (shapes.empty() ? "" : " ") + shape_str(t.shape());
  trace_.span(row_, op_name(op), "op", last_us_, now, {{"phase", current_phase()}, {"inputs", shapes}});
  ops_.push_back({current_phase(), last_us_, now});
  last_us_ = now;
}

void EagerTraceRecorder::end() {
  if (!active_) return;
  set_dispatch_observer(previous_);
  active_ = false;
  trace_.phase_spans(row_, ops_);
  ops_.clear();
}

ChromeTrace trace_eager_call(const std::function<void()>& step, Device device) {
  ChromeTrace t;
  EagerTraceRecorder recorder(t);
  if (device.is_cuda()) cuda::synchronize(device.index);
  recorder.begin();
  step();
  recorder.end();
  if (device.is_cuda()) cuda::synchronize(device.index);
  return t;
}

}  // namespace reel::compile
