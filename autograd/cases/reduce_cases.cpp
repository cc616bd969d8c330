// Gradcheck cases of the reductions, softmax and cross-entropy (global_norm is not differentiable).
// Each op is checked on contiguous, transposed and sliced leaves, over trailing, leading, middle,
// non-adjacent and all dims, with and without keepdim. Cross-entropy targets are constant i64
// inputs, including ignore_index rows.
#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

using ReduceFn = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);
// leaf, transposed_leaf or sliced_leaf (cases/op_cases.h).
using MakeLeaf = Tensor (*)(const Shape&, Device, DType, uint64_t, double, double);

// A reduction case over an input made by `make`.
OpCase reduce_case(const std::string& name, ReduceFn op, MakeLeaf make, Shape shape, std::vector<int64_t> dims,
                   bool keepdim, uint64_t seed) {
  return {name, [make, shape, seed](Device d, DType t) -> Inputs { return {make(shape, d, t, seed, 1.0, 0.0)}; },
          [op, dims, keepdim](const Inputs& x) { return op(x[0], dims, keepdim); }};
}

// Cross-entropy logits (N, C) with targets `target` (values in [0, C) or -100).
OpCase cross_entropy_case(const std::string& name, MakeLeaf make, Shape shape, std::vector<int64_t> target,
                          std::string reduction, uint64_t seed) {
  return {name,
          [make, shape, target, seed](Device d, DType t) -> Inputs {
            return {make(shape, d, t, seed, 2.0, 0.0), tensor_i64(target, {int64_t(target.size())}, d)};
          },
          [reduction](const Inputs& x) { return cross_entropy(x[0], x[1], reduction); }};
}

void add_sum_mean_cases(std::vector<OpCase>& c) {
  c.push_back(reduce_case("sum all (3,4) -> ()", sum, leaf, {3, 4}, {}, false, 60));
  c.push_back(reduce_case("sum dim 1 keepdim (3,4), transposed", sum, transposed_leaf, {3, 4}, {1}, true, 61));
  c.push_back(reduce_case("sum dims 0,2 of (2,3,4), sliced", sum, sliced_leaf, {2, 3, 4}, {0, 2}, false, 62));
  c.push_back(reduce_case("sum dim -1 of (2,3,4)", sum, leaf, {2, 3, 4}, {-1}, false, 63));
  c.push_back(reduce_case("sum dim 0 of (5,3) (column sums)", sum, leaf, {5, 3}, {0}, false, 64));
  c.push_back(reduce_case("sum middle dim 1 keepdim (2,3,4)", sum, leaf, {2, 3, 4}, {1}, true, 65));
  c.push_back(reduce_case("mean all (4,3) -> ()", mean, leaf, {4, 3}, {}, false, 66));
  c.push_back(reduce_case("mean dim 0 keepdim (4,3), transposed", mean, transposed_leaf, {4, 3}, {0}, true, 67));
  c.push_back(reduce_case("mean dims 1,2 of (2,3,4), transposed", mean, transposed_leaf, {2, 3, 4}, {1, 2}, false, 68));
  c.push_back(reduce_case("mean dim -2 of (3,4,2), sliced", mean, sliced_leaf, {3, 4, 2}, {-2}, false, 69));
}

void add_max_cases(std::vector<OpCase>& c) {
  c.push_back(reduce_case("max all (3,4) -> ()", max, leaf, {3, 4}, {}, false, 70));
  c.push_back(reduce_case("max dim 1 (3,5), transposed", max, transposed_leaf, {3, 5}, {1}, false, 71));
  c.push_back(reduce_case("max dims 0,2 keepdim (2,3,4), sliced", max, sliced_leaf, {2, 3, 4}, {0, 2}, true, 72));
  // Each element appears twice, so every maximum is an exact tie: each copy gets half the gradient
  // and the two halves add up to the derivative of the plain max.
  c.push_back({"max with exact ties (concat x, x)",
               [](Device d, DType t) -> Inputs { return {leaf({3, 4}, d, t, 73)}; },
               [](const Inputs& x) { return max(concat({x[0], x[0]}, 1), {1}); }});
}

void add_softmax_cases(std::vector<OpCase>& c) {
  c.push_back({"softmax dim -1 (3,5)", [](Device d, DType t) -> Inputs { return {leaf({3, 5}, d, t, 80)}; },
               [](const Inputs& x) { return softmax(x[0], -1); }});
  c.push_back({"softmax dim 0 (4,3), transposed", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({4, 3}, d, t, 81)};
               },
               [](const Inputs& x) { return softmax(x[0], 0); }});
  c.push_back({"softmax middle dim 1 (2,3,4), sliced", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({2, 3, 4}, d, t, 82)};
               },
               [](const Inputs& x) { return softmax(x[0], 1); }});
  c.push_back({"softmax dim -1 large logits (2,4)", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 4}, d, t, 83, 3.0, 500.0)};
               },
               [](const Inputs& x) { return softmax(x[0], -1); }});
  c.push_back({"log_softmax dim -1 (3,5)", [](Device d, DType t) -> Inputs { return {leaf({3, 5}, d, t, 84)}; },
               [](const Inputs& x) { return log_softmax(x[0], -1); }});
  c.push_back({"log_softmax dim 1 (2,4,3), transposed", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({2, 4, 3}, d, t, 85)};
               },
               [](const Inputs& x) { return log_softmax(x[0], 1); }});
  c.push_back({"log_softmax dim 0 (3,4), sliced", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({3, 4}, d, t, 86)};
               },
               [](const Inputs& x) { return log_softmax(x[0], 0); }});
}

void add_cross_entropy_cases(std::vector<OpCase>& c) {
  c.push_back(cross_entropy_case("cross_entropy mean (4,5)", leaf, {4, 5}, {1, 0, 4, 2}, "mean", 90));
  c.push_back(cross_entropy_case("cross_entropy sum (3,4)", leaf, {3, 4}, {3, 3, 0}, "sum", 91));
  c.push_back(cross_entropy_case("cross_entropy mean ignore_index (5,3)", leaf, {5, 3}, {2, -100, 0, -100, 1}, "mean",
                                 92));
  c.push_back(cross_entropy_case("cross_entropy sum ignored (3,5), transposed", transposed_leaf, {3, 5},
                                 {-100, 4, 1}, "sum", 93));
  c.push_back(cross_entropy_case("cross_entropy mean (4,3), sliced", sliced_leaf, {4, 3}, {0, 2, 1, 1}, "mean", 94));
  // The loss feeding later ops while the logits are also used elsewhere (their gradients add up).
  c.push_back({"cross_entropy * 3 + sum of logits", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 4}, d, t, 95), tensor_i64({0, 3, 2}, {3}, d)};
               },
               [](const Inputs& x) { return cross_entropy(x[0], x[1]) * 3.0 + sum(x[0]); }});
}

}  // namespace

void add_reduce_cases(std::vector<OpCase>& c) {
  add_sum_mean_cases(c);
  add_max_cases(c);
  add_softmax_cases(c);
  add_cross_entropy_cases(c);
}

}  // namespace reel
