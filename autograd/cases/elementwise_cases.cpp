// Gradcheck cases of the elementwise ops, the creation/memory ops and the views.
#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

// A unary case on a (3, 4) input stored transposed, so the non-contiguous path is what gets checked.
OpCase unary_case(const std::string& name, Tensor (*op)(const Tensor&), bool positive = false) {
  return {name + " (transposed input)",
          [positive](Device d, DType t) -> Inputs {
            if (positive) return {transpose(positive_leaf({4, 3}, d, t, 11), 0, 1).detach().set_requires_grad()};
            return {transposed_leaf({3, 4}, d, t, 11)};
          },
          [op](const Inputs& x) { return op(x[0]); }};
}

}  // namespace

void add_elementwise_cases(std::vector<OpCase>& c) {
  c.push_back(unary_case("neg", neg));
  c.push_back(unary_case("exp", exp));
  c.push_back(unary_case("log", log, true));
  c.push_back(unary_case("sqrt", sqrt, true));
  c.push_back(unary_case("rsqrt", rsqrt, true));
  c.push_back(unary_case("abs", abs, true));
  c.push_back(unary_case("tanh", tanh));
  c.push_back(unary_case("sigmoid", sigmoid));
  c.push_back(unary_case("relu", relu));
  c.push_back(unary_case("gelu", gelu));
  c.push_back(unary_case("gelu exact", [](const Tensor& x) { return gelu(x, "none"); }));
  c.push_back(unary_case("silu", silu));
  c.push_back({"pow 3.5 (sliced input)", [](Device d, DType t) -> Inputs {
                 Tensor base = positive_leaf({6, 4}, d, t, 12);
                 return {slice(base.detach(), 0, 0, 6, 2).detach().set_requires_grad()};
               },
               [](const Inputs& x) { return pow(x[0], 3.5); }});
  c.push_back({"add scalar, mul scalar", [](Device d, DType t) -> Inputs { return {leaf({5}, d, t, 13)}; },
               [](const Inputs& x) { return (x[0] + 2.0) * -3.0; }});
  c.push_back({"add broadcast (3,1)+(4)", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 1}, d, t, 14), leaf({4}, d, t, 15)};
               },
               [](const Inputs& x) { return x[0] + x[1]; }});
  c.push_back({"sub broadcast (2,3,4)-(3,1), transposed", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({2, 3, 4}, d, t, 16), leaf({3, 1}, d, t, 17)};
               },
               [](const Inputs& x) { return x[0] - x[1]; }});
  c.push_back({"mul broadcast (4,1,3)*(2,3), sliced", [](Device d, DType t) -> Inputs {
                 return {sliced_leaf({4, 1, 3}, d, t, 18), leaf({2, 3}, d, t, 19)};
               },
               [](const Inputs& x) { return x[0] * x[1]; }});
  c.push_back({"div broadcast (3,4)/(4)", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 4}, d, t, 20), positive_leaf({4}, d, t, 21)};
               },
               [](const Inputs& x) { return x[0] / x[1]; }});
  c.push_back({"same input twice x*x+x", [](Device d, DType t) -> Inputs { return {leaf({2, 3}, d, t, 22)}; },
               [](const Inputs& x) { return x[0] * x[0] + x[0]; }});
  c.push_back({"where broadcast cond (3,1)", [](Device d, DType t) -> Inputs {
                 return {leaf({3, 4}, d, t, 23), leaf({4}, d, t, 24), leaf({3, 1}, d, t, 25)};
               },
               [](const Inputs& x) {
                 Tensor cond = gt(x[2].detach(), zeros({}, TensorOptions{x[2].dtype(), x[2].device()}));
                 return where(cond, x[0], x[1]);
               }});
  c.push_back({"masked_fill causal mask", [](Device d, DType t) -> Inputs { return {leaf({4, 4}, d, t, 26)}; },
               [](const Inputs& x) {
                 TensorOptions o{DType::i64, x[0].device()};
                 Tensor i = reshape(arange(4, o), {4, 1}), j = reshape(arange(4, o), {1, 4});
                 return masked_fill(x[0], gt(j, i), -1e4);
               }});
  c.push_back({"cast f64->f32->f64", [](Device d, DType t) -> Inputs { return {leaf({3, 2}, d, t, 27)}; },
               [](const Inputs& x) { return to_dtype(to_dtype(x[0], DType::f32) * 1.0, x[0].dtype()); },
               GradcheckOptions{1e-3, 1e-4, 1e-3}});
  c.push_back({"concat dim 1 of three", [](Device d, DType t) -> Inputs {
                 return {leaf({2, 3}, d, t, 28), transposed_leaf({2, 1}, d, t, 29), leaf({2, 2}, d, t, 30)};
               },
               [](const Inputs& x) { return concat({x[0], x[1], x[2]}, 1); }});
  c.push_back({"split into 2,1,2 then recombine", [](Device d, DType t) -> Inputs { return {leaf({5, 2}, d, t, 31)}; },
               [](const Inputs& x) {
                 auto parts = split(x[0], {2, 1, 2}, 0);
                 return concat({parts[2] * 2.0, parts[0]}, 0);
               }});
  c.push_back({"split dim 1 of transposed (4,6) like qkv", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({4, 6}, d, t, 32)};
               },
               [](const Inputs& x) {
                 auto parts = split(x[0], 2, 1);
                 return parts[0] * parts[1] + parts[2];
               }});
}

void add_view_cases(std::vector<OpCase>& c) {
  c.push_back({"reshape of transposed (copies)", [](Device d, DType t) -> Inputs {
                 return {transposed_leaf({3, 4}, d, t, 40)};
               },
               [](const Inputs& x) { return reshape(x[0], {2, 6}) * 1.0; }});
  c.push_back({"permute (2,3,4)->(4,2,3)", [](Device d, DType t) -> Inputs { return {leaf({2, 3, 4}, d, t, 41)}; },
               [](const Inputs& x) { return permute(x[0], {2, 0, 1}) * 1.0; }});
  c.push_back({"slice step 2 and select", [](Device d, DType t) -> Inputs { return {leaf({5, 4}, d, t, 42)}; },
               [](const Inputs& x) { return slice(x[0], 0, 1, 5, 2) + select(x[0], 0, -1); }});
  c.push_back({"expand (3,1)->(2,3,4)", [](Device d, DType t) -> Inputs { return {leaf({3, 1}, d, t, 43)}; },
               [](const Inputs& x) { return expand(x[0], {2, 3, 4}) * 1.0; }});
  c.push_back({"unsqueeze, squeeze, flatten", [](Device d, DType t) -> Inputs { return {leaf({2, 3}, d, t, 44)}; },
               [](const Inputs& x) { return flatten(squeeze(unsqueeze(x[0], 1), 1)) * 1.0; }});
}

}  // namespace reel
