// Gradcheck cases of the pooling and embedding ops.
//
// Max pooling is only differentiable away from ties: if two elements of a window are within eps of
// each other, the finite difference moves the argmax and the numerical gradient is meaningless. Its
// inputs are therefore distinct values spaced 0.1 apart, shuffled by a seeded generator, so no
// +-eps perturbation (1e-6) can change any window's winner. Overlapping windows (stride < kernel)
// let one element win several windows, which checks the scatter-add. Embedding cases repeat indices
// so that rows hit several times must accumulate their gradients.
#include <algorithm>
#include <numeric>

#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

// numel values -0.05 n, ..., 0.1 apart, in an order shuffled by `seed` (row-major over shape).
std::vector<double> shuffled_distinct(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> keys;
  {
    NoGradGuard no_grad;
    keys = rand({n}, TensorOptions{DType::f64, Device::cpu()}, &gen).to_vector<double>();
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[size_t(a)] < keys[size_t(b)]; });
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[size_t(order[size_t(k)])] = 0.1 * double(k) - 0.05 * double(n);
  return v;
}

Tensor make_leaf(const Tensor& t) { return t.detach().set_requires_grad(); }

// A leaf of `shape` holding shuffled distinct values. layout: 0 contiguous, 1 stored with its last
// two dims transposed, 2 every other element of dim 0 of a buffer twice as large.
Tensor distinct_leaf(const Shape& shape, Device d, DType t, uint64_t seed, int layout = 0) {
  NoGradGuard no_grad;
  TensorOptions o{t, d};
  if (layout == 1) {
    Shape swapped = shape;
    std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
    return make_leaf(transpose(tensor(shuffled_distinct(numel_of(shape), seed), swapped, o), -1, -2));
  }
  if (layout == 2) {
    Shape bigger = shape;
    bigger[0] *= 2;
    return make_leaf(slice(tensor(shuffled_distinct(numel_of(bigger), seed), bigger, o), 0, 0, bigger[0], 2));
  }
  return make_leaf(tensor(shuffled_distinct(numel_of(shape), seed), shape, o));
}

void add_max_pool_cases(std::vector<OpCase>& c) {
  c.push_back({"max_pool2d k2 (1,2,4,4)", [](Device d, DType t) -> Inputs {
                 return {distinct_leaf({1, 2, 4, 4}, d, t, 201)};
               },
               [](const Inputs& x) { return max_pool2d(x[0], 2); }});
  c.push_back({"max_pool2d k3 s2 p1 overlapping (2,1,5,5)", [](Device d, DType t) -> Inputs {
                 return {distinct_leaf({2, 1, 5, 5}, d, t, 202)};
               },
               [](const Inputs& x) { return max_pool2d(x[0], 3, 2, 1); }});
  c.push_back({"max_pool2d k2 s1 (H/W transposed input)", [](Device d, DType t) -> Inputs {
                 return {distinct_leaf({1, 2, 3, 4}, d, t, 203, 1)};
               },
               [](const Inputs& x) { return max_pool2d(x[0], 2, 1); }});
  c.push_back({"max_pool2d k3 s1 p1 (sliced input)", [](Device d, DType t) -> Inputs {
                 return {distinct_leaf({1, 1, 4, 4}, d, t, 204, 2)};
               },
               [](const Inputs& x) { return max_pool2d(x[0], 3, 1, 1); }});
}

void add_avg_pool_cases(std::vector<OpCase>& c) {
  c.push_back({"avg_pool2d k2 (1,2,4,4)", [](Device d, DType t) -> Inputs { return {leaf({1, 2, 4, 4}, d, t, 211)}; },
               [](const Inputs& x) { return avg_pool2d(x[0], 2); }});
  c.push_back({"avg_pool2d k3 s2 p1 (transposed input)", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({2, 1, 5, 4}, d, t, 212)};
               },
               [](const Inputs& x) { return avg_pool2d(x[0], 3, 2, 1); }});
  c.push_back({"avg_pool2d k2 s1 p1 (sliced input)", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({2, 1, 3, 4}, d, t, 213)};
               },
               [](const Inputs& x) { return avg_pool2d(x[0], 2, 1, 1); }});
  c.push_back({"avg_pool2d k3 s3 (W not a multiple)", [](Device d, DType t) -> Inputs {
                 return {leaf({1, 1, 3, 7}, d, t, 214)};
               },
               [](const Inputs& x) { return avg_pool2d(x[0], 3); }});
  c.push_back({"global_avg_pool2d (2,3,2,3)", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({2, 3, 2, 3}, d, t, 215)};
               },
               [](const Inputs& x) { return global_avg_pool2d(x[0]); }});
}

void add_embedding_cases(std::vector<OpCase>& c) {
  c.push_back({"embedding (5,3) repeated indices (2,3)", [](Device d, DType t) -> Inputs {
                 return {leaf({5, 3}, d, t, 221), tensor_i64({0, 2, 0, 4, 2, 2}, {2, 3}, d)};
               },
               [](const Inputs& x) { return embedding(x[0], x[1]); }});
  c.push_back({"embedding transposed weight (4,3)", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({4, 3}, d, t, 222), int_tensor({5}, 4, d, 223)};
               },
               [](const Inputs& x) { return embedding(x[0], x[1]); }});
  c.push_back({"embedding scalar index, weight used twice", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 2}, d, t, 224), tensor_i64({1}, {}, d)};
               },
               [](const Inputs& x) { return embedding(x[0], x[1]) * embedding(x[0], x[1]); }});
}

}  // namespace

void add_pool_cases(std::vector<OpCase>& c) {
  add_max_pool_cases(c);
  add_avg_pool_cases(c);
  add_embedding_cases(c);
}

}  // namespace reel
