// Tracer (see trace.h).
#include "compile/ir/trace.h"

#include <algorithm>

#include "kernels/phase.h"

namespace reel::compile {

namespace {

// Why a replay could not honour `op`, or "" when it can. A copy to the host replays (it is a host
// node between CUDA graphs); what host code then reads from it is on_host_read's to report.
std::string break_reason(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (op == OpKind::Copy && !inputs.empty() && inputs[0].defined() && inputs[0].device().is_cuda() &&
      !outputs.empty() && outputs[0].device().is_cpu())
    return "copies a device tensor to the host, which waits for the device";
  return "";
}

}  // namespace

Tracer::Tracer(const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    REEL_CHECK(inputs[i].defined(), "compile: input ", i, " is undefined");
    // Inputs may share memory (micro-batches sliced from one batch): one Input buffer each storage,
    // every argument copied into its traced place in it on each call.
    int id = buffer_of(inputs[i], BufferKind::Input);
    Buffer& b = graph_.buffers[id];
    if (b.input_index < 0) b.input_index = int(i);
    graph_.inputs.push_back(ref_of(inputs[i], BufferKind::Input));
  }
  graph_.num_inputs = int(inputs.size());
}

Tracer::~Tracer() { stop(); }

void Tracer::start() {
  if (active_) return;
  previous_ = set_dispatch_observer(this);
  previous_draws_ = set_draw_observer(this);
  active_ = true;
}

void Tracer::stop() {
  if (!active_) return;
  set_dispatch_observer(previous_);
  set_draw_observer(previous_draws_);
  active_ = false;
}

int Tracer::buffer_of(const Tensor& t, BufferKind kind_if_new) {
  const Storage* s = t.storage().get();
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  Buffer b;
  b.id = int(graph_.buffers.size());
  b.kind = kind_if_new;
  b.nbytes = s->nbytes();
  b.device = s->device();
  b.storage = t.storage();
  graph_.buffers.push_back(b);
  ids_[s] = b.id;
  if (b.kind == BufferKind::Internal) held_.push_back(b.id);
  return b.id;
}

void Tracer::note_releases() {
  // Called after each recorded node: a block referenced by the tracer alone was freed by the program
  // since the previous node. Freed while this node ran when it was one of the node's inputs (the
  // caller held it for the call); otherwise before the node allocated its outputs.
  const Node& n = graph_.nodes.back();
  const int at = int(graph_.nodes.size()) - 1;
  auto is_input = [&](int id) {
    for (const auto& r : n.inputs)
      if (r && r->buffer == id) return true;
    return false;
  };
  size_t kept = 0;
  for (int id : held_) {
    Buffer& b = graph_.buffers[id];
    if (b.storage.use_count() > 1) {
      held_[kept++] = id;
      continue;
    }
    b.released_after = is_input(id) ? at : at - 1;
    // Let the memory go as eager execution would: the buffer keeps a meta block of its size (passes
    // look only at sizes and geometry), and its address is forgotten, so a later block there is a
    // new buffer.
    ids_.erase(b.storage.get());
    b.storage = std::make_shared<Storage>(Storage::Meta{}, b.nbytes, b.device);
  }
  held_.resize(kept);
}

TensorRef Tracer::ref_of(const Tensor& t, BufferKind kind_if_new) {
  return TensorRef{buffer_of(t, kind_if_new), t.shape(), t.strides(), t.offset(), t.dtype()};
}

void Tracer::on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                         const Attrs& attrs, bool into_given) {
  if (!is_random_op(op)) flush_host_draws();
  if (is_view_op(op)) return;  // its output is a TensorRef of the input's buffer
  std::string reason = break_reason(op, inputs, outputs);
  if (!reason.empty()) breaks_.push_back({op_name(op), reason, false});
  Node n{op, attrs, {}, {}, into_given, {}};
  n.phase = current_phase();
  for (const Tensor& t : inputs) {
    if (t.defined()) n.inputs.push_back(ref_of(t, BufferKind::External));
    else n.inputs.push_back(std::nullopt);
  }
  // A fresh output is memory this op allocated; an output given to dispatch_out existed before.
  for (const Tensor& t : outputs)
    n.outputs.push_back(ref_of(t, into_given ? BufferKind::External : BufferKind::Internal));
  if (is_random_op(op)) bind_random(n);
  flush_host_draws();
  graph_.nodes.push_back(std::move(n));
  note_releases();
}

void Tracer::on_draw(Generator& gen, uint64_t offset, uint64_t counters) { pending_.push_back({&gen, offset, counters}); }

void Tracer::flush_host_draws() {
  for (const Draw& d : pending_)
    breaks_.push_back({"random draw",
                       detail::cat("host code drew ", d.counters, " Philox counters from a generator (offset ", d.offset,
                                   ") that no random op used: a replay would reuse the numbers seen when tracing"),
                       true});
  pending_.clear();
}

void Tracer::bind_random(Node& n) {
  const uint64_t seed = uint64_t(n.attrs.i("seed")), offset = uint64_t(n.attrs.i("offset"));
  auto d = std::find_if(pending_.begin(), pending_.end(),
                        [&](const Draw& p) { return p.gen->seed() == seed && p.offset == offset; });
  if (d == pending_.end()) return;  // seed and offset given by hand: the same numbers every run
  const Draw draw = *d;
  pending_.erase(d);
  auto s = std::find_if(sources_.begin(), sources_.end(), [&](const auto& e) { return e.first == draw.gen; });
  if (s == sources_.end()) {
    sources_.push_back({draw.gen, Source{draw.offset, draw.offset, {}}});
    s = sources_.end() - 1;
  }
  Source& src = s->second;
  src.end = std::max(src.end, draw.offset + draw.counters);
  const Device device = n.outputs.at(0).buffer >= 0 ? graph_.buffers[n.outputs[0].buffer].device : Device::cpu();
  auto st = std::find_if(src.state.begin(), src.state.end(), [&](const auto& e) { return e.first == device; });
  if (st == src.state.end()) {
    Buffer b;
    b.id = int(graph_.buffers.size());
    b.kind = BufferKind::External;
    b.nbytes = 2 * sizeof(int64_t);
    b.device = device;
    // Real memory, or a meta block of its size when the step is only being planned (meta mode).
    b.storage = meta_mode() ? std::make_shared<Storage>(Storage::Meta{}, b.nbytes, device)
                            : std::make_shared<Storage>(b.nbytes, device);
    graph_.buffers.push_back(b);
    src.state.push_back({device, b.id});
    st = src.state.end() - 1;
  }
  // The base is the generator's first draw in the call; draws only move forward, so offset >= base.
  n.inputs.push_back(TensorRef{st->second, {2}, {1}, 0, DType::i64});
  n.attrs.set("offset", int64_t(draw.offset - src.base));
}

// Host code reads values no op records, so whatever it computes from them (a scalar passed on to
// an op, a branch) would be frozen into a plan: the call's result depends on the read, and the
// signature runs eagerly, as torch.compile graph-breaks at .item().
void Tracer::on_host_read(const Tensor& t) {
  breaks_.push_back({"item", detail::cat("reads a ", t.defined() ? t.device().str() : std::string("undefined"),
                                         " tensor's values on the host (item, to_vector): a replay would reuse "
                                         "the values seen when tracing"),
                     true});
}

Graph Tracer::finish(const std::vector<Tensor>& outputs) {
  REEL_ASSERT(!active_, "Tracer::finish while tracing");
  flush_host_draws();
  for (const auto& [gen, src] : sources_) {
    RandomSource r{gen, src.end - src.base, {}};
    for (const auto& [device, buffer] : src.state) r.buffers.push_back(buffer);
    graph_.random_sources.push_back(std::move(r));
  }
  sources_.clear();
  std::unordered_map<int, long> output_refs;  // references the returned tensors hold, per buffer
  for (const Tensor& t : outputs) {
    REEL_CHECK(t.defined(), "compile: the step function returned an undefined tensor");
    graph_.outputs.push_back(ref_of(t, BufferKind::External));
    output_refs[graph_.outputs.back().buffer] += 1;
  }
  for (Buffer& b : graph_.buffers) {
    if (b.kind != BufferKind::Internal) continue;
    // Our own reference, plus the returned tensors': anything beyond is state held outside the step.
    long expected = 1 + output_refs[b.id];
    if (b.storage.use_count() > expected) b.kind = BufferKind::External;
  }
  Graph g = std::move(graph_);
  graph_ = Graph();
  ids_.clear();
  held_.clear();
  return g;
}

}  // namespace reel::compile
