// compile() (see compile.h).
#include "compile/runtime/compile.h"

#include <algorithm>
#include <cstdio>

#include "autograd/ops.h"
#include "compile/runtime/describe.h"
#include "tensor/log.h"
#include "kernels/autotune.h"
#include "kernels/dispatch.h"

namespace reel::compile {

namespace {

// The pass pipeline's options of a compiled function.
PassOptions pass_options(const CompileOptions& o) {
  PassOptions p(o.fuse, o.disabled_passes, o.memory_limit);
  p.enabled = o.enabled_passes;
  return p;
}

struct InputMeta {
  Shape shape;
  DType dtype;
  Device device;
  bool operator==(const InputMeta& o) const { return shape == o.shape && dtype == o.dtype && device == o.device; }
};

using Signature = std::vector<InputMeta>;

Signature signature_of(const std::vector<Tensor>& inputs) {
  Signature s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    REEL_CHECK(inputs[i].defined(), "compile: input ", i, " is undefined");
    s.push_back({inputs[i].shape(), inputs[i].dtype(), inputs[i].device()});
  }
  return s;
}

std::string meta_str(const InputMeta& m) {
  return shape_str(m.shape) + " " + dtype_name(m.dtype) + " " + m.device.str();
}

// Why `now` misses `cached`: the first differing argument.
std::string mismatch(const Signature& now, const Signature& cached) {
  if (now.size() != cached.size())
    return detail::cat(now.size(), " arguments, traced with ", cached.size());
  for (size_t i = 0; i < now.size(); ++i)
    if (!(now[i] == cached[i])) return detail::cat("input ", i, " is ", meta_str(now[i]), ", traced as ", meta_str(cached[i]));
  return "identical";
}

void check_buckets(const LengthBuckets& b) {
  REEL_CHECK(!b.inputs.empty() && b.inputs.size() == b.pad_values.size(), "compile: length buckets need one pad "
             "value per bucketed input, got ", b.inputs.size(), " inputs and ", b.pad_values.size(), " pad values");
  REEL_CHECK(!b.sizes.empty(), "compile: length buckets need at least one size");
  for (size_t i = 0; i < b.sizes.size(); ++i)
    REEL_CHECK(b.sizes[i] > 0 && (i == 0 || b.sizes[i] > b.sizes[i - 1]),
               "compile: bucket sizes must be positive and ascending, got ", b.sizes[i], " at position ", i);
}

// The call's arguments with the bucketed dims padded up to the bucket of their longest; `bucket` and
// `length` get the bucket chosen and the longest length.
std::vector<Tensor> pad_to_bucket(const std::vector<Tensor>& in, const LengthBuckets& b, int64_t& bucket,
                                  int64_t& length) {
  length = 0;
  for (size_t i : b.inputs) {
    REEL_CHECK(i < in.size(), "compile: length buckets name input ", i, " of a call with ", in.size(), " inputs");
    REEL_CHECK(in[i].defined() && b.dim >= 0 && b.dim < in[i].dim(), "compile: length buckets pad dim ", b.dim,
               " of input ", i, ", which has shape ", in[i].defined() ? shape_str(in[i].shape()) : "undefined");
    length = std::max(length, in[i].size(b.dim));
  }
  auto fit = std::lower_bound(b.sizes.begin(), b.sizes.end(), length);
  REEL_CHECK(fit != b.sizes.end(), "compile: length ", length, " along dim ", b.dim,
             " is above the largest bucket, ", b.sizes.back(), " (CompileOptions::buckets)");
  bucket = *fit;
  std::vector<Tensor> out = in;
  NoGradGuard no_grad;
  for (size_t k = 0; k < b.inputs.size(); ++k) {
    Tensor& x = out[b.inputs[k]];
    if (x.size(b.dim) == bucket) continue;
    Shape pad_shape = x.shape();
    pad_shape[size_t(b.dim)] = bucket - x.size(b.dim);
    x = concat({x, full(pad_shape, b.pad_values[k], TensorOptions{x.dtype(), x.device()})}, b.dim);
  }
  return out;
}

}  // namespace

std::vector<int64_t> LengthBuckets::powers_of_two(int64_t smallest, int64_t largest) {
  REEL_CHECK(smallest > 0 && largest >= smallest, "compile: powers_of_two(", smallest, ", ", largest,
             ") needs 0 < smallest <= largest");
  std::vector<int64_t> out;
  for (int64_t s = smallest; s < largest; s *= 2) out.push_back(s);
  out.push_back(largest);
  return out;
}

std::string signature_str(const std::vector<Tensor>& inputs) {
  std::string out;
  for (const InputMeta& m : signature_of(inputs)) out += (out.empty() ? "" : ", ") + meta_str(m);
  return out;
}

struct CompiledFunction::State {
  StepFn fn;
  CompileOptions options;
  // One arena per device for all the plans (arena_pool.h): calls run one at a time. Declared before
  // entries, so that the plans, which deregister from it, are destroyed first.
  std::shared_ptr<ArenaPool> arenas = std::make_shared<ArenaPool>();
  struct Entry {
    Signature sig;
    int calls = 0;
    std::unique_ptr<Plan> plan;
    bool eager_only = false;
  };
  std::vector<Entry> entries;
  const Plan* last = nullptr;
  int traces = 0, replays = 0, eager = 0;
  bool warned_limit = false;
  std::vector<GraphBreak> breaks;
  std::map<int64_t, int64_t> bucket_calls;

  std::vector<Tensor> eager_call(const std::vector<Tensor>& in) {
    ++eager;
    last = nullptr;
    return fn(in);
  }

  std::vector<Tensor> trace_call(Entry& e, const std::vector<Tensor>& in) {
    Tracer tracer(in);
    tracer.start();
    std::vector<Tensor> out;
    try {
      out = fn(in);
    } catch (...) {
      tracer.stop();
      throw;
    }
    tracer.stop();
    Graph g = tracer.finish(out);
    ++traces;
    ++eager;
    last = nullptr;
    for (const GraphBreak& b : tracer.breaks()) {
      breaks.push_back(b);
      log_line("graph_breaks", detail::cat("graph break at ", b.op, ": ", b.reason));
    }
    bool eager_only = false;
    for (const GraphBreak& b : tracer.breaks()) eager_only = eager_only || b.eager;
    if (eager_only) {
      e.eager_only = true;
      log_line("graph_breaks", "this signature runs eagerly from now on");
      return out;
    }
    build_plan(e, std::move(g));
    return out;
  }

  // The entry's plan from a traced graph, in the function's shared arena; its host nodes reported.
  void build_plan(Entry& e, Graph g) {
    e.plan = std::make_unique<Plan>(std::move(g), options.mode, pass_options(options), arenas);
    for (const GraphBreak& b : e.plan->host_nodes()) breaks.push_back(b);
    if (log_enabled("plan")) log_line("plan", plan_summary(*e.plan));
    if (log_enabled("memory")) log_line("memory", memory_summary(*e.plan));
  }

  // CompileOptions::trace_without_running: the call traced in meta mode, its plan built and run.
  std::vector<Tensor> meta_trace_call(Entry& e, const std::vector<Tensor>& in) {
    Tracer tracer(in);
    std::vector<Tensor> out;
    {
      MetaModeGuard meta;
      tracer.start();
      try {
        out = fn(in);
      } catch (const Error& err) {
        tracer.stop();
        throw Error(detail::cat("compile: tracing without running (CompileOptions::trace_without_running) failed: ",
                                err.what()));
      }
      tracer.stop();
    }
    Graph g = tracer.finish(out);
    ++traces;
    for (const GraphBreak& b : tracer.breaks())
      throw Error(detail::cat("compile: tracing without running: graph break at ", b.op, " (", b.reason,
                              "); a function that needs its values on the host must run its first calls eagerly"));
    // The generators' state blocks (the seed and base each run writes before its kernels) were made
    // as meta blocks by the trace: the plan needs real ones.
    for (const RandomSource& r : g.random_sources)
      for (int b : r.buffers)
        if (g.buffers[b].storage && g.buffers[b].storage->is_meta())
          g.buffers[b].storage = std::make_shared<Storage>(g.buffers[b].nbytes, g.buffers[b].device);
    // Memory the step found, but made in meta mode: state the function creates on its first call.
    for (const Buffer& b : g.buffers)
      if (b.kind == BufferKind::External && b.storage && b.storage->is_meta())
        throw Error(detail::cat("compile: tracing without running: buffer b", b.id, " (", b.nbytes,
                                " bytes) outlives the step but was made while tracing, in meta mode (state the "
                                "function creates at its first call); create it before the first call"));
    // The trace reserved each generator's counters; the run reserves them again, so it draws what an
    // eager first call would have drawn.
    for (const RandomSource& r : g.random_sources) r.generator->set_offset(r.generator->offset() - r.span);
    build_plan(e, std::move(g));
    ++replays;
    last = e.plan.get();
    return e.plan->run(in, /*capture=*/false);
  }
};

CompiledFunction::CompiledFunction(StepFn fn, CompileOptions options) : s_(std::make_unique<State>()) {
  REEL_CHECK(fn != nullptr, "compile: the step function is empty");
  REEL_CHECK(options.cache_limit >= 1, "compile: cache_limit must be >= 1, got ", options.cache_limit);
  if (options.buckets) check_buckets(*options.buckets);
  s_->fn = std::move(fn);
  s_->options = options;
  if (options.arenas) s_->arenas = options.arenas;
}

CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

namespace {

// max-autotune: kernels time their candidate algorithms on each shape's first (eager) use — for this
// function's calls only, so that other code keeps the heuristic choices (and their cache entries).
class AutotuneScope {
 public:
  explicit AutotuneScope(bool on) : prev_(autotune_enabled()) { set_autotune(on || prev_); }
  ~AutotuneScope() { set_autotune(prev_); }
  AutotuneScope(const AutotuneScope&) = delete;
  AutotuneScope& operator=(const AutotuneScope&) = delete;

 private:
  bool prev_;
};

}  // namespace

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& args) {
  State& s = *s_;
  AutotuneScope autotune(s.options.mode == Mode::MaxAutotune);
  int64_t bucket = 0, length = 0;
  const std::vector<Tensor> inputs = s.options.buckets ? pad_to_bucket(args, *s.options.buckets, bucket, length) : args;
  if (s.options.buckets) ++s.bucket_calls[bucket];
  Signature sig = signature_of(inputs);
  State::Entry* e = nullptr;
  for (State::Entry& c : s.entries)
    if (c.sig == sig) e = &c;
  if (!e) {
    if (int(s.entries.size()) >= s.options.cache_limit) {
      if (!s.warned_limit) {
        std::fprintf(stderr,
                     "reel compile: cache limit reached (%d plans; raise CompileOptions::cache_limit). This call's "
                     "signature %s matches none (%s); running eagerly from now on for new signatures.\n",
                     s.options.cache_limit, signature_str(inputs).c_str(), mismatch(sig, s.entries.back().sig).c_str());
        s.warned_limit = true;
      }
      return s.eager_call(inputs);
    }
    if (s.options.buckets)
      log_line("recompiles", detail::cat("bucket ", bucket, " (dim ", s.options.buckets->dim, "), chosen by length ",
                                         length, ": a plan of its own"));
    else if (!s.entries.empty())
      log_line("recompiles", detail::cat("recompiling: ", mismatch(sig, s.entries.back().sig)));
    s.entries.push_back(State::Entry{sig, 0, nullptr, false});
    e = &s.entries.back();
  }
  const int call = e->calls++;
  if (e->eager_only) return s.eager_call(inputs);
  if (s.options.trace_without_running) {
    if (!e->plan) return s.meta_trace_call(*e, inputs);
  } else {
    if (call == 0) return s.eager_call(inputs);
    if (!e->plan) return s.trace_call(*e, inputs);
  }
  ++s.replays;
  s.last = e->plan.get();
  return e->plan->run(inputs);
}

const Plan* CompiledFunction::last_plan() const { return s_->last; }
std::vector<const Plan*> CompiledFunction::plans() const {
  std::vector<const Plan*> out;
  for (const State::Entry& e : s_->entries)
    if (e.plan) out.push_back(e.plan.get());
  return out;
}
int CompiledFunction::traces() const { return s_->traces; }
int CompiledFunction::replays() const { return s_->replays; }
int CompiledFunction::eager_calls() const { return s_->eager; }
const std::vector<GraphBreak>& CompiledFunction::graph_breaks() const { return s_->breaks; }
const CompileOptions& CompiledFunction::options() const { return s_->options; }
const std::map<int64_t, int64_t>& CompiledFunction::bucket_calls() const { return s_->bucket_calls; }
const ArenaPool& CompiledFunction::arena_pool() const { return *s_->arenas; }

}  // namespace reel::compile
