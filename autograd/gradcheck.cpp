#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace reel {
namespace {

// A 0-dim view of element k (row-major over the logical shape) of t: reads and writes go through
// t's own storage and strides, on any device.
Tensor element_view(const Tensor& t, int64_t k) {
  int64_t off = t.offset();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (k % t.shape()[d]) * t.strides()[d];
    k /= t.shape()[d];
  }
  return Tensor::make_view(t, {}, {}, off);
}

std::vector<double> evaluate(const GradcheckFn& fn, const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  return fn(inputs).to_vector<double>();
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    REEL_CHECK(inputs[i].dtype() == DType::f64, "gradcheck: input ", i, " is ", inputs[i].dtype(),
               "; gradcheck needs f64 inputs");
    checked.push_back(i);
  }
  REEL_CHECK(!checked.empty(), "gradcheck: no input has requires_grad set");

  // Analytic Jacobians: one backward per output element.
  Tensor y = fn(inputs);
  REEL_CHECK(y.defined() && y.dtype() == DType::f64, "gradcheck: the function must return an f64 tensor");
  const int64_t n_out = y.numel();
  std::vector<std::vector<double>> analytic(checked.size());  // [input][j * numel + k]
  for (size_t c = 0; c < checked.size(); ++c) analytic[c].assign(size_t(n_out * inputs[checked[c]].numel()), 0.0);
  if (y.requires_grad()) {
    for (int64_t j = 0; j < n_out; ++j) {
      for (size_t i : checked) inputs[i].set_grad(Tensor());
      std::vector<double> onehot(size_t(n_out), 0.0);
      onehot[size_t(j)] = 1.0;
      Tensor seed = tensor(onehot, y.shape(), TensorOptions{DType::f64, y.device()});
      y.backward(seed, /*retain_graph=*/true);
      for (size_t c = 0; c < checked.size(); ++c) {
        Tensor g = inputs[checked[c]].grad();
        if (!g.defined()) continue;
        std::vector<double> gv = g.to_vector<double>();
        std::copy(gv.begin(), gv.end(), analytic[c].begin() + j * int64_t(gv.size()));
      }
    }
    for (size_t i : checked) inputs[i].set_grad(Tensor());
  }

  GradcheckResult result;
  for (size_t c = 0; c < checked.size(); ++c) {
    const Tensor& x = inputs[checked[c]];
    GradcheckInputReport rep;
    rep.index = checked[c];
    rep.shape = x.shape();
    const int64_t n_in = x.numel();
    for (int64_t k = 0; k < n_in; ++k) {
      Tensor e = element_view(x, k);
      double orig = e.item();
      std::vector<double> plus, minus;
      {
        NoGradGuard no_grad;
        fill_(e, orig + opts.eps);
        plus = evaluate(fn, inputs);
        fill_(e, orig - opts.eps);
        minus = evaluate(fn, inputs);
        fill_(e, orig);
      }
      for (int64_t j = 0; j < n_out; ++j) {
        double num = (plus[j] - minus[j]) / (2 * opts.eps);
        double ana = analytic[c][size_t(j * n_in + k)];
        double err = std::fabs(ana - num);
        if (!(err <= opts.atol + opts.rtol * std::fabs(num))) rep.ok = false;  // NaN fails too
        rep.max_abs_error = std::max(rep.max_abs_error, err);
        rep.max_rel_error = std::max(rep.max_rel_error, err / std::max(std::fabs(num), opts.atol));
        if (std::isnan(err)) rep.max_abs_error = rep.max_rel_error = NAN;
      }
    }
    result.ok = result.ok && rep.ok;
    result.inputs.push_back(rep);
  }
  return result;
}

std::string GradcheckResult::str() const {
  std::ostringstream os;
  for (const auto& r : inputs)
    os << "input " << r.index << " " << shape_str(r.shape) << ": max abs error " << r.max_abs_error
       << ", max rel error " << r.max_rel_error << (r.ok ? " ok" : " FAILED") << "\n";
  return os.str();
}

}  // namespace reel
