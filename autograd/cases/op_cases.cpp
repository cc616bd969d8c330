#include "autograd/cases/op_cases.h"

namespace reel {

std::vector<OpCase> all_op_cases() {
  std::vector<OpCase> cases;
  add_elementwise_cases(cases);
  add_view_cases(cases);
  add_reduce_cases(cases);
  add_linalg_cases(cases);
  add_pool_cases(cases);
  add_norm_cases(cases);
  add_attention_cases(cases);
  return cases;
}

namespace cases {

namespace {
Tensor make_leaf(Tensor t) {
  Tensor l = t.detach();
  l.set_requires_grad(true);
  return l;
}
}  // namespace

Tensor leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale, double shift) {
  Generator gen(seed);
  NoGradGuard no_grad;
  return make_leaf(normal(shape, shift, scale, TensorOptions{dtype, device}, &gen));
}

Tensor transposed_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale, double shift) {
  if (shape.size() < 2) return leaf(shape, device, dtype, seed, scale, shift);
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Tensor base = leaf(swapped, device, dtype, seed, scale, shift);
  return make_leaf(transpose(base.detach(), -1, -2));
}

Tensor sliced_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale, double shift) {
  if (shape.empty()) return leaf(shape, device, dtype, seed, scale, shift);
  Shape bigger = shape;
  bigger[0] = shape[0] * 2;
  Tensor base = leaf(bigger, device, dtype, seed, scale, shift);
  return make_leaf(slice(base.detach(), 0, 0, bigger[0], 2));
}

Tensor positive_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double lo) {
  Generator gen(seed);
  NoGradGuard no_grad;
  return make_leaf(uniform(shape, lo, lo + 1.0, TensorOptions{dtype, device}, &gen));
}

Tensor int_tensor(const Shape& shape, int64_t n, Device device, uint64_t seed) {
  Generator gen(seed);
  NoGradGuard no_grad;
  Tensor u = uniform(shape, 0.0, double(n), TensorOptions{DType::f64, Device::cpu()}, &gen);
  std::vector<int64_t> v;
  for (double x : u.to_vector<double>()) v.push_back(std::min<int64_t>(int64_t(x), n - 1));
  return tensor_i64(v, shape, device);
}

}  // namespace cases
}  // namespace reel
