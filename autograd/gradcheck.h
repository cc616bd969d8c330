// gradcheck — every analytic gradient of a function against central finite differences, in f64.
//
// For f: inputs -> y, the analytic Jacobian row j is read from backward() with a one-hot gradient
// e_j on y; the numerical column for input element k is (f(x + eps e_k) - f(x - eps e_k)) / (2 eps).
// Perturbations are written through each input's own strides, so non-contiguous inputs (transposed,
// sliced views made leaves with detach()) are checked as they are. Expanded (stride-0) views are
// not valid inputs: one storage element stands for many logical ones. An entry passes when
// |analytic - numerical| <= atol + rtol |numerical|. The report gives, per input, the worst
// absolute error and the worst relative error (|a - n| / max(|n|, atol)).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace reel {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
};

struct GradcheckInputReport {
  size_t index = 0;       // position in the inputs list
  Shape shape;
  double max_abs_error = 0;
  double max_rel_error = 0;
  bool ok = true;
};

struct GradcheckResult {
  bool ok = true;
  std::vector<GradcheckInputReport> inputs;  // one per input with requires_grad
  std::string str() const;                   // one line per input
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks every input with requires_grad (which must be f64). Throws reel::Error for bad usage
// (non-f64 inputs, no input requiring grad, a non-float output).
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace reel
