// Gradcheck cases of matmul and conv2d: plain, transposed and sliced (non-contiguous) operands,
// broadcast batch dims, the folded shared-matrix path, NumPy 1-D operands; conv2d with stride 1/2,
// padding 0/1, 1x1 and 3x3 kernels, non-square inputs, bias present or absent, and groups: 2 groups,
// depthwise (groups == C) with channel multiplier 1 and 2. Tensors stay small (<= ~100 elements per
// input) because gradcheck builds full Jacobians.
#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

OpCase matmul_case(const std::string& name, std::function<Inputs(Device, DType)> make) {
  return {"matmul " + name, std::move(make), [](const Inputs& x) { return matmul(x[0], x[1]); }};
}

// conv2d over inputs (x, w[, bias]) with the given stride, padding and groups.
GradcheckFn conv_fn(int64_t stride, int64_t padding, int64_t groups = 1) {
  return [stride, padding, groups](const Inputs& x) {
    return conv2d(x[0], x[1], x.size() > 2 ? x[2] : Tensor(), stride, padding, groups);
  };
}

}  // namespace

void add_linalg_cases(std::vector<OpCase>& c) {
  c.push_back(matmul_case("(3,4)@(4,2)", [](Device d, DType t) -> Inputs {
    return {leaf({3, 4}, d, t, 200), leaf({4, 2}, d, t, 201)};
  }));
  c.push_back(matmul_case("transposed a and b", [](Device d, DType t) -> Inputs {
    return {transposed_leaf({3, 4}, d, t, 202), transposed_leaf({4, 5}, d, t, 203)};
  }));
  c.push_back(matmul_case("sliced a, b", [](Device d, DType t) -> Inputs {
    return {sliced_leaf({3, 4}, d, t, 204), sliced_leaf({4, 2}, d, t, 205)};
  }));
  c.push_back(matmul_case("broadcast batch (2,1,3,4)@(5,4,2)", [](Device d, DType t) -> Inputs {
    return {leaf({2, 1, 3, 4}, d, t, 206), leaf({5, 4, 2}, d, t, 207)};
  }));
  c.push_back(matmul_case("batched (2,3,4)@(2,4,2)^T", [](Device d, DType t) -> Inputs {
    return {leaf({2, 3, 4}, d, t, 208), transposed_leaf({2, 4, 2}, d, t, 209)};
  }));
  c.push_back(matmul_case("shared b (2,3,4)@(4,3)", [](Device d, DType t) -> Inputs {
    return {leaf({2, 3, 4}, d, t, 210), leaf({4, 3}, d, t, 211)};
  }));
  c.push_back(matmul_case("shared a (3,4)@(2,4,2)", [](Device d, DType t) -> Inputs {
    return {leaf({3, 4}, d, t, 212), leaf({2, 4, 2}, d, t, 213)};
  }));
  c.push_back(matmul_case("1-D (4)@(4,3)", [](Device d, DType t) -> Inputs {
    return {leaf({4}, d, t, 214), leaf({4, 3}, d, t, 215)};
  }));
  c.push_back(matmul_case("1-D (2,3,4)@(4)", [](Device d, DType t) -> Inputs {
    return {leaf({2, 3, 4}, d, t, 216), leaf({4}, d, t, 217)};
  }));
  c.push_back(matmul_case("1-D dot (5)@(5)", [](Device d, DType t) -> Inputs {
    return {leaf({5}, d, t, 218), leaf({5}, d, t, 219)};
  }));

  c.push_back({"conv2d 3x3 pad 1, bias", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 2, 4, 4}, d, t, 230), leaf({3, 2, 3, 3}, d, t, 231), leaf({3}, d, t, 232)};
               },
               conv_fn(1, 1)});
  c.push_back({"conv2d 3x3 stride 2, no bias, non-square", [](Device d, DType t) -> Inputs {
                 return {leaf({1, 2, 5, 4}, d, t, 233), leaf({2, 2, 3, 3}, d, t, 234)};
               },
               conv_fn(2, 0)});
  c.push_back({"conv2d 1x1 stride 2 pad 1, bias", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 3, 3, 3}, d, t, 235), leaf({2, 3, 1, 1}, d, t, 236), leaf({2}, d, t, 237)};
               },
               conv_fn(2, 1)});
  c.push_back({"conv2d 2x2 transposed x, sliced w", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({1, 2, 4, 3}, d, t, 238), sliced_leaf({2, 2, 2, 2}, d, t, 239)};
               },
               conv_fn(1, 0)});
  c.push_back({"conv2d 3x3 stride 2 pad 1, sliced bias", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 1, 5, 5}, d, t, 240), transposed_leaf({2, 1, 3, 3}, d, t, 241),
                         sliced_leaf({2}, d, t, 242)};
               },
               conv_fn(2, 1)});
  // Groups: w is (O, C/groups, kH, kW).
  c.push_back({"conv2d groups 2, 3x3 pad 1, bias", [](Device d, DType t) -> Inputs {
                 return {leaf({1, 4, 4, 3}, d, t, 243), leaf({4, 2, 3, 3}, d, t, 244), leaf({4}, d, t, 245)};
               },
               conv_fn(1, 1, 2)});
  c.push_back({"conv2d depthwise 3x3 stride 2 pad 1", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 3, 5, 4}, d, t, 246), leaf({3, 1, 3, 3}, d, t, 247)};
               },
               conv_fn(2, 1, 3)});
  c.push_back({"conv2d depthwise multiplier 2, 2x2, transposed x, bias", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({1, 2, 4, 3}, d, t, 248), leaf({4, 1, 2, 2}, d, t, 249), leaf({4}, d, t, 250)};
               },
               conv_fn(1, 0, 2)});
}

}  // namespace reel
