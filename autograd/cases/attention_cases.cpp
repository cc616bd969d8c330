// Gradcheck cases of fused causal self-attention: one and several heads, a sequence of one token, a
// qkv stored transposed (non-contiguous), scaled up so the softmax is far from uniform. In f64 the op
// computes in f64, so finite differences check the exact math.
#include "autograd/cases/op_cases.h"

namespace reel {

using namespace cases;
using Inputs = std::vector<Tensor>;

void add_attention_cases(std::vector<OpCase>& c) {
  c.push_back({"causal_attention (2,5,12) 2 heads",
               [](Device d, DType t) -> Inputs { return {leaf({2, 5, 12}, d, t, 120)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 2); }});
  c.push_back({"causal_attention (1,4,9) 1 head, peaked scores",
               [](Device d, DType t) -> Inputs { return {leaf({1, 4, 9}, d, t, 121, 2.0)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 1); }});
  c.push_back({"causal_attention (3,1,6) one token", [](Device d, DType t) -> Inputs { return {leaf({3, 1, 6}, d, t, 122)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 2); }});
  c.push_back({"causal_attention (2,6,18) transposed, 3 heads",
               [](Device d, DType t) -> Inputs { return {transposed_leaf({2, 6, 18}, d, t, 123)}; },
               [](const Inputs& x) { return scaled_causal_attention(x[0], 3); }});
}

}  // namespace reel
