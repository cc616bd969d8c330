// Op-harness cases of fused scaled-dot-product attention and its backward (schemas:
// kernels/schema/attention.cpp, math: kernels/cpu/attention.cpp). Causal and not, without and with
// an additive mask of each broadcast shape ((T, T), (B, 1, T, T), (1, H, T, T), (B, H, T, T), a key
// padding (B, 1, 1, T) with a batch whose keys are all ignored, a mask stored transposed). Shapes cover
// one position, several heads, a strided or transposed qkv, and every CUDA kernel path: the mma.sync
// kernels (16-bit compute, head size 32 and 64), the WMMA kernels (head size 128), the row kernels
// (f32 and f64 compute, other head sizes), at T = 65 (ViT's: one key past the 64-row tile) and at a
// multiple of 64; f32 qkv computed in f16 or bf16 (mixed precision: both backends round the products'
// inputs at the same points, so those cases take the compute dtype's tolerance). The backward gets
// the y and lse of a CPU forward.
// Plain-loop references: per (batch, head), S = q k^T / sqrt(hd) + M over the visible keys (s <= t
// when causal, all s < T otherwise), P = softmax(S), y = P v, lse = log sum exp S (a row with no
// finite score: P = 0, y = 0, lse = +inf); backward dS = P (dy v^T - rowsum(dy * y)),
// dq = dS k / sqrt(hd), dk = dS^T q / sqrt(hd), dv = P^T dy. All in double, without the compute
// dtype's rounding.
#include <cmath>
#include <limits>
#include <optional>

#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Mask { none, square, batch, heads, full, padding, transposed };

struct Attention {
  const char* name;
  int64_t B, T, d, H;
  Layout layout;
  std::optional<DType> compute;  // none: qkv's own dtype
  std::vector<DType> dtypes;
  double tol_scale;
  bool gradcheck;
  bool causal = true;
  Mask mask = Mask::none;
  Attrs attrs(DType t) const {
    return Attrs().set("heads", H).set("compute", compute.value_or(t)).set("causal", causal);
  }
  // The mask's shape ((B, H, T, T) broadcast), or empty for none.
  Shape mask_shape() const {
    switch (mask) {
      case Mask::none: return {};
      case Mask::square: return {T, T};
      case Mask::batch: return {B, 1, T, T};
      case Mask::heads: return {1, H, T, T};
      case Mask::full: case Mask::transposed: return {B, H, T, T};
      case Mask::padding: return {B, 1, 1, T};
    }
    return {};
  }
};

// The mask input in the accumulation dtype of t: N(0, 1) values with -inf at about one entry in five;
// a key padding ignores the last b + 1 keys of batch b, and every key of the last batch (a batch of
// rows without a key: y = 0, lse = +inf). Transposed: the same values, stored column-major.
Tensor mask_input(const Attention& a, DType t) {
  const Shape shape = a.mask_shape();
  const DType acc = t == DType::f64 ? DType::f64 : DType::f32;
  std::vector<double> v = host_values(randn_input(shape, DType::f64, 143));
  for (size_t i = 0; i < v.size(); ++i) {
    if (a.mask == Mask::padding) {
      const int64_t b = int64_t(i) / a.T, s = int64_t(i) % a.T;
      v[i] = (b == a.B - 1 || s >= a.T - 1 - b) ? -kInf : 0.0;
    } else if (i % 5 == 2) {
      v[i] = -kInf;
    }
  }
  Tensor m = values_input(v, shape, acc);
  return a.mask == Mask::transposed ? m.transpose(-2, -1).contiguous().transpose(-2, -1) : m;
}

// Row-major (B, T, 3d) qkv and (B, T, d) y as doubles, indexed by (b, t, which of q/k/v, head, column).
struct Heads {
  const Attention& a;
  std::vector<double> mask;  // row-major values of the mask input (empty: none)
  int64_t hd() const { return a.d / a.H; }
  int64_t qkv(int64_t b, int64_t t, int64_t part, int64_t h, int64_t j) const {
    return (b * a.T + t) * 3 * a.d + part * a.d + h * hd() + j;
  }
  int64_t out(int64_t b, int64_t t, int64_t h, int64_t j) const { return (b * a.T + t) * a.d + h * hd() + j; }
  int64_t keys(int64_t t) const { return a.causal ? t + 1 : a.T; }
  double dot(const std::vector<double>& x, int64_t i, const std::vector<double>& y, int64_t k) const {
    double s = 0;
    for (int64_t j = 0; j < hd(); ++j) s += x[i + j] * y[k + j];
    return s;
  }
  // M(b, h, t, s) through the mask's broadcast shape.
  double mask_at(int64_t b, int64_t h, int64_t t, int64_t s) const {
    if (mask.empty()) return 0.0;
    const Shape shape = a.mask_shape();
    const int64_t full[4] = {b, h, t, s}, pad = 4 - int64_t(shape.size());
    int64_t flat = 0;
    for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + (shape[i] == 1 ? 0 : full[pad + int64_t(i)]);
    return mask[size_t(flat)];
  }
};

Heads heads_of(const Attention& a, const OpCall& c, size_t mask_input_index) {
  Heads n{a, {}};
  if (c.inputs.size() > mask_input_index) n.mask = host_values(c.inputs[mask_input_index]);
  return n;
}

// P[t][s] (s < keys(t)) of one (b, h), and lse[t]; a row without a finite score is all 0, lse +inf.
void probabilities(const Heads& n, const std::vector<double>& x, int64_t b, int64_t h,
                   std::vector<std::vector<double>>& P, std::vector<double>& lse) {
  const double scale = 1 / std::sqrt(double(n.hd()));
  P.assign(size_t(n.a.T), {});
  lse.assign(size_t(n.a.T), 0.0);
  for (int64_t t = 0; t < n.a.T; ++t) {
    double m = -kInf, sum = 0;
    for (int64_t s = 0; s < n.keys(t); ++s)
      P[t].push_back(scale * n.dot(x, n.qkv(b, t, 0, h, 0), x, n.qkv(b, s, 1, h, 0)) + n.mask_at(b, h, t, s));
    for (double v : P[t]) m = std::max(m, v);
    if (m == -kInf) {
      for (double& v : P[t]) v = 0;
      lse[t] = kInf;
      continue;
    }
    for (double v : P[t]) sum += std::exp(v - m);
    lse[t] = m + std::log(sum);
    for (double& v : P[t]) v = std::exp(v - lse[t]);
  }
}

Expected attention_reference(const Attention& a, const OpCall& c) {
  const Heads n = heads_of(a, c, 1);
  std::vector<double> x = host_values(c.inputs[0]), y(size_t(a.B * a.T * a.d), 0.0), lse_all;
  std::vector<std::vector<double>> P;
  std::vector<double> lse;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      probabilities(n, x, b, h, P, lse);
      lse_all.insert(lse_all.end(), lse.begin(), lse.end());
      for (int64_t t = 0; t < a.T; ++t)
        for (int64_t s = 0; s < n.keys(t); ++s)
          for (int64_t j = 0; j < n.hd(); ++j) y[n.out(b, t, h, j)] += P[t][s] * x[n.qkv(b, s, 2, h, j)];
    }
  return {y, lse_all};
}

// dqkv from inputs (dy, qkv, y, lse [, mask]); P is recomputed from qkv.
Expected attention_backward_reference(const Attention& a, const OpCall& c) {
  const Heads n = heads_of(a, c, 4);
  const double scale = 1 / std::sqrt(double(n.hd()));
  std::vector<double> dy = host_values(c.inputs[0]), x = host_values(c.inputs[1]), y = host_values(c.inputs[2]);
  std::vector<double> dx(x.size(), 0.0), lse;
  std::vector<std::vector<double>> P;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      probabilities(n, x, b, h, P, lse);
      for (int64_t t = 0; t < a.T; ++t) {
        const double D = n.dot(dy, n.out(b, t, h, 0), y, n.out(b, t, h, 0));
        for (int64_t s = 0; s < n.keys(t); ++s) {
          const double dS = P[t][s] * (n.dot(dy, n.out(b, t, h, 0), x, n.qkv(b, s, 2, h, 0)) - D);
          for (int64_t j = 0; j < n.hd(); ++j) {
            dx[n.qkv(b, t, 0, h, j)] += scale * dS * x[n.qkv(b, s, 1, h, j)];
            dx[n.qkv(b, s, 1, h, j)] += scale * dS * x[n.qkv(b, t, 0, h, j)];
            dx[n.qkv(b, s, 2, h, j)] += P[t][s] * dy[n.out(b, t, h, j)];
          }
        }
      }
    }
  return {dx};
}

OpCall attention_call(const Attention& a, DType t) {
  Inputs in{randn_input({a.B, a.T, 3 * a.d}, t, 140, a.layout)};
  if (a.mask != Mask::none) in.push_back(mask_input(a, t));
  return OpCall{in, a.attrs(t)};
}

const std::vector<DType> k16{DType::f16, DType::bf16};
const std::vector<DType> kF32{DType::f32};

// name, B, T, d, H, layout, compute, dtypes, tol_scale, gradcheck, causal, mask
const Attention kAttentions[] = {
    // causal, no mask: the decoder's path
    {"1x4x12_heads_2", 1, 4, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true},
    {"strided_2x5x18_heads_3", 2, 5, 6, 3, Layout::strided, std::nullopt, kFloatTypes, 1, false},
    {"one_position_2x1x12_heads_1", 2, 1, 4, 1, Layout::contiguous, std::nullopt, kFloatTypes, 1, false},
    {"head_size_32_1x20x192_heads_2", 1, 20, 64, 2, Layout::contiguous, std::nullopt, k16, 1, false},
    // f32 qkv rounded to 16 bits inside: the tolerance of the compute dtype (f16 5e-3, bf16 3e-2).
    {"f16_compute_1x9x96_heads_1", 1, 9, 32, 1, Layout::contiguous, DType::f16, kF32, 250, false},
    {"bf16_compute_2x7x24_heads_2", 2, 7, 8, 2, Layout::transposed, DType::bf16, kF32, 1500, false},
    // not causal (ViT, encoders): T = 65 crosses the 64-row tile by one key
    {"full_1x4x12_heads_2", 1, 4, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true, false},
    {"full_strided_2x5x18_heads_3", 2, 5, 6, 3, Layout::strided, std::nullopt, kFloatTypes, 1, false, false},
    {"full_one_position_2x1x12_heads_1", 2, 1, 4, 1, Layout::contiguous, std::nullopt, kFloatTypes, 1, false, false},
    {"full_head_size_32_1x20x192_heads_2", 1, 20, 64, 2, Layout::contiguous, std::nullopt, k16, 1, false, false},
    {"full_vit_head_size_64_2x65x576_heads_3", 2, 65, 192, 3, Layout::contiguous, std::nullopt, k16, 1, false, false},
    {"full_bf16_compute_head_size_64_1x65x384_heads_2", 1, 65, 128, 2, Layout::contiguous, DType::bf16, kF32, 1500,
     false, false},
    {"full_head_size_64_1x128x384_heads_2", 1, 128, 128, 2, Layout::contiguous, std::nullopt, k16, 1, false, false},
    {"full_head_size_128_1x65x768_heads_2", 1, 65, 256, 2, Layout::contiguous, std::nullopt, k16, 1, false, false},
    {"full_f16_compute_head_size_128_1x128x384_heads_1", 1, 128, 128, 1, Layout::contiguous, DType::f16, kF32, 250,
     false, false},
    {"full_f32_rows_head_size_64_1x65x384_heads_2", 1, 65, 128, 2, Layout::contiguous, std::nullopt, kF32, 1, false,
     false},
    // masks of each broadcast shape, small (the row kernels; 16-bit at head size 2 too)
    {"mask_tt_2x5x12_heads_2", 2, 5, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true, false, Mask::square},
    {"mask_b1tt_causal_2x6x12_heads_2", 2, 6, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true, true,
     Mask::batch},
    {"mask_1htt_2x5x18_heads_3", 2, 5, 6, 3, Layout::strided, std::nullopt, kFloatTypes, 1, false, false, Mask::heads},
    {"mask_bhtt_2x4x12_heads_2", 2, 4, 4, 2, Layout::transposed, std::nullopt, kFloatTypes, 1, false, false,
     Mask::full},
    {"mask_padding_3x5x12_heads_2", 3, 5, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true, false,
     Mask::padding},
    {"mask_transposed_causal_2x5x12_heads_2", 2, 5, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, false,
     true, Mask::transposed},
    // masks on the tiled kernels, at T = 65 and 128
    {"mask_padding_vit_head_size_64_3x65x576_heads_3", 3, 65, 192, 3, Layout::contiguous, std::nullopt, k16, 1, false,
     false, Mask::padding},
    {"mask_tt_causal_head_size_64_1x128x384_heads_2", 1, 128, 128, 2, Layout::contiguous, std::nullopt, k16, 1, false,
     true, Mask::square},
    {"mask_bhtt_head_size_32_2x65x192_heads_2", 2, 65, 64, 2, Layout::contiguous, std::nullopt, k16, 1, false, false,
     Mask::full},
    {"mask_padding_bf16_compute_head_size_64_3x65x384_heads_2", 3, 65, 128, 2, Layout::contiguous, DType::bf16, kF32,
     1500, false, false, Mask::padding},
    {"mask_1htt_head_size_128_1x65x768_heads_2", 1, 65, 256, 2, Layout::contiguous, std::nullopt, k16, 1, false,
     false, Mask::heads},
    {"mask_padding_causal_head_size_128_3x128x384_heads_1", 3, 128, 128, 1, Layout::contiguous, std::nullopt, k16, 1,
     false, true, Mask::padding},
    {"mask_transposed_f32_rows_head_size_64_1x65x384_heads_2", 1, 65, 128, 2, Layout::contiguous, std::nullopt, kF32,
     1, false, false, Mask::transposed},
};

}  // namespace

std::vector<OpTestCase> attention_cases() {
  std::vector<OpTestCase> cases;
  for (const Attention& a : kAttentions) {
    GradcheckFn grad;
    if (a.gradcheck)
      grad = [a](const Inputs& x) {
        return scaled_dot_product_attention(x[0], a.H, a.causal, x.size() > 1 ? x[1] : Tensor(), a.compute);
      };
    cases.push_back({.op = OpKind::Attention,
                     .name = std::string("attention_") + a.name,
                     .dtypes = a.dtypes,
                     .make = [a](Device, DType t) { return attention_call(a, t); },
                     .grad = grad,
                     .grad_inputs = {0},  // the mask is a constant
                     .tol_scale = a.tol_scale,
                     .reference = [a](const OpCall& c) { return attention_reference(a, c); }});
    cases.push_back({.op = OpKind::AttentionBackward,
                     .name = std::string("attention_backward_") + a.name,
                     .dtypes = a.dtypes,
                     .make =
                         [a](Device, DType t) {
                           OpCall f = attention_call(a, t);
                           std::vector<Tensor> saved = dispatch(OpKind::Attention, f.inputs, f.attrs);
                           Tensor dy = randn_input({a.B, a.T, a.d}, t, 141, Layout::transposed);
                           Inputs in{dy, f.inputs[0], saved[0], saved[1]};
                           if (f.inputs.size() > 1) in.push_back(f.inputs[1]);
                           return OpCall{in, f.attrs};
                         },
                     .tol_scale = a.tol_scale,
                     .reference = [a](const OpCall& c) { return attention_backward_reference(a, c); }});
  }
  return cases;
}

}  // namespace reel::harness
