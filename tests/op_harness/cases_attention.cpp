// Op-harness cases of fused causal self-attention and its backward (schemas: kernels/schema/attention.cpp,
// math: kernels/cpu/attention.cpp). Shapes cover one position, several heads, a strided qkv, head
// size 32 with 16-bit compute (the CUDA tiled kernels) and f32 qkv computed in f16 or bf16 (mixed
// precision: both backends round the products' inputs at the same points, so those cases take the
// compute dtype's tolerance). The backward gets the y and lse of a CPU forward.
// Plain-loop references: per (batch, head), S = q k^T / sqrt(hd) over keys s <= t, P = softmax(S),
// y = P v, lse = log sum exp S; backward dS = P (dy v^T - rowsum(dy * y)), dq = dS k / sqrt(hd),
// dk = dS^T q / sqrt(hd), dv = P^T dy. All in double, without the compute dtype's rounding.
#include <cmath>
#include <limits>
#include <optional>

#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;

struct Attention {
  const char* name;
  int64_t B, T, d, H;
  Layout layout;
  std::optional<DType> compute;  // none: qkv's own dtype
  std::vector<DType> dtypes;
  double tol_scale;
  bool gradcheck;
  Attrs attrs(DType t) const { return Attrs().set("heads", H).set("compute", compute.value_or(t)); }
};

// Row-major (B, T, 3d) qkv and (B, T, d) y as doubles, indexed by (b, t, which of q/k/v, head, column).
struct Heads {
  const Attention& a;
  int64_t hd() const { return a.d / a.H; }
  int64_t qkv(int64_t b, int64_t t, int64_t part, int64_t h, int64_t j) const {
    return (b * a.T + t) * 3 * a.d + part * a.d + h * hd() + j;
  }
  int64_t out(int64_t b, int64_t t, int64_t h, int64_t j) const { return (b * a.T + t) * a.d + h * hd() + j; }
  double dot(const std::vector<double>& x, int64_t i, const std::vector<double>& y, int64_t k) const {
    double s = 0;
    for (int64_t j = 0; j < hd(); ++j) s += x[i + j] * y[k + j];
    return s;
  }
};

// P[t][s] (s <= t) of one (b, h), and lse[t].
void probabilities(const Heads& n, const std::vector<double>& x, int64_t b, int64_t h,
                   std::vector<std::vector<double>>& P, std::vector<double>& lse) {
  const double scale = 1 / std::sqrt(double(n.hd()));
  P.assign(size_t(n.a.T), {});
  lse.assign(size_t(n.a.T), 0.0);
  for (int64_t t = 0; t < n.a.T; ++t) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t s = 0; s <= t; ++s) P[t].push_back(scale * n.dot(x, n.qkv(b, t, 0, h, 0), x, n.qkv(b, s, 1, h, 0)));
    for (double v : P[t]) m = std::max(m, v);
    for (double v : P[t]) sum += std::exp(v - m);
    lse[t] = m + std::log(sum);
    for (double& v : P[t]) v = std::exp(v - lse[t]);
  }
}

Expected attention_reference(const Attention& a, const OpCall& c) {
  const Heads n{a};
  std::vector<double> x = host_values(c.inputs[0]), y(size_t(a.B * a.T * a.d), 0.0), lse_all;
  std::vector<std::vector<double>> P;
  std::vector<double> lse;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      probabilities(n, x, b, h, P, lse);
      lse_all.insert(lse_all.end(), lse.begin(), lse.end());
      for (int64_t t = 0; t < a.T; ++t)
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t j = 0; j < n.hd(); ++j) y[n.out(b, t, h, j)] += P[t][s] * x[n.qkv(b, s, 2, h, j)];
    }
  return {y, lse_all};
}

// dqkv from inputs (dy, qkv, y, lse); P is recomputed from qkv.
Expected attention_backward_reference(const Attention& a, const OpCall& c) {
  const Heads n{a};
  const double scale = 1 / std::sqrt(double(n.hd()));
  std::vector<double> dy = host_values(c.inputs[0]), x = host_values(c.inputs[1]), y = host_values(c.inputs[2]);
  std::vector<double> dx(x.size(), 0.0), lse;
  std::vector<std::vector<double>> P;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      probabilities(n, x, b, h, P, lse);
      for (int64_t t = 0; t < a.T; ++t) {
        const double D = n.dot(dy, n.out(b, t, h, 0), y, n.out(b, t, h, 0));
        for (int64_t s = 0; s <= t; ++s) {
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
  return OpCall{{randn_input({a.B, a.T, 3 * a.d}, t, 140, a.layout)}, a.attrs(t)};
}

const Attention kAttentions[] = {
    {"1x4x12_heads_2", 1, 4, 4, 2, Layout::contiguous, std::nullopt, kFloatTypes, 1, true},
    {"strided_2x5x18_heads_3", 2, 5, 6, 3, Layout::strided, std::nullopt, kFloatTypes, 1, false},
    {"one_position_2x1x12_heads_1", 2, 1, 4, 1, Layout::contiguous, std::nullopt, kFloatTypes, 1, false},
    {"head_size_32_1x20x192_heads_2", 1, 20, 64, 2, Layout::contiguous, std::nullopt, {DType::f16, DType::bf16}, 1, false},
    // f32 qkv rounded to 16 bits inside: the tolerance of the compute dtype (f16 5e-3, bf16 3e-2).
    {"f16_compute_1x9x96_heads_1", 1, 9, 32, 1, Layout::contiguous, DType::f16, {DType::f32}, 250, false},
    {"bf16_compute_2x7x24_heads_2", 2, 7, 8, 2, Layout::transposed, DType::bf16, {DType::f32}, 1500, false},
};

}  // namespace

std::vector<OpTestCase> attention_cases() {
  std::vector<OpTestCase> cases;
  for (const Attention& a : kAttentions) {
    GradcheckFn grad;
    if (a.gradcheck) grad = [a](const Inputs& x) { return scaled_causal_attention(x[0], a.H, a.compute); };
    cases.push_back({.op = OpKind::CausalAttention,
                     .name = std::string("causal_attention_") + a.name,
                     .dtypes = a.dtypes,
                     .make = [a](Device, DType t) { return attention_call(a, t); },
                     .grad = grad,
                     .tol_scale = a.tol_scale,
                     .reference = [a](const OpCall& c) { return attention_reference(a, c); }});
    cases.push_back({.op = OpKind::CausalAttentionBackward,
                     .name = std::string("causal_attention_backward_") + a.name,
                     .dtypes = a.dtypes,
                     .make =
                         [a](Device, DType t) {
                           OpCall f = attention_call(a, t);
                           std::vector<Tensor> saved = dispatch(OpKind::CausalAttention, f.inputs, f.attrs);
                           Tensor dy = randn_input({a.B, a.T, a.d}, t, 141, Layout::transposed);
                           return OpCall{{dy, f.inputs[0], saved[0], saved[1]}, f.attrs};
                         },
                     .tol_scale = a.tol_scale,
                     .reference = [a](const OpCall& c) { return attention_backward_reference(a, c); }});
  }
  return cases;
}

}  // namespace reel::harness
