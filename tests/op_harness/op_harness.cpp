// The op harness's registry and runner (what a case is and what is checked: op_harness.h).
//
// Comparisons: values are read back row-major as doubles. Floats agree when ||got - want|| / ||want||
// (plain ||got - want|| when want is all zeros) is within the tolerance over the finite entries and
// NaN and infinities sit at the same places; i64 and exact comparisons need equal values (NaN
// equal to NaN). Determinism is judged on the bytes of contiguous copies.
#include "tests/op_harness/op_harness.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include "autograd/ops.h"
#include "tensor/cuda.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {

// ---- the registry ----

namespace {

using FamilyCases = std::vector<OpTestCase> (*)();

// Every family of ops.def, in its order; a new family file adds one line here.
constexpr FamilyCases kFamilies[] = {
    memory_cases, views_cases,   elementwise_cases, reduce_cases, linalg_cases, pool_cases,
    norm_cases,   dropout_cases, attention_cases,   optim_cases,  fused_cases,  fused_reduce_cases,
    fused_norm_cases,
};

}  // namespace

const std::vector<OpTestCase>& all_cases() {
  static const std::vector<OpTestCase> cases = [] {
    std::vector<OpTestCase> all;
    for (FamilyCases family : kFamilies)
      for (OpTestCase& c : family()) all.push_back(std::move(c));
    return all;
  }();
  return cases;
}

std::vector<OpKind> ops_without_cases() {
  std::set<OpKind> covered;
  for (const OpTestCase& c : all_cases()) covered.insert(c.op);
  std::vector<OpKind> missing;
  for (int k = 0; k < kNumOps; ++k)
    if (!covered.count(OpKind(k))) missing.push_back(OpKind(k));
  return missing;
}

std::string run_name(const OpTestCase& c, DType dtype) { return c.name + "_" + dtype_name(dtype); }

std::string Report::str() const {
  std::string s;
  for (const std::string& p : problems) s += p + "\n";
  return s;
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 2e-5;
    case DType::f16: return 5e-3;
    case DType::bf16: return 3e-2;
    case DType::i64: return 0;
  }
  return 0;
}

// ---- comparisons ----

namespace {

std::string describe(const Tensor& t) { return shape_str(t.shape()) + " " + dtype_name(t.dtype()); }

// Why `got` differs from `want` beyond `tol` (0: exactly), or nothing.
std::optional<std::string> difference(const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return "is " + describe(got) + ", expected " + describe(want);
  std::vector<double> a = host_values(got), b = host_values(want);
  const bool exact = tol == 0 || want.dtype() == DType::i64;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool finite = std::isfinite(a[i]) && std::isfinite(b[i]);
    const bool same = a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]));
    if ((exact || !finite) && !same) {
      std::ostringstream os;
      os << "element " << i << " is " << a[i] << ", expected " << b[i] << (exact ? " (exactly)" : "");
      return os.str();
    }
    if (!finite) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (err <= tol) return std::nullopt;
  std::ostringstream os;
  os << "relative L2 error " << err << " exceeds " << tol;
  return os.str();
}

// Checks that a (given or reference) value matches; `what` names it in the report.
void expect_close(Report& r, const std::string& what, const Tensor& got, const Tensor& want, double tol) {
  if (auto d = difference(got, want, tol)) r.add(what + " " + *d);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

double case_tolerance(const OpTestCase& c, DType dtype) { return tolerance(dtype) * c.tol_scale; }

// ---- running a call ----

std::vector<Tensor> run_call(OpKind op, const OpCall& call) {
  if (call.outputs.empty()) return dispatch(op, call.inputs, call.attrs);
  dispatch_out(op, call.inputs, call.outputs, call.attrs);
  return call.outputs;
}

void expect_on_device(Report& r, const OpCall& call, Device device) {
  for (const auto* list : {&call.inputs, &call.outputs})
    for (const Tensor& t : *list)
      if (t.defined() && t.device() != device) r.add("a tensor of the call is on " + t.device().str());
}

// The outputs must have the metas the schema inferred; a view op's output must alias its input.
// `when` says which run made them.
void expect_inferred_metas(Report& r, const std::string& when, OpKind op, const std::vector<TensorMeta>& metas,
                           const OpCall& call, const std::vector<Tensor>& outs) {
  if (metas.size() != outs.size()) {
    r.add(when + ": infer_outputs gives " + std::to_string(metas.size()) + " outputs, the op " +
          std::to_string(outs.size()));
    return;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorMeta& m = metas[i];
    if (outs[i].shape() != m.shape || outs[i].dtype() != m.dtype || outs[i].device() != m.device)
      r.add(when + ": output " + std::to_string(i) + " is " + describe(outs[i]) + " on " + outs[i].device().str() +
            ", inferred " + shape_str(m.shape) + " " + dtype_name(m.dtype) + " on " + m.device.str());
  }
  if (is_view_op(op) && !(outs.size() == 1 && outs[0].shares_storage(call.inputs[0])))
    r.add(when + ": the view does not alias its input's storage");
}

// Runs the call in meta mode (as a planner traces it: no kernel, no memory), then for real, and
// checks both runs' metas against the schema's; returns the real outputs. Given outputs are left
// unwritten in meta mode, so only calls through dispatch have a meta run to look at.
std::vector<Tensor> run_checked(Report& r, OpKind op, const OpCall& call, Device device) {
  expect_on_device(r, call, device);
  std::vector<TensorMeta> metas = infer_outputs(op, call.inputs, call.attrs);
  if (call.outputs.empty()) {
    std::vector<Tensor> meta_outs;
    {
      MetaModeGuard meta;
      meta_outs = dispatch(op, call.inputs, call.attrs);
    }
    expect_inferred_metas(r, "in meta mode", op, metas, call, meta_outs);
  }
  std::vector<Tensor> outs = run_call(op, call);
  expect_inferred_metas(r, "run on " + device.str(), op, metas, call, outs);
  return outs;
}

std::string output_name(size_t i) { return "output " + std::to_string(i); }
std::string input_name(size_t i) { return "input " + std::to_string(i) + " after the call"; }

}  // namespace

// ---- the checks ----

bool runs_on(const OpTestCase& c, DeviceType device) {
  if (device == DeviceType::CUDA && !cuda::is_available()) return false;
  return supports(c.op, device);
}

Report check_cpu(const OpTestCase& c, DType dtype) {
  Report r;
  const Device cpu = Device::cpu();
  OpCall call = c.make(cpu, dtype);
  Expected expected = c.reference ? c.reference(call) : Expected{};
  std::vector<Tensor> outs = run_checked(r, c.op, call, cpu);
  for (size_t i = 0; i < expected.size() && i < outs.size(); ++i) {
    Tensor want = values_input(expected[i], outs[i].shape(), outs[i].dtype());
    expect_close(r, output_name(i) + " against the plain-loop reference:", outs[i], want,
                 case_tolerance(c, dtype));
  }
  if (expected.size() > outs.size()) r.add("the reference gives more values than the op has outputs");
  OpCall again = c.make(cpu, dtype);
  std::vector<Tensor> outs_again = run_call(c.op, again);
  for (size_t i = 0; i < outs.size() && i < outs_again.size(); ++i)
    if (!same_bits(outs[i], outs_again[i])) r.add(output_name(i) + " differs between two runs (not deterministic)");
  for (size_t i = 0; i < call.inputs.size(); ++i)
    if (!same_bits(call.inputs[i], again.inputs[i])) r.add(input_name(i) + " differs between two runs");
  return r;
}

Report check_against_cpu(const OpTestCase& c, DType dtype, Device device) {
  Report r;
  OpCall on_cpu = c.make(Device::cpu(), dtype);
  OpCall on_device = place(c.make(device, dtype), device);
  std::vector<Tensor> want = run_call(c.op, on_cpu);
  std::vector<Tensor> got = run_checked(r, c.op, on_device, device);
  const double tol = case_tolerance(c, dtype);
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) expect_close(r, output_name(i), got[i], want[i], tol);
  for (size_t i = 0; i < on_cpu.inputs.size(); ++i)
    if (on_cpu.inputs[i].defined()) expect_close(r, input_name(i), on_device.inputs[i], on_cpu.inputs[i], tol);
  return r;
}

namespace {

// Records which ops a function dispatches.
class OpRecorder : public DispatchObserver {
 public:
  OpRecorder() : previous_(set_dispatch_observer(this)) {}
  ~OpRecorder() override { set_dispatch_observer(previous_); }
  void on_dispatch(OpKind op, const std::vector<Tensor>&, const std::vector<Tensor>&, const Attrs&, bool) override {
    seen_.insert(op);
  }
  bool saw(OpKind op) const { return seen_.count(op) > 0; }

 private:
  DispatchObserver* previous_;
  std::set<OpKind> seen_;
};

// The inputs gradcheck varies: c.grad_inputs, or every float input without a stride-0 dim.
std::vector<size_t> varied_inputs(const OpTestCase& c, const OpCall& call) {
  if (!c.grad_inputs.empty()) return c.grad_inputs;
  std::vector<size_t> picked;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined() || !is_floating(t.dtype())) continue;
    bool repeated = false;
    for (int64_t d = 0; d < t.dim(); ++d) repeated = repeated || (t.strides()[d] == 0 && t.shape()[d] > 1);
    if (!repeated) picked.push_back(i);
  }
  return picked;
}

}  // namespace

Report check_gradcheck(const OpTestCase& c, Device device) {
  Report r;
  OpCall call = place(c.make(device, DType::f64), device);
  for (size_t i : varied_inputs(c, call))
    if (call.inputs.at(i).defined()) call.inputs[i].set_requires_grad(true);
  {
    OpRecorder recorder;
    NoGradGuard no_grad;
    c.grad(call.inputs);
    if (!recorder.saw(c.op)) r.add(std::string("the gradcheck function never dispatches ") + op_name(c.op));
  }
  GradcheckResult g = gradcheck(c.grad, call.inputs, c.grad_options);
  if (!g.ok) r.add("gradcheck failed:\n" + g.str());
  return r;
}

}  // namespace reel::harness
