// The differentiable ops: reel's user-facing functional API (like torch:: functions).
//
// Each function runs its forward through dispatch() and, under grad mode, records a Node whose
// backward is written in these same ops (autograd/functions/<family>.cpp keeps each forward beside
// its backward). Broadcasting follows NumPy; inputs of one op share a dtype and a device.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace reel {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions& with_dtype(DType d) { dtype = d; return *this; }
  TensorOptions& with_device(Device d) { device = d; return *this; }
  TensorOptions& with_requires_grad(bool r = true) { requires_grad = r; return *this; }
};

// ---- creation (autograd/functions/memory.cpp) ----
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor arange(int64_t n, TensorOptions opts = {});                  // 0, 1, ..., n-1
Tensor arange(double start, double end, double step, TensorOptions opts = {});
// Philox draws; each call advances `gen` (the default generator unless given).
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {}, Generator* gen = nullptr);
// Integers in [low, high), as torch.randint: the whole part of a uniform draw in [0, high - low), plus
// low. i64 unless opts says another dtype. The draw has 24 random bits, so a range of r integers
// favours some by at most r / 2^24 of their probability; ranges wider than 2^24 are refused.
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {DType::i64}, Generator* gen = nullptr);
// From host values: tensor({1, 2, 3, 4}, {2, 2}).
Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
Tensor tensor_i64(const std::vector<int64_t>& values, const Shape& shape, Device device = Device::cpu());

// ---- memory (autograd/functions/memory.cpp) ----
Tensor contiguous(const Tensor& x);                 // x itself when already contiguous
Tensor clone(const Tensor& x);                      // always a fresh contiguous copy
// Cast; differentiable between float types. The result is contiguous, or stored channels-last (NHWC)
// when `format` says so (autocast's convolution operands); x itself when it already has the dtype
// (and, for ChannelsLast, the layout). The gradient comes back in x's own layout.
Tensor to_dtype(const Tensor& x, DType dtype, MemoryFormat format = MemoryFormat::Contiguous);
Tensor to_device(const Tensor& x, Device device);   // differentiable
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);  // views; last may be shorter
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// In place, no autograd (under no_grad or on tensors that need no grad): dst <- src; t <- value.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& t, double value);
void zero_(const Tensor& t);
// dst += src (dst a gradient buffer or a parameter updated under no_grad).
void add_(const Tensor& dst, const Tensor& src);
// dst += value in dst's dtype (BatchNorm's i64 num_batches_tracked counts forwards with it).
void add_(const Tensor& dst, double value);
void mul_(const Tensor& dst, double value);

// ---- views (autograd/functions/views.cpp) ----
Tensor reshape(const Tensor& x, const Shape& shape);   // a view when possible, else a copy
Tensor view(const Tensor& x, const Shape& shape);      // a view or an error
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);  // drops dim
Tensor expand(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
// Sums `g` over the dims that broadcasting added or stretched, giving shape `shape` (broadcast's adjoint).
Tensor sum_to(const Tensor& g, const Shape& shape);

// ---- elementwise (autograd/functions/elementwise.cpp) ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// GELU. One argument: the tanh approximation (GPT-2's and MODELS.md's), which is reel's default —
// PyTorch's default is the exact form, so code ported from PyTorch says which it means:
// approximate "none" (exact: 0.5 x (1 + erf(x / sqrt 2)), ViT's) or "tanh", as torch's gelu takes.
Tensor gelu(const Tensor& x);
Tensor gelu(const Tensor& x, const std::string& approximate);
Tensor silu(const Tensor& x);  // x sigmoid(x) (SiLU, "swish"): YOLOv8, EfficientNet, LLaMA MLPs
Tensor pow(const Tensor& x, double exponent);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
// Comparisons: 0/1 in the inputs' dtype; not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// cond != 0 ? a : b (cond of any dtype; differentiable in a and b).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` wherever mask != 0 (mask broadcasts to x; any dtype).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);

// ---- reductions and softmax (autograd/functions/reduce.cpp) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum over dims; the gradient is shared equally among tied maxima (like torch.amax).
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Fused log-softmax + NLL. logits (N, C), target (N) i64 in [0, C) or ignore_index.
// reduction "mean" (over non-ignored targets) or "sum".
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean",
                     int64_t ignore_index = -100);
// sqrt(sum of squares of every element of every tensor), in f32 (f64 for f64 inputs); not differentiable.
Tensor global_norm(const std::vector<Tensor>& xs);

// ---- matmul and convolution (autograd/functions/linalg.cpp) ----
// a (..., M, K) @ b (..., K, N) -> (..., M, N); batch dims broadcast; 1-D operands as in NumPy.
Tensor matmul(const Tensor& a, const Tensor& b);
// x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O) or undefined -> (N, O, Ho, Wo). The result and dx
// keep x's layout, dw keeps the weight's: channels-last operands give channels-last results (see
// MemoryFormat), which cuDNN convolves without transposing. groups as torch's F.conv2d: C and O split
// into that many blocks, each convolved on its own (groups == C: depthwise); both must divide by it.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t groups = 1);

// ---- pooling and embedding (autograd/functions/pool.cpp) ----
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);  // stride -1: = kernel
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);  // counts padding
Tensor global_avg_pool2d(const Tensor& x);  // (N, C, H, W) -> (N, C)
// Nearest upsampling by an integer factor (torch's nn.Upsample(scale_factor=s, mode="nearest")):
// y[n, c, i, j] = x[n, c, i / s, j / s], (N, C, H, W) -> (N, C, sH, sW). A broadcast view copied
// out, so its gradient is the sum over each s x s block (expand's backward).
Tensor upsample_nearest2d(const Tensor& x, int64_t scale);
// weight (V, D), indices i64 of any shape with values in [0, V) -> indices.shape + (D,)
Tensor embedding(const Tensor& weight, const Tensor& indices);

// ---- normalisation and dropout (autograd/functions/norm.cpp) ----
// Normalises over the trailing dims of `normalized_shape`; weight/bias of that shape or undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// x (N, C, *), groups dividing C, weight/bias (C) or undefined.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
// x (N, C, *). training: batch statistics, and running_mean/var (if given) are updated in place with
// `momentum` (running_var with the unbiased variance). eval: running statistics are used.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

// ---- fused scaled-dot-product self-attention (autograd/functions/attention.cpp) ----
// qkv (B, T, 3d): q, k, v side by side, as Linear(d -> 3d) writes them -> y (B, T, d), heads merged:
// softmax(q k^T / sqrt(d / heads) + mask) v per head, in one op forward and one backward, with no
// (T, T) scores kept. is_causal: query t sees keys s <= t only (else every key 0..T-1).
// attn_mask: undefined, or an additive float mask broadcastable to (B, H, T, T) ((T, T), (B, 1, 1, T),
// (1, H, T, T), ...; 0 keeps a key, -inf removes it), added to the scaled scores before the softmax;
// converted to the accumulation dtype (f32; f64 for f64 qkv). A mask is a constant: it gets no
// gradient, and one that requires grad is rejected. A query row whose keys are all removed gives
// y = 0 and a zero gradient (its lse is +inf), as FlashAttention does. For a boolean key padding
// (true = ignore the key, PyTorch's key_padding_mask) see nn::key_padding_mask.
// `compute`: the dtype the products' inputs are rounded to (qkv's own dtype, or f16/bf16 under mixed
// precision; qkv's dtype when not given).
Tensor scaled_dot_product_attention(const Tensor& qkv, int64_t heads, bool is_causal, const Tensor& attn_mask = {},
                                    std::optional<DType> compute = std::nullopt);
// The causal shorthand: scaled_dot_product_attention(qkv, heads, true, {}, compute).
Tensor scaled_causal_attention(const Tensor& qkv, int64_t heads, std::optional<DType> compute = std::nullopt);

}  // namespace reel
