// Plan (see plan.h).
#include "compile/runtime/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "compile/runtime/describe.h"
#include "compile/passes/passes.h"
#include "compile/passes/side_stream.h"
#include "kernels/dispatch.h"

namespace reel::compile {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Default: return "default";
    case Mode::ReduceOverhead: return "reduce-overhead";
    case Mode::MaxAutotune: return "max-autotune";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "default") return Mode::Default;
  if (name == "reduce-overhead") return Mode::ReduceOverhead;
  if (name == "max-autotune") return Mode::MaxAutotune;
  throw Error("compile: unknown mode '" + name + "' (expected default, reduce-overhead or max-autotune)");
}

namespace {

// REEL_ARENA_OFFSET's bytes (see Plan::arena_offset), 0 when unset.
size_t arena_offset_from_env() {
  const char* env = std::getenv("REEL_ARENA_OFFSET");
  if (!env || !*env) return 0;
  const std::string v = env;
  const bool digits = v.size() <= 15 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  const size_t bytes = digits ? size_t(std::stoull(v)) : 1;
  REEL_CHECK(digits && bytes % 256 == 0, "REEL_ARENA_OFFSET: expected a count of bytes, a multiple of 256 (the "
             "alignment the arena gives every buffer), such as 34603008 (33 MiB); got '", v, "'");
  return bytes;
}

}  // namespace

Plan::Plan(Graph graph, Mode mode, PassOptions passes, std::shared_ptr<ArenaPool> pool)
    : graph_(optimize_graph(std::move(graph), passes, stats_)),
      mode_(mode),
      memory_(plan_memory(graph_)),
      pool_(std::move(pool)) {
  const size_t nb = graph_.buffers.size();
  storage_.resize(nb);
  byte_offset_.assign(nb, 0);
  arena_offset_ = arena_offset_from_env();
  for (const Arena& a : memory_.arenas)
    for (const Placement& p : a.placements) byte_offset_[p.buffer] = arena_offset_ + p.offset;
  for (Buffer& b : graph_.buffers) {
    if (b.kind == BufferKind::External) storage_[b.id] = b.storage;
    if (b.kind == BufferKind::Input) storage_[b.id] = std::make_shared<Storage>(std::max<size_t>(b.nbytes, 1), b.device);
    if (b.kind != BufferKind::External) b.storage.reset();  // the traced block is no longer needed
  }
  ensure_bound();
}

Plan::~Plan() {
  if (pool_) pool_->forget(this);
}

void Plan::bind_arenas() {
  for (const Arena& a : memory_.arenas) {
    const size_t bytes = arena_offset_ + a.bytes;
    std::shared_ptr<Storage> block = pool_ ? pool_->acquire(a.device, bytes, this)
                                           : std::make_shared<Storage>(std::max<size_t>(bytes, 1), a.device);
    for (const Placement& p : a.placements) storage_[p.buffer] = block;
  }
}

void Plan::ensure_bound() {
  if (bound_) return;
  bind_arenas();
  build_steps();
  build_segments();
  bound_ = true;
}

void Plan::release_arena(Device device) {
  for (const Arena& a : memory_.arenas)
    if (a.device == device)
      for (const Placement& p : a.placements) storage_[p.buffer].reset();
  // The steps' tensors view the block, and a captured graph holds its addresses: both go.
  steps_.clear();
  segments_.clear();
  bound_ = false;
}

Tensor Plan::bind(const TensorRef& r) const { return view_of(storage_[r.buffer], byte_offset_[r.buffer], r); }

void Plan::build_steps() {
  steps_.clear();
  input_views_.clear();
  const std::vector<int> joins = side_joins(graph_);
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    Step s{n.op, &n.attrs, {}, {}, true};
    for (const auto& r : n.inputs) {
      s.in.push_back(r ? bind(*r) : Tensor());
      if (r) s.on_gpu = s.on_gpu && graph_.buffers[r->buffer].device.is_cuda();
    }
    for (const TensorRef& r : n.outputs) {
      s.out.push_back(bind(r));
      s.on_gpu = s.on_gpu && graph_.buffers[r.buffer].device.is_cuda();
    }
    prepare_kernel(s.op, s.in, s.out, *s.attrs);
    if (!s.out.empty()) s.device = s.out[0].device().index;
    // A side-stream node runs beside the main stream only where it is captured with it or launched
    // on a GPU; its fork (a stream and events) is made here, outside any capture.
    if (joins[i] >= 0 && s.on_gpu) {
      s.join = joins[i];
      s.lane = n.stream;
      if (!forks_.count(s.device)) forks_[s.device] = std::make_unique<cuda::StreamFork>(s.device);
    }
    steps_.push_back(std::move(s));
  }
  for (const TensorRef& r : graph_.inputs) input_views_.push_back(bind(r));
}

void Plan::build_segments() {
  segments_.clear();
  const bool capture = mode_ != Mode::Default;
  size_t i = 0;
  while (i < steps_.size()) {
    size_t j = i;
    const bool gpu = capture && steps_[i].on_gpu;
    while (j < steps_.size() && (capture && steps_[j].on_gpu) == gpu) ++j;
    segments_.push_back(Segment{i, j, gpu, nullptr});
    i = j;
  }
}

size_t Plan::graphs() const {
  size_t n = 0;
  for (const Segment& s : segments_) n += s.graph ? 1 : 0;
  return n;
}

std::vector<GraphBreak> Plan::host_nodes() const {
  std::vector<GraphBreak> out;
  if (mode_ == Mode::Default) return out;
  for (const Step& s : steps_)
    if (!s.on_gpu) out.push_back({op_name(s.op), "touches host memory, so it runs between CUDA graphs"});
  return out;
}

void Plan::run_steps(size_t begin, size_t end) {
  struct Pending {
    size_t join;
    cuda::StreamFork* fork;
    int mark;
  };
  std::vector<Pending> pending;
  for (auto& [device, fork] : forks_) fork->clear();
  // The main stream waits for every forked step whose join is at or before step i.
  auto join_until = [&](size_t i) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->join > i) {
        ++it;
        continue;
      }
      it->fork->join(it->mark);
      it = pending.erase(it);
    }
  };
  for (size_t i = begin; i < end; ++i) {
    join_until(i);
    const Step& s = steps_[i];
    if (s.join < 0) {
      run_kernel(s.op, s.in, s.out, *s.attrs);
      continue;
    }
    cuda::StreamFork& fork = *forks_.at(s.device);
    fork.begin_side(s.lane);
    try {
      run_kernel(s.op, s.in, s.out, *s.attrs);
    } catch (...) {
      fork.join(fork.end_side());
      throw;
    }
    pending.push_back({size_t(s.join), &fork, fork.end_side()});
  }
  join_until(SIZE_MAX);
}

void Plan::reserve_random_numbers() {
  for (const RandomSource& r : graph_.random_sources) {
    const uint64_t base = r.generator->advance(r.span);
    Tensor host = Tensor::empty({2}, DType::i64, Device::cpu());
    uint64_t* v = static_cast<uint64_t*>(host.data_ptr());
    v[0] = r.generator->seed();
    v[1] = base;
    // Stream-ordered before the run's kernels (and its graphs' replays), as the arguments' copies are.
    for (int b : r.buffers) run_kernel(OpKind::Copy, {host}, {bind(TensorRef{b, {2}, {1}, 0, DType::i64})}, Attrs());
  }
}

void Plan::begin_call(const std::vector<Tensor>& inputs) {
  REEL_ASSERT(int(inputs.size()) == graph_.num_inputs, "compile: ", inputs.size(), " inputs for a plan of ",
              graph_.num_inputs);
  ensure_bound();
  reserve_random_numbers();
  // Arguments into the static input buffers, in the traced geometry (the guards checked shapes).
  for (size_t i = 0; i < inputs.size(); ++i) run_kernel(OpKind::Copy, {inputs[i]}, {input_views_[i]}, Attrs());
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs, bool capture) {
  begin_call(inputs);
  for (Segment& seg : segments_) {
    if (!seg.captured || (!capture && !seg.graph)) {
      run_steps(seg.begin, seg.end);
      continue;
    }
    if (!seg.graph) {
      int device = steps_[seg.begin].out.empty() ? 0 : steps_[seg.begin].out[0].device().index;
      seg.graph = std::make_unique<cuda::Graph>(device);
      seg.graph->capture_begin();
      try {
        run_steps(seg.begin, seg.end);
      } catch (...) {
        try { seg.graph->capture_end(); } catch (...) {}
        seg.graph.reset();
        throw;
      }
      seg.graph->capture_end();
    }
    seg.graph->replay();
  }
  std::vector<Tensor> out;
  for (const TensorRef& r : graph_.outputs) {
    Tensor v = bind(r);
    Tensor fresh = Tensor::empty(r.shape, r.dtype, graph_.buffers[r.buffer].device);
    run_kernel(OpKind::Copy, {v}, {fresh}, Attrs());
    out.push_back(fresh);
  }
  return out;
}

}  // namespace reel::compile

namespace reel::compile {

namespace {

// A kernel as profiles and traces name it: its op, or the ops a pass fused into it.
std::string kernel_label(const Node& n) {
  return n.fused.empty() ? std::string(op_name(n.op)) : "fused[" + fused_str(n.fused) + "]";
}

double host_now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<Plan::KernelTime> Plan::profile(const std::vector<Tensor>& inputs) {
  begin_call(inputs);
  std::vector<KernelTime> times;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Node& n = graph_.nodes[i];
    const Device device = steps_[i].out.empty() ? Device::cpu() : steps_[i].out[0].device();
    const std::string label = kernel_label(n);
    std::string key = label;
    for (const auto& r : n.inputs)
      if (r) key += " " + shape_str(r->shape);
    if (!n.outputs.empty()) key += std::string(" ") + dtype_name(n.outputs[0].dtype);
    double ms = 0;
    if (device.is_cuda()) {
      cuda::synchronize(device.index);
      cuda::EventLog log(device.index);
      log.mark();
      run_steps(i, i + 1);
      log.mark();
      ms = log.intervals_ms()[0];
    } else {
      auto t0 = std::chrono::steady_clock::now();
      run_steps(i, i + 1);
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    times.push_back({label, key, ms});
  }
  return times;
}

std::vector<Plan::KernelSpan> Plan::trace(const std::vector<Tensor>& inputs) {
  begin_call(inputs);
  // Per GPU: an event log, and the host time of its first event. The device is idle when that event is
  // recorded and the host time is read once it has completed, so the host time is at or after the
  // event's own: kernels placed on the host's clock from it never appear before their launch.
  struct Stream {
    std::unique_ptr<cuda::EventLog> log;
    double start_us = 0;
  };
  std::map<int, Stream> streams;
  for (const Step& s : steps_)
    if (!s.out.empty() && s.out[0].device().is_cuda() && !streams.count(s.out[0].device().index)) {
      const int d = s.out[0].device().index;
      Stream& st = streams[d];
      st.log = std::make_unique<cuda::EventLog>(d);
      cuda::synchronize(d);
      st.log->mark();
      cuda::synchronize(d);
      st.start_us = host_now_us();
    }
  std::vector<KernelSpan> spans;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Device device = steps_[i].out.empty() ? Device::cpu() : steps_[i].out[0].device();
    cuda::EventLog* log = device.is_cuda() ? streams.at(device.index).log.get() : nullptr;
    // No synchronisation between kernels: the events only stamp the stream as it goes. The host time
    // is read before the kernel's first event is recorded: the event completes after it is recorded,
    // so the kernel cannot appear to start before its launch span does (reading the clock after the
    // record let an idle stream's event land a microsecond or two before it).
    const double h0 = host_now_us();
    if (log) log->mark();
    run_steps(i, i + 1);
    const double h1 = host_now_us();
    if (log) log->mark();
    spans.push_back(KernelSpan{i, kernel_label(graph_.nodes[i]), device, h0, h1});
  }
  // Each GPU's marks: its start, then a (before, after) pair per kernel of it, in order.
  for (auto& [d, st] : streams) {
    const std::vector<double> gaps = st.log->intervals_ms();
    double at_us = st.start_us;
    size_t g = 0;
    for (KernelSpan& k : spans) {
      if (!k.device.is_cuda() || k.device.index != d) continue;
      k.device_begin_us = at_us += gaps.at(g++) * 1e3;
      k.device_end_us = at_us += gaps.at(g++) * 1e3;
    }
  }
  return spans;
}

}  // namespace reel::compile
