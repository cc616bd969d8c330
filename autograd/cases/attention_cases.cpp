// Gradcheck cases of fused scaled-dot-product attention: causal with one and several heads, a sequence
// of one token, a qkv stored transposed (non-contiguous), scaled up so the softmax is far from uniform;
// non-causal, and with additive masks of several broadcast shapes: finite values, a key padding
// (-inf on some keys), a row masked throughout (zero gradient there). In f64 the op computes in f64,
// so finite differences check the exact math. The masks are constants, built inside the function on
// qkv's device (gradcheck perturbs only its inputs, and masks take no gradient).
#include <cmath>
#include <limits>

#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A mask of `shape` on x's device in x's dtype from its values.
Tensor mask_like(const Tensor& x, const std::vector<double>& values, const Shape& shape) {
  return tensor(values, shape, TensorOptions{x.dtype()}.with_device(x.device()));
}

// Smooth finite values, different per entry: (i mod 5 - 2) / 2.
std::vector<double> ramp(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i % 5 - 2) / 2;
  return v;
}

}  // namespace

void add_attention_cases(std::vector<OpCase>& c) {
  c.push_back({"attention (2,5,12) 2 heads, causal",
               [](Device d, DType t) -> Inputs { return {leaf({2, 5, 12}, d, t, 120)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 2); }});
  c.push_back({"attention (1,4,9) 1 head, peaked scores",
               [](Device d, DType t) -> Inputs { return {leaf({1, 4, 9}, d, t, 121, 2.0)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 1); }});
  c.push_back({"attention (3,1,6) one token", [](Device d, DType t) -> Inputs { return {leaf({3, 1, 6}, d, t, 122)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 2); }});
  c.push_back({"attention (2,6,18) transposed, 3 heads",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 6, 18}, d, t, 123)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 3); }});
  c.push_back({"attention (2,5,12) 2 heads, not causal",
               [](Device d, DType t) -> Inputs { return {leaf({2, 5, 12}, d, t, 124, 1.5)}; },
               [](const Inputs& x) { return scaled_dot_product_attention(x[0], 2, false); }});
  c.push_back({"attention (2,4,12) not causal, (T, T) mask",
               [](Device d, DType t) -> Inputs { return {leaf({2, 4, 12}, d, t, 125)}; },
               [](const Inputs& x) { return scaled_dot_product_attention(x[0], 2, false, mask_like(x[0], ramp(16), {4, 4})); }});
  c.push_back({"attention (2,4,12) causal, (1, H, T, T) mask",
               [](Device d, DType t) -> Inputs { return {leaf({2, 4, 12}, d, t, 126)}; },
               [](const Inputs& x) { return scaled_dot_product_attention(x[0], 2, true, mask_like(x[0], ramp(32), {1, 2, 4, 4})); }});
  c.push_back({"attention (2,5,12) not causal, key padding (B, 1, 1, T)",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 5, 12}, d, t, 127)}; },
               [](const Inputs& x) {
                 // batch 0 ignores key 4, batch 1 keys 2..4
                 std::vector<double> m{0, 0, 0, 0, -kInf, 0, 0, -kInf, -kInf, -kInf};
                 return scaled_dot_product_attention(x[0], 2, false, mask_like(x[0], m, {2, 1, 1, 5}));
               }});
  c.push_back({"attention (1,4,6) not causal, row 2 fully masked",
               [](Device d, DType t) -> Inputs { return {leaf({1, 4, 6}, d, t, 128)}; },
               [](const Inputs& x) {
                 std::vector<double> m(16, 0.0);
                 for (int s = 0; s < 4; ++s) m[size_t(2 * 4 + s)] = -kInf;
                 m[1] = -kInf;  // and one key of row 0
                 return scaled_dot_product_attention(x[0], 1, false, mask_like(x[0], m, {4, 4}));
               }});
}

}  // namespace reel
