// CPU kernels of fused causal self-attention: the reference the CUDA kernels are checked against.
//
// qkv (B, T, 3d) holds q, k, v side by side; head h of each uses columns [h hd, (h+1) hd), hd = d / H.
// For one (batch, head), with scale = 1 / sqrt(hd) and only keys s <= t (causal):
//   forward    S_ts = scale q_t . k_s       lse_t = log sum_s exp(S_ts)       P_ts = exp(S_ts - lse_t)
//              y_t  = sum_s P_ts v_s                                          (y (B, T, d), heads merged)
//   backward   D_t  = dy_t . y_t            dP_ts = dy_t . v_s                dS_ts = P_ts (dP_ts - D_t)
//              dq_t = scale sum_s dS_ts k_s     dk_s = scale sum_t dS_ts q_t     dv_s = sum_t P_ts dy_t
// Rounding, the same points as the CUDA kernels': q, k, v and dy are rounded to the compute dtype, and
// P and dS are rounded to it before they enter a product; everything accumulates in A (f32, or f64 for
// f64). The softmax's normaliser sums the unrounded P, as the fused forward does. With compute equal
// to qkv's dtype (f32, f64) nothing is rounded: the exact softmax-attention, which gradcheck checks.
// lse (B, H, T) is what backward needs to recompute P without storing it (T x T per head).
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dense_outputs.h"
#include "kernels/dispatch.h"

namespace reel {
namespace {

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  cpu::copy_strided(c, t);
  return c;
}

// v rounded to the compute dtype and back (a no-op when compute is the storage dtype).
template <typename A>
A round_to(DType compute, A v) {
  switch (compute) {
    case DType::bf16: return A(float(BFloat16(float(v))));
    case DType::f16: return A(float(Half(float(v))));
    default: return v;
  }
}

struct Geometry {
  int64_t B, T, d, H, hd;
  DType compute;
  Geometry(const Tensor& qkv, const Attrs& a)
      : B(qkv.size(0)), T(qkv.size(1)), d(qkv.size(2) / 3), H(a.i("heads")), hd(d / H),
        compute(static_cast<DType>(a.i("compute"))) {}
};

// One (batch, head)'s q, k, v (or any (T, hd) slice of a (B, T, width) tensor) as rounded A values.
template <typename T, typename A>
std::vector<A> gather_head(const T* base, const Geometry& g, int64_t width, int64_t b, int64_t col0, bool round) {
  std::vector<A> out(size_t(g.T * g.hd));
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t c = 0; c < g.hd; ++c) {
      A v = A(load(base[(b * g.T + t) * width + col0 + c]));
      out[size_t(t * g.hd + c)] = round ? round_to(g.compute, v) : v;
    }
  return out;
}

template <typename A>
A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

void causal_attention_fwd_kernel(const KernelCall& c) {
  Tensor qkv = dense(c.in[0]);
  const Tensor &y = c.out[0], &lse = c.out[1];
  const Geometry g(qkv, c.attrs);
  visit_float_dtype(qkv.dtype(), "causal_attention", [&]<typename T>() {
    using A = AccType<T>;
    const T* x = qkv.data<T>();
    T* py = y.data<T>();
    A* plse = lse.data<A>();
    const A scale = A(1) / std::sqrt(A(g.hd));
#pragma omp parallel for collapse(2) if (g.B * g.H > 1)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h) {
        std::vector<A> q = gather_head<T, A>(x, g, 3 * g.d, b, h * g.hd, true);
        std::vector<A> k = gather_head<T, A>(x, g, 3 * g.d, b, g.d + h * g.hd, true);
        std::vector<A> v = gather_head<T, A>(x, g, 3 * g.d, b, 2 * g.d + h * g.hd, true);
        std::vector<A> s(size_t(g.T)), out(size_t(g.hd));
        for (int64_t t = 0; t < g.T; ++t) {
          A m = -std::numeric_limits<A>::infinity();
          for (int64_t j = 0; j <= t; ++j) {
            s[j] = scale * dot(&q[t * g.hd], &k[j * g.hd], g.hd);
            m = std::max(m, s[j]);
          }
          A l = 0;
          std::fill(out.begin(), out.end(), A(0));
          for (int64_t j = 0; j <= t; ++j) {
            const A p = std::exp(s[j] - m), pr = round_to(g.compute, p);
            l += p;
            for (int64_t cc = 0; cc < g.hd; ++cc) out[cc] += pr * v[j * g.hd + cc];
          }
          for (int64_t cc = 0; cc < g.hd; ++cc) py[(b * g.T + t) * g.d + h * g.hd + cc] = store<T>(out[cc] / l);
          plse[(b * g.H + h) * g.T + t] = m + std::log(l);
        }
      }
  });
}

void causal_attention_bwd_kernel(const KernelCall& c) {
  Tensor dy = dense(c.in[0]), qkv = dense(c.in[1]), y = dense(c.in[2]), lse = dense(c.in[3]);
  const Tensor& dqkv = c.out[0];
  const Geometry g(qkv, c.attrs);
  visit_float_dtype(qkv.dtype(), "causal_attention_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T *x = qkv.data<T>(), *pdy = dy.data<T>(), *py = y.data<T>();
    const A* plse = lse.data<A>();
    T* pd = dqkv.data<T>();
    const A scale = A(1) / std::sqrt(A(g.hd));
#pragma omp parallel for collapse(2) if (g.B * g.H > 1)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t hd = g.hd;
        std::vector<A> q = gather_head<T, A>(x, g, 3 * g.d, b, h * hd, true);
        std::vector<A> k = gather_head<T, A>(x, g, 3 * g.d, b, g.d + h * hd, true);
        std::vector<A> v = gather_head<T, A>(x, g, 3 * g.d, b, 2 * g.d + h * hd, true);
        std::vector<A> go = gather_head<T, A>(pdy, g, g.d, b, h * hd, true);
        std::vector<A> go_exact = gather_head<T, A>(pdy, g, g.d, b, h * hd, false);
        std::vector<A> yo = gather_head<T, A>(py, g, g.d, b, h * hd, false);
        std::vector<A> dq(size_t(g.T * hd), A(0)), dk(dq.size(), A(0)), dv(dq.size(), A(0));
        for (int64_t t = 0; t < g.T; ++t) {
          const A D = dot(&go_exact[t * hd], &yo[t * hd], hd), l = plse[(b * g.H + h) * g.T + t];
          for (int64_t j = 0; j <= t; ++j) {
            const A p = std::exp(scale * dot(&q[t * hd], &k[j * hd], hd) - l);
            const A dp = dot(&go[t * hd], &v[j * hd], hd);
            const A pr = round_to(g.compute, p), ds = round_to(g.compute, p * (dp - D));
            for (int64_t cc = 0; cc < hd; ++cc) {
              dq[t * hd + cc] += ds * k[j * hd + cc];
              dk[j * hd + cc] += ds * q[t * hd + cc];
              dv[j * hd + cc] += pr * go[t * hd + cc];
            }
          }
        }
        for (int64_t t = 0; t < g.T; ++t) {
          T* row = pd + (b * g.T + t) * 3 * g.d + h * hd;
          for (int64_t cc = 0; cc < hd; ++cc) {
            row[cc] = store<T>(scale * dq[t * hd + cc]);
            row[g.d + cc] = store<T>(scale * dk[t * hd + cc]);
            row[2 * g.d + cc] = store<T>(dv[t * hd + cc]);
          }
        }
      }
  });
}

}  // namespace

void register_attention_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::CausalAttention,
                  [](const KernelCall& c) { cpu::run_into_contiguous(c, causal_attention_fwd_kernel); });
  register_kernel(cpu, OpKind::CausalAttentionBackward,
                  [](const KernelCall& c) { cpu::run_into_contiguous(c, causal_attention_bwd_kernel); });
}

}  // namespace reel
