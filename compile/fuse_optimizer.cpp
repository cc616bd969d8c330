// Horizontal fusion of the optimizer step (see fuse_optimizer.h): the pass, and the fused kernel
// that runs a run of adamw_step / sgd_step nodes as one.
//
// The kernel reads its tensors from the node's bound inputs and outputs. A plan binds every buffer
// once, so the table of tensors (pointers, sizes, dtypes; on the GPU the launch tables of
// kernels/cuda/multi_tensor_optim.h) is built on the first run and reused; it is rebuilt only if a
// later run brings other memory. On the GPU that first run may be inside a CUDA-graph capture
// (reduce-overhead mode): building the table is host work only and the launch carries the table as
// kernel arguments, so nothing is allocated or copied while capturing.
#include "compile/fuse_optimizer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cuda/multi_tensor_optim.h"
#include "kernels/optim_math.h"

namespace reel::compile {
namespace {

// How an optimizer op's inputs divide: the leading ones belong to one tensor (param, grad, state),
// the trailing ones are read by every node of a step (found_inf?, lr, and AdamW's step count).
struct StepLayout {
  OpKind op;
  size_t per_tensor;
  size_t shared;
};
constexpr StepLayout kLayouts[] = {{OpKind::AdamWStep, 4, 3}, {OpKind::SgdStep, 3, 2}};

const StepLayout* layout_of(OpKind op) {
  for (const StepLayout& l : kLayouts)
    if (l.op == op) return &l;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// The fused kernel.

constexpr int64_t kCpuChunk = int64_t(1) << 14;  // elements per unit of CPU work

// A piece of one tensor for a CPU thread: elements [begin, end) of tensors_[tensor].
struct CpuChunk {
  size_t tensor;
  int64_t begin, end;
};

class MultiTensorStep : public FusedKernel {
 public:
  MultiTensorStep(OpKind op, Attrs attrs, size_t tensors, Device device)
      : op_(op), attrs_(std::move(attrs)), k_(tensors), device_(device) {}

  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    const StepLayout& l = *layout_of(op_);
    const size_t tail = k_ * l.per_tensor;
    const Tensor& found_inf = in[tail];
    const Tensor& lr = in[tail + 1];
    const Tensor* step = op_ == OpKind::AdamWStep ? &in[tail + 2] : nullptr;
    bind(in, out);
    if (device_.is_cuda()) run_cuda(found_inf, lr, step);
    else run_cpu(found_inf, lr, step);
  }

  std::string name() const override {
    return std::string("multi_tensor_") + (op_ == OpKind::AdamWStep ? "adamw" : "sgd") + " (" + std::to_string(k_) +
           " tensors)";
  }

 private:
  void bind(const std::vector<Tensor>& in, const std::vector<Tensor>& out);
  void build_tables();
  void run_cpu(const Tensor& found_inf, const Tensor& lr, const Tensor* step) const;
  void run_cuda(const Tensor& found_inf, const Tensor& lr, const Tensor* step) const;
  template <typename T>
  void cpu_chunk(const CpuChunk& c, double lr, double t) const;

  OpKind op_;
  Attrs attrs_;
  size_t k_;
  Device device_;
  std::vector<cuda::OptimTensor> tensors_;  // as bound on the last run
  std::vector<CpuChunk> chunks_;
#ifdef REEL_CUDA
  std::unique_ptr<cuda::MultiTensorList> gpu_;
#endif
};

// The tensors of the run from the bound inputs and outputs (layouts in fuse_optimizer.h); the tables
// are rebuilt only when the memory differs from the last run's.
void MultiTensorStep::bind(const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  const StepLayout& l = *layout_of(op_);
  const size_t out_per_tensor = out.size() / k_;
  std::vector<cuda::OptimTensor> now(k_);
  for (size_t i = 0; i < k_; ++i) {
    const Tensor& p = in[i * l.per_tensor];
    cuda::OptimTensor& t = now[i];
    t.dtype = p.dtype();
    t.numel = p.numel();
    t.param = out[i * out_per_tensor].data_ptr();
    t.grad = in[i * l.per_tensor + 1].data_ptr();
    if (op_ == OpKind::AdamWStep) {
      t.state0 = out[i * out_per_tensor + 1].data_ptr();
      t.state1 = out[i * out_per_tensor + 2].data_ptr();
    } else if (out_per_tensor == 2 && attrs_.f("momentum") != 0) {  // as sgd_step: a buffer only with momentum
      t.state0 = out[i * out_per_tensor + 1].data_ptr();
    }
  }
  auto same = [](const cuda::OptimTensor& a, const cuda::OptimTensor& b) {
    return a.dtype == b.dtype && a.numel == b.numel && a.param == b.param && a.grad == b.grad &&
           a.state0 == b.state0 && a.state1 == b.state1;
  };
  if (now.size() == tensors_.size() && std::equal(now.begin(), now.end(), tensors_.begin(), same)) return;
  tensors_ = std::move(now);
  build_tables();
}

void MultiTensorStep::build_tables() {
  const char* op = op_name(op_);
  for (const cuda::OptimTensor& t : tensors_)
    REEL_CHECK(is_floating(t.dtype), op, ": dtype ", dtype_name(t.dtype), " of a ", t.numel,
               "-element parameter is not supported (expected f32, f64, f16 or bf16)");
  chunks_.clear();
  if (device_.is_cuda()) {
#ifdef REEL_CUDA
    gpu_ = std::make_unique<cuda::MultiTensorList>(device_.index, tensors_, op);
#endif
    return;
  }
  for (size_t i = 0; i < tensors_.size(); ++i)
    for (int64_t b = 0; b < tensors_[i].numel; b += kCpuChunk)
      chunks_.push_back({i, b, std::min(b + kCpuChunk, tensors_[i].numel)});
}

// One chunk on the CPU: the per-tensor kernels' loops of kernels/cpu/optim.cpp over [begin, end).
template <typename T>
void MultiTensorStep::cpu_chunk(const CpuChunk& c, double lr, double t) const {
  using A = AccType<T>;
  const cuda::OptimTensor& x = tensors_[c.tensor];
  T* p = static_cast<T*>(x.param);
  const T* g = static_cast<const T*>(x.grad);
  const Attrs& a = attrs_;
  if (op_ == OpKind::AdamWStep) {
    T* m = static_cast<T*>(x.state0);
    T* v = static_cast<T*>(x.state1);
    const auto s = math::adamw_scalars<A>(a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"), lr, t);
    for (int64_t i = c.begin; i < c.end; ++i) {
      A pi = load(p[i]), mi = load(m[i]), vi = load(v[i]);
      math::adamw_update(pi, load(g[i]), mi, vi, s);
      p[i] = store<T>(pi);
      m[i] = store<T>(mi);
      v[i] = store<T>(vi);
    }
    return;
  }
  T* buf = static_cast<T*>(x.state0);
  const auto s = math::sgd_scalars<A>(lr, a.f("momentum"), a.f("dampening"), a.f("weight_decay"), a.b("nesterov"),
                                      a.b("first_step"));
  for (int64_t i = c.begin; i < c.end; ++i) {
    A pi = load(p[i]);
    A bi = buf ? load(buf[i]) : A(0);
    math::sgd_update(pi, load(g[i]), buf != nullptr, bi, s);
    p[i] = store<T>(pi);
    if (buf) buf[i] = store<T>(bi);
  }
}

// found_inf, lr and the step count are CPU tensors here, read on the host as the CPU kernels do.
void MultiTensorStep::run_cpu(const Tensor& found_inf, const Tensor& lr, const Tensor* step) const {
  if (found_inf.defined() && *found_inf.data<float>() != 0.f) return;
  const double lr_v = *lr.data<double>(), t = step ? *step->data<double>() : 0.0;
  int64_t total = 0;
  for (const cuda::OptimTensor& x : tensors_) total += x.numel;
  const int64_t n = int64_t(chunks_.size());
  // Dtypes were checked when the table was built, so nothing below throws inside the parallel loop.
#pragma omp parallel for schedule(dynamic, 1) if (total >= cpu::kParallelGrain)
  for (int64_t c = 0; c < n; ++c) {
    const CpuChunk& chunk = chunks_[c];
    visit_float_dtype(tensors_[chunk.tensor].dtype, op_name(op_),
                      [&]<typename T>() { cpu_chunk<T>(chunk, lr_v, t); });
  }
}

void MultiTensorStep::run_cuda(const Tensor& found_inf, const Tensor& lr, const Tensor* step) const {
#ifdef REEL_CUDA
  const float* flag = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  const double* lr_p = static_cast<const double*>(lr.data_ptr());
  const Attrs& a = attrs_;
  if (op_ == OpKind::AdamWStep) {
    gpu_->adamw(flag, lr_p, static_cast<const double*>(step->data_ptr()),
                {a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay")});
  } else {
    gpu_->sgd(flag, lr_p,
              {a.f("momentum"), a.f("dampening"), a.f("weight_decay"), a.b("nesterov"), a.b("first_step")});
  }
#else
  throw Error(detail::cat(op_name(op_), ": a fused update of ", k_, " tensors on ", device_.str(),
                          " needs the CUDA backend, which this build lacks"));
#endif
}

// ---------------------------------------------------------------------------------------------
// The pass.

bool same_ref(const std::optional<TensorRef>& a, const std::optional<TensorRef>& b) {
  return a.has_value() == b.has_value() && (!a || same_ref(*a, *b));
}

// The bytes a ref spans in its buffer (optimizer tensors are contiguous: the schema checks it).
struct Span {
  int buffer;
  size_t begin, end;
};

Span span_of(const TensorRef& r) {
  const size_t begin = size_t(r.offset) * dtype_size(r.dtype);
  return {r.buffer, begin, begin + r.nbytes()};
}

bool overlaps(const Span& a, const Span& b) { return a.buffer == b.buffer && a.begin < b.end && b.begin < a.end; }

bool overlaps_any(const Span& s, const std::vector<Span>& set) {
  return std::any_of(set.begin(), set.end(), [&](const Span& t) { return overlaps(s, t); });
}

// The one device every ref of node n lives on, or nullopt if they differ.
std::optional<Device> device_of(const Graph& g, const Node& n) {
  std::optional<Device> d;
  auto see = [&](const TensorRef& r) {
    const Device& b = g.buffers[r.buffer].device;
    if (!d) d = b;
    return *d == b;
  };
  for (const auto& r : n.inputs)
    if (r && !see(*r)) return std::nullopt;
  for (const TensorRef& r : n.outputs)
    if (!see(r)) return std::nullopt;
  return d;
}

// A node the pass can take: an optimizer op as traced (no pass kernel yet), on a device whose
// multi-tensor kernel is built.
bool candidate(const Graph& g, const Node& n) {
  const StepLayout* l = layout_of(n.op);
  if (!l || n.kernel || n.inputs.size() != l->per_tensor + l->shared || n.outputs.empty()) return false;
  if (!n.inputs[0] || !n.inputs[1]) return false;
  std::optional<Device> d = device_of(g, n);
  if (!d) return false;
#ifndef REEL_CUDA
  if (d->is_cuda()) return false;
#endif
  return true;
}

// A run being grown: its first node and the memory its members touch.
struct Run {
  const Node* first = nullptr;
  std::optional<Device> device;
  std::vector<Span> written, touched, shared;
};

// Whether n (a candidate) may join `run`: the same op, attrs, step-wide refs, device and optional
// inputs, and memory that cannot see the other members' updates (nor change what they read).
bool joins(const Graph& g, const Run& run, const Node& n) {
  const Node& f = *run.first;
  const StepLayout& l = *layout_of(f.op);
  if (n.op != f.op || n.attrs.items() != f.attrs.items() || n.outputs.size() != f.outputs.size()) return false;
  if (device_of(g, n) != run.device) return false;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i >= l.per_tensor && !same_ref(n.inputs[i], f.inputs[i])) return false;
    if (i < l.per_tensor && n.inputs[i].has_value() != f.inputs[i].has_value()) return false;
  }
  for (size_t i = 0; i < l.per_tensor; ++i)
    if (n.inputs[i] && overlaps_any(span_of(*n.inputs[i]), run.written)) return false;
  for (const TensorRef& r : n.outputs) {
    const Span s = span_of(r);
    if (overlaps_any(s, run.touched) || overlaps_any(s, run.shared)) return false;
  }
  return true;
}

void add_to_run(const Graph& g, Run& run, const Node& n) {
  const StepLayout& l = *layout_of(n.op);
  if (!run.first) {
    run.first = &n;
    run.device = device_of(g, n);
    for (size_t i = l.per_tensor; i < n.inputs.size(); ++i)
      if (n.inputs[i]) run.shared.push_back(span_of(*n.inputs[i]));
  }
  for (size_t i = 0; i < l.per_tensor; ++i)
    if (n.inputs[i]) run.touched.push_back(span_of(*n.inputs[i]));
  for (const TensorRef& r : n.outputs) {
    run.written.push_back(span_of(r));
    run.touched.push_back(span_of(r));
  }
}

// The one node that replaces nodes [begin, end) (at least two, all of one run).
Node fuse_run(const Graph& g, const std::vector<Node>& nodes, size_t begin, size_t end) {
  const Node& f = nodes[begin];
  const StepLayout& l = *layout_of(f.op);
  Node fused{f.op, f.attrs, {}, {}, true, {}, nullptr};
  for (size_t i = begin; i < end; ++i) {
    const Node& n = nodes[i];
    fused.inputs.insert(fused.inputs.end(), n.inputs.begin(), n.inputs.begin() + long(l.per_tensor));
    fused.outputs.insert(fused.outputs.end(), n.outputs.begin(), n.outputs.end());
    fused.fused.push_back(op_name(n.op));
  }
  fused.inputs.insert(fused.inputs.end(), f.inputs.begin() + long(l.per_tensor), f.inputs.end());
  fused.kernel = std::make_shared<MultiTensorStep>(f.op, f.attrs, end - begin, *device_of(g, f));
  return fused;
}

}  // namespace

void fuse_optimizer(Graph& g, PassStats& stats) {
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  size_t i = 0;
  while (i < g.nodes.size()) {
    if (!candidate(g, g.nodes[i])) {
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    Run run;
    add_to_run(g, run, g.nodes[i]);
    size_t j = i + 1;
    while (j < g.nodes.size() && candidate(g, g.nodes[j]) && joins(g, run, g.nodes[j]))
      add_to_run(g, run, g.nodes[j++]);
    if (j - i == 1) {
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    out.push_back(fuse_run(g, g.nodes, i, j));
    stats.fused += j - i - 1;
    i = j;
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
