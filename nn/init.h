// PyTorch's default initialisations, as tensors drawn from a Generator (reel's default unless given).
//
//   Linear, Conv2d:   weight ~ kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)):
//                     gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), bound = sqrt(3) * gain / sqrt(fan_in);
//                     bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the weight's fan_in
//   Embedding:        N(0, 1)
//   norms:            weight 1, bias 0; BatchNorm running_mean 0, running_var 1
// fan_in of a weight (O, I, k...) is I * prod(k...), of a Linear weight (out, in) it is in.
#pragma once
#include <cstdint>

#include "autograd/ops.h"

namespace reel::nn::init {

int64_t fan_in(const Shape& weight_shape);
// U(-bound, bound) with bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)).
Tensor kaiming_uniform(const Shape& shape, double a, Generator* gen = nullptr);
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's bias default for Linear and Conv2d.
Tensor bias_uniform(const Shape& shape, int64_t fan_in, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, Generator* gen = nullptr);

}  // namespace reel::nn::init
