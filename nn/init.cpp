// Default initialisations (see init.h for the formulas).
#include "nn/init.h"

#include <cmath>

namespace reel::nn::init {

int64_t fan_in(const Shape& s) {
  REEL_CHECK(s.size() >= 2, "init.fan_in: weight must have at least 2 dims, got ", shape_str(s));
  int64_t f = 1;
  for (size_t d = 1; d < s.size(); ++d) f *= s[d];
  return f;
}

Tensor kaiming_uniform(const Shape& shape, double a, Generator* gen) {
  int64_t f = fan_in(shape);
  REEL_CHECK(f > 0, "init.kaiming_uniform: fan_in of ", shape_str(shape), " is 0");
  double gain = std::sqrt(2.0 / (1.0 + a * a));
  double bound = gain * std::sqrt(3.0 / double(f));
  return reel::uniform(shape, -bound, bound, {}, gen);
}

Tensor bias_uniform(const Shape& shape, int64_t fan_in, Generator* gen) {
  REEL_CHECK(fan_in > 0, "init.bias_uniform: fan_in must be positive, got ", fan_in);
  double bound = 1.0 / std::sqrt(double(fan_in));
  return reel::uniform(shape, -bound, bound, {}, gen);
}

Tensor normal(const Shape& shape, double mean, double std, Generator* gen) {
  return reel::normal(shape, mean, std, {}, gen);
}

}  // namespace reel::nn::init
