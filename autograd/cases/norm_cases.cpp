// Gradcheck cases of layer norm, group norm, batch norm (training and eval) and dropout: with and
// without weight/bias, 2-D and 4-D inputs, and non-contiguous x (transposed or sliced leaves).
// Weights are drawn around 1 and sets hold at least 4 values, so rstd stays moderate and the finite
// differences are well conditioned. Functions that need state (running statistics, the dropout
// Generator) build it inside the function, so every evaluation of gradcheck sees the same thing.
#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

// Affine parameters around 1 (weight) and 0 (bias).
Tensor weight_leaf(int64_t n, Device d, DType t, uint64_t seed) { return leaf({n}, d, t, seed, 0.5, 1.0); }
Tensor bias_leaf(int64_t n, Device d, DType t, uint64_t seed) { return leaf({n}, d, t, seed, 0.5); }

// Running statistics as constants (no grad): mean ~ N(0, 0.25), var in [0.5, 1.5).
Tensor running_mean_of(int64_t C, Device d, DType t) { return leaf({C}, d, t, 90, 0.5).detach(); }
Tensor running_var_of(int64_t C, Device d, DType t) { return positive_leaf({C}, d, t, 91).detach(); }

void add_layer_norm_cases(std::vector<OpCase>& c) {
  c.push_back({"layer_norm (3,4) over (4), weight and bias", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 4}, d, t, 60), weight_leaf(4, d, t, 61), bias_leaf(4, d, t, 62)};
               },
               [](const Inputs& x) { return layer_norm(x[0], {4}, x[1], x[2]); }});
  c.push_back({"layer_norm (2,3,2)/(3,2) transposed, no affine",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 3, 2}, d, t, 63)}; },
               [](const Inputs& x) { return layer_norm(x[0], {3, 2}); }});
  c.push_back({"layer_norm (3,5) sliced, weight only", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({3, 5}, d, t, 64), weight_leaf(5, d, t, 65)};
               },
               [](const Inputs& x) { return layer_norm(x[0], {5}, x[1]); }});
  c.push_back({"layer_norm (2,2,4) over (4), bias only", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 2, 4}, d, t, 66, 2.0, 1.0), bias_leaf(4, d, t, 67)};
               },
               [](const Inputs& x) { return layer_norm(x[0], {4}, Tensor(), x[1]); }});
}

void add_group_norm_cases(std::vector<OpCase>& c) {
  c.push_back({"group_norm (2,4,3) G=2, weight and bias", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 4, 3}, d, t, 70), weight_leaf(4, d, t, 71), bias_leaf(4, d, t, 72)};
               },
               [](const Inputs& x) { return group_norm(x[0], 2, x[1], x[2]); }});
  c.push_back({"group_norm (2,6,2,2) G=3 transposed, no affine",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 6, 2, 2}, d, t, 73)}; },
               [](const Inputs& x) { return group_norm(x[0], 3); }});
  c.push_back({"group_norm (3,4) G=1, sliced, weight only", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({3, 4}, d, t, 74), weight_leaf(4, d, t, 75)};
               },
               [](const Inputs& x) { return group_norm(x[0], 1, x[1]); }});
}

void add_batch_norm_train_cases(std::vector<OpCase>& c) {
  c.push_back({"batch_norm train (5,3), weight, bias, running", [](Device d, DType t) -> Inputs {
                 return {leaf({5, 3}, d, t, 80), weight_leaf(3, d, t, 81), bias_leaf(3, d, t, 82)};
               },
               [](const Inputs& x) {
                 TensorOptions o{x[0].dtype(), x[0].device()};
                 return batch_norm(x[0], zeros({3}, o), ones({3}, o), x[1], x[2], true);
               }});
  c.push_back({"batch_norm train (2,3,2,2) transposed, no aff.",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 3, 2, 2}, d, t, 83)}; },
               [](const Inputs& x) { return batch_norm(x[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }});
  c.push_back({"batch_norm train (3,2,3) sliced, weight only", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({3, 2, 3}, d, t, 84), weight_leaf(2, d, t, 85)};
               },
               [](const Inputs& x) { return batch_norm(x[0], Tensor(), Tensor(), x[1], Tensor(), true); }});
}

void add_batch_norm_eval_cases(std::vector<OpCase>& c) {
  c.push_back({"batch_norm eval (2,3,2), weight and bias", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 3, 2}, d, t, 86), weight_leaf(3, d, t, 87), bias_leaf(3, d, t, 88),
                         running_mean_of(3, d, t), running_var_of(3, d, t)};
               },
               [](const Inputs& x) { return batch_norm(x[0], x[3], x[4], x[1], x[2], false); }});
  c.push_back({"batch_norm eval (4,3) transposed, no affine", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({4, 3}, d, t, 89), running_mean_of(3, d, t), running_var_of(3, d, t)};
               },
               [](const Inputs& x) { return batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), false); }});
}

void add_dropout_cases(std::vector<OpCase>& c) {
  // A fresh Generator per call: gradcheck evaluates the function many times and needs the same mask.
  c.push_back({"dropout p=0.3 (transposed input)",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({4, 5}, d, t, 95)}; },
               [](const Inputs& x) {
                 Generator gen(7);
                 return dropout(x[0], 0.3, true, &gen);
               }});
  c.push_back({"dropout p=0.5 (sliced input)",
               [](Device d, DType t) -> Inputs { return {sliced_leaf({3, 4}, d, t, 96)}; },
               [](const Inputs& x) {
                 Generator gen(8);
                 return dropout(x[0], 0.5, true, &gen);
               }});
}

}  // namespace

void add_norm_cases(std::vector<OpCase>& c) {
  add_layer_norm_cases(c);
  add_group_norm_cases(c);
  add_batch_norm_train_cases(c);
  add_batch_norm_eval_cases(c);
  add_dropout_cases(c);
}

}  // namespace reel
